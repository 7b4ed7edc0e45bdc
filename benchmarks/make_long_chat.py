"""Writes the bench data set: chat conversations whose lengths follow those of public multi-turn SFT sets.

The shipped file, `recipes/embedded/data/long-chat.jsonl.gz` (the bench recipes' default data), was made with

    python3 benchmarks/make_long_chat.py recipes/embedded/data/long-chat.jsonl.gz

(the defaults: 2,000 rows, seed 0). The same arguments give the same bytes (a fixed seed; gzip without a name or
a timestamp), with the same tokenizers/transformers versions.

Lengths are tokens of the chat-templated conversation with the embedded tokenizer (`recipes/embedded/tokenizer`,
the one the bench recipes train with), what the trainer packs. Each conversation draws a target length:

* body (97.5% of rows): log-normal, median 1,050 tokens, sigma 0.7 (ln-space), at least 48 tokens;
* tail (2.5%): log-uniform over 8,500–28,000 tokens, the long documents (code, papers, long chats) that public
  sets carry and that dominate attention time;
* turns: 1–6 user/assistant pairs with weights 45/20/13/9/7/6%, a system line in 25% of rows; each pair takes a
  random share of the length, the user 15–45% of it and the assistant the rest. Word costs are counted per word,
  so a conversation comes out a few percent longer than its target; the figures below are measured.

What it gives (2,000 rows, seed 0; printed again by every run, or for any file with `--stats`):

    rows 2,000, tokens 3,292,685, mean 1,646, p50 1,098, p90 2,753, p99 14,382, max 27,850,
    > 8,192 tokens: 2.40%; turn pairs 1: 894, 2: 441, 3: 256, 4: 190, 5: 118, 6: 101; with a system line: 477

The file is 2.7 MB. 3.3M tokens fill one bfd buffer of 64 blocks of 32,768 tokens (2.1M) and part of the next,
about 100 such blocks per pass.

For comparison, public multi-turn SFT sets measured with Llama/Qwen tokenizers have medians around 1,000–1,500
tokens, means around 1,500–2,000 and a tail past 8k of a few percent. The words are random, drawn from a small
vocabulary of 24 words the tokenizer mostly keeps whole (about 1.3 tokens a word, as English is with a large
vocabulary), so the file compresses well: this measures speed and memory, not learning.

`--uniform MIN:MAX` writes the earlier uniform data set instead (lengths drawn uniformly from MIN–MAX tokens, a
system line, one user and one assistant turn; the committed `bench-1p7b-longchat*` results were measured on
`--uniform 400:3000 --rows 1200`, written to /tmp/long.jsonl), byte for byte as it was made then.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import random
import statistics
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "recipes" / "embedded" / "tokenizer"

BODY_MEDIAN, BODY_SIGMA, MIN_TOKENS = 1050, 0.7, 48
TAIL_SHARE, TAIL_RANGE = 0.025, (8500, 28000)
PAIR_WEIGHTS = (45, 20, 13, 9, 7, 6)  # rows with 1..6 user/assistant pairs, in percent
SYSTEM_SHARE = 0.25
LONG = 8192  # the share of conversations longer than this is reported

# Mostly words the embedded tokenizer keeps whole, a few it splits in two or three; few words, so gzip packs them.
WORDS = ("a and apple assistant book capital city cloud garden has in is letters light of one order question river "
         "the this water word model say answer count").split()
SYSTEM = ("You are a helpful assistant.", "Answer briefly and correctly.", "You write concise answers.",
          "Think before you answer.")


def target_length(rng: random.Random) -> int:
    if rng.random() < TAIL_SHARE:
        lo, hi = TAIL_RANGE
        return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    return max(MIN_TOKENS, int(rng.lognormvariate(math.log(BODY_MEDIAN), BODY_SIGMA)))


def text(rng: random.Random, tokens: int, cost: dict[str, int]) -> str:
    """Sentences of random words worth about `tokens` tokens (at least one word)."""
    out: list[str] = []
    used, sentence = 0, 0
    while used < tokens or not out:
        word = rng.choice(WORDS)
        out.append(word)
        used += cost[word]
        sentence += 1
        if sentence >= 4 and rng.random() < 0.12:
            out[-1] += "."
            used += 1
            sentence = 0
    if not out[-1].endswith("."):
        out[-1] += "."
    return " ".join(out)


def conversation(rng: random.Random, tokens: int, cost: dict[str, int]) -> list[dict[str, str]]:
    """Messages worth about `tokens` tokens once templated: an optional system line, then 1–6 pairs."""
    messages = [{"role": "system", "content": rng.choice(SYSTEM)}] if rng.random() < SYSTEM_SHARE else []
    pairs = rng.choices(range(1, len(PAIR_WEIGHTS) + 1), weights=PAIR_WEIGHTS)[0]
    per_message = 5  # <|im_start|>, the role, a newline, <|im_end|>, a newline
    budget = max(2 * pairs, tokens - per_message * (2 * pairs + len(messages)) - 8 * len(messages))
    shares = [rng.uniform(0.5, 1.5) for _ in range(pairs)]
    for share in shares:
        pair = budget * share / sum(shares)
        user = pair * rng.uniform(0.15, 0.45)
        messages += [{"role": "user", "content": text(rng, int(user), cost)},
                     {"role": "assistant", "content": text(rng, int(pair - user), cost)}]
    return messages


def load_tokenizer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    tokenizer.model_max_length = 10**9  # long texts are the point here
    return tokenizer


def templated_lengths(tokenizer, rows: list[list[dict[str, str]]]) -> list[int]:
    """Tokens of each conversation as the trainer sees it: the chat template rendered, then tokenised."""
    texts = [tokenizer.apply_chat_template(m, tokenize=False) for m in rows]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def make(path: Path, rows: int = 2000, seed: int = 0) -> list[list[dict[str, str]]]:
    """Write `rows` conversations to `path` (JSONL, gzip when it ends in .gz); returns them."""
    tokenizer = load_tokenizer()
    cost = {w: len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) for w in WORDS}
    rng = random.Random(seed)
    convs = [conversation(rng, target_length(rng), cost) for _ in range(rows)]
    data = "".join(json.dumps({"messages": m}) + "\n" for m in convs).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    if path.name.endswith(".gz"):
        buf = io.BytesIO()
        # No file name and a zero timestamp in the header: the same rows give the same bytes.
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
            gz.write(data)
        data = buf.getvalue()
    tmp.write_bytes(data)
    tmp.replace(path)
    return convs


def read(path: Path) -> list[list[dict[str, str]]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["messages"] for line in f if line.strip()]


def stats(convs: list[list[dict[str, str]]], lengths: list[int]) -> dict[str, object]:
    """Rows, tokens, mean, p50/p90/p99 (nearest rank), max, share longer than 8,192, turn pairs, system lines."""
    s = sorted(lengths)

    def pct(p: float) -> int:
        return s[min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1)]

    pairs = Counter(sum(m["role"] == "user" for m in c) for c in convs)
    return {"rows": len(s), "tokens": sum(s), "mean": round(statistics.mean(s)), "p50": pct(50), "p90": pct(90),
            "p99": pct(99), "max": s[-1], "share_over_8192": round(sum(n > LONG for n in s) / len(s), 4),
            "turn_pairs": dict(sorted(pairs.items())),
            "with_system": sum(c[0]["role"] == "system" for c in convs)}


def describe(st: dict) -> str:
    turns = ", ".join(f"{k}: {v}" for k, v in st["turn_pairs"].items())
    return (f"rows {st['rows']:,}, tokens {st['tokens']:,}, mean {st['mean']:,}, p50 {st['p50']:,}, "
            f"p90 {st['p90']:,}, p99 {st['p99']:,}, max {st['max']:,},\n"
            f"> {LONG:,} tokens: {100 * st['share_over_8192']:.2f}%; turn pairs {turns}; "
            f"with a system line: {st['with_system']}")


# ---------------------------------------------------------------------------------------------
# The earlier uniform data set, kept so the results measured on it can be rebuilt


UNIFORM_WORDS = ("the model packs documents into blocks while each rank reads its own shard and the loss counts only "
                 "the assistant tokens of every turn so that long answers teach more than short prompts about kernels "
                 "memory attention gradients optimizer steps checkpoints schedules warmup tokens vocabulary experts "
                 "layers").split()


def _uniform_conversation(rng: random.Random, tokens: int, chars_per_token: float) -> list[dict[str, str]]:
    """A system line, a user turn with about 40% of the tokens and an assistant turn with the rest."""
    def words(n_tokens: int) -> str:
        out: list[str] = []
        length = 0
        while length < n_tokens * chars_per_token:
            word = rng.choice(UNIFORM_WORDS)
            out.append(word)
            length += len(word) + 1
        return " ".join(out)

    return [{"role": "system", "content": "You answer at length."},
            {"role": "user", "content": words(int(tokens * 0.4))},
            {"role": "assistant", "content": words(int(tokens * 0.6))}]


def make_uniform(path: Path, rows: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[int]:
    """Write `rows` conversations of uniform length in [min_tokens, max_tokens] (JSONL); returns their lengths."""
    tokenizer = load_tokenizer()
    rng = random.Random(seed)
    sample = " ".join(rng.choice(UNIFORM_WORDS) for _ in range(2000))
    chars_per_token = len(sample) / len(tokenizer(sample)["input_ids"])
    overhead = templated_lengths(tokenizer, [_uniform_conversation(random.Random(0), 0, chars_per_token)])[0]
    convs = []
    for _ in range(rows):
        target = rng.randint(min_tokens, max_tokens)
        convs.append(_uniform_conversation(rng, max(0, target - overhead), chars_per_token))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs))
    tmp.replace(path)
    return templated_lengths(tokenizer, convs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the JSONL file to write (.jsonl.gz: compressed)")
    ap.add_argument("--rows", type=int, default=2000, help="conversations (default 2,000: about 3.6M tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stats", action="store_true", help="only print the statistics of an existing file")
    ap.add_argument("--uniform", metavar="MIN:MAX", help="the earlier data set: uniform lengths, one turn pair")
    args = ap.parse_args()
    if args.uniform:
        lo, hi = (int(x) for x in args.uniform.split(":"))
        make_uniform(args.out, args.rows, lo, hi, args.seed)
    convs = read(args.out) if args.stats or args.uniform else make(args.out, args.rows, args.seed)
    st = stats(convs, templated_lengths(load_tokenizer(), convs))
    print(f"{args.out} ({args.out.stat().st_size / 1e6:.2f} MB):\n{describe(st)}")


if __name__ == "__main__":
    main()
