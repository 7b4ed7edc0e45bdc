"""Writes a chat dataset whose conversations are 400–3,000 tokens long, the document lengths of the peer figures
in references.md, so that `runner bench` can be compared with them offline:

    python3 benchmarks/make_long_chat.py /tmp/long-chat.jsonl
    runner bench qwen3-1.7b-bench-h200 --set dataset.path=/tmp/long-chat.jsonl --sweep train.seq_len=8192,32768

Lengths are counted with the embedded tokenizer (the one the bench recipes use) over the chat-templated
conversation, drawn uniformly from [--min-tokens, --max-tokens] with a fixed seed: the same arguments give the same
bytes. The words are random: this measures speed and memory, not learning.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "recipes" / "embedded" / "tokenizer"
WORDS = ("the model packs documents into blocks while each rank reads its own shard and the loss counts only the "
         "assistant tokens of every turn so that long answers teach more than short prompts about kernels memory "
         "attention gradients optimizer steps checkpoints schedules warmup tokens vocabulary experts layers").split()


def conversation(rng: random.Random, tokens: int, chars_per_token: float) -> list[dict[str, str]]:
    """A system line, a user turn with about 40% of the tokens and an assistant turn with the rest."""
    def text(n_tokens: int) -> str:
        out: list[str] = []
        length = 0
        while length < n_tokens * chars_per_token:
            word = rng.choice(WORDS)
            out.append(word)
            length += len(word) + 1
        return " ".join(out)

    return [{"role": "system", "content": "You answer at length."},
            {"role": "user", "content": text(int(tokens * 0.4))},
            {"role": "assistant", "content": text(int(tokens * 0.6))}]


def templated_length(tokenizer, messages: list[dict[str, str]]) -> int:
    out = tokenizer.apply_chat_template(messages, tokenize=True)
    return len(out["input_ids"] if hasattr(out, "keys") else out)


def make(path: Path, rows: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[int]:
    """Write `rows` conversations to `path` (JSONL, one {"messages": [...]} per line); returns their lengths."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    tokenizer.model_max_length = 10**9  # long texts are the point here
    rng = random.Random(seed)
    sample = " ".join(rng.choice(WORDS) for _ in range(2000))
    chars_per_token = len(sample) / len(tokenizer(sample)["input_ids"])
    lengths = []
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        for _ in range(rows):
            target = rng.randint(min_tokens, max_tokens)
            overhead = templated_length(tokenizer, conversation(random.Random(0), 0, chars_per_token))
            messages = conversation(rng, max(0, target - overhead), chars_per_token)
            lengths.append(templated_length(tokenizer, messages))
            f.write(json.dumps({"messages": messages}) + "\n")
    tmp.replace(path)
    return lengths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the JSONL file to write")
    ap.add_argument("--rows", type=int, default=600, help="conversations (default 600: about a million tokens)")
    ap.add_argument("--min-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    lengths = make(args.out, args.rows, args.min_tokens, args.max_tokens, args.seed)
    print(f"wrote {args.out}: {len(lengths)} conversations, {sum(lengths):,} tokens, "
          f"{min(lengths)}–{max(lengths)} tokens each")


if __name__ == "__main__":
    main()
