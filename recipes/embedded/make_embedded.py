"""Generates the embedded default assets: toy chat data, a 512-token BPE tokenizer, a tiny Qwen3.

Run from anywhere with ``python recipes/embedded/make_embedded.py``. Every output is
derived from fixed seeds, so re-running gives byte-identical files; the script checks
the chat template's prefix-consistency on every conversation and fails loudly if it breaks.
"""

import json
import random
import shutil
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

HERE = Path(__file__).resolve().parent
N_CONVERSATIONS = 2500
VOCAB_SIZE = 512
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# Qwen2's split pattern: digits become single tokens, which is what lets a tiny
# model learn column-wise addition instead of memorising multi-digit merges.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The assistant turn's content *and* its closing "<|im_end|>\n" sit inside the
# generation markers, so the assistant mask teaches the model when to stop.
# ChatML; tools (a system block listing them) and tool calls (<tool_call> JSON in the assistant turn) render too,
# so tool-calling data trains on the calls it holds.
CHAT_TEMPLATE = (
    '{%- if tools %}'
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call the functions whose signatures are within <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- (tool['function'] if tool['function'] is defined else tool) | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, reply with a JSON object of the name and arguments within <tool_call></tool_call> tags.<|im_end|>\\n' }}"
    '{%- endif %}'
    '{%- for message in messages %}'
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    '{%- generation %}'
    "{{- message['content'] or '' }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + fn[\'name\'] + \'", "arguments": \' }}'
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    '{%- endfor %}'
    "{{- '<|im_end|>\\n' }}"
    '{%- endgeneration %}'
    '{%- else %}'
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    '{%- endif %}'
    '{%- endfor %}'
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in one short sentence.",
    "You are a tiny model that solves simple word and number puzzles.",
    "Answer the user's question correctly and briefly.",
]
COUNTRIES = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "Canada": "Ottawa", "Egypt": "Cairo", "Peru": "Lima",
    "Kenya": "Nairobi", "Norway": "Oslo", "Chile": "Santiago", "India": "New Delhi",
    "Brazil": "Brasilia", "Greece": "Athens", "Poland": "Warsaw", "Ireland": "Dublin",
}
WORDS = [
    "apple", "river", "stone", "cloud", "tiger", "green", "house", "light", "music",
    "paper", "table", "water", "zebra", "orange", "pencil", "garden", "rocket",
    "silver", "window", "yellow", "cat", "dog", "sun", "moon", "tree", "bird", "fish",
    "book", "lamp", "road",
]


def task_add(rng):
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    question = rng.choice(["What is {a} + {b}?", "Add {a} and {b}.", "Compute {a} plus {b}."])
    return question.format(a=a, b=b), f"{a} + {b} = {a + b}."


def task_reverse(rng):
    words = rng.sample(WORDS, rng.randint(3, 5))
    question = rng.choice(["Reverse these words: {w}", "Say these words in reverse order: {w}"])
    return question.format(w=" ".join(words)), " ".join(reversed(words))


def task_upper(rng):
    word = rng.choice(WORDS)
    question = rng.choice(["Uppercase this word: {w}", "Write {w} in capital letters."])
    return question.format(w=word), word.upper()


def task_capital(rng):
    country = rng.choice(sorted(COUNTRIES))
    question = rng.choice(["What is the capital of {c}?", "Name the capital city of {c}."])
    return question.format(c=country), f"The capital of {country} is {COUNTRIES[country]}."


def task_count(rng):
    word = rng.choice(WORDS)
    question = rng.choice(["How many letters are in the word {w}?", "Count the letters in {w}."])
    return question.format(w=word), f"The word {word} has {len(word)} letters."


TASKS = [task_add, task_reverse, task_upper, task_capital, task_count]


def make_conversation(rng):
    """One conversation: optional system prompt, then 1-3 user/assistant exchanges."""
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    n_turns = rng.choices([1, 2, 3], weights=[50, 35, 15])[0]
    for _ in range(n_turns):
        question, answer = rng.choice(TASKS)(rng)
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
    # ~1% prompt-only rows exercise the trainer's "no assistant turn: skip and count" path.
    if rng.random() < 0.01:
        messages = [m for m in messages if m["role"] != "assistant"][:2]
    return {"messages": messages}


def make_dataset(path):
    rng = random.Random(0)
    rows = [make_conversation(rng) for _ in range(N_CONVERSATIONS)]
    path.parent.mkdir(parents=True)
    with path.open("w", encoding="ascii", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows


def make_tokenizer(rows):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Train on the text between special tokens exactly as the template renders it,
    # so role headers like "assistant\n" get their own merges.
    texts = (f"{m['role']}\n{m['content']}" for row in rows for m in row["messages"])
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        extra_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def check_prefix_consistency(tokenizer, rows):
    """Fail loudly unless each assistant turn's prompt render is a token-id prefix of the longer renders."""
    def ids(messages, add_generation_prompt):
        return tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )

    for n, row in enumerate(rows):
        messages = row["messages"]
        full = ids(messages, False)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt, upto = ids(messages[:i], True), ids(messages[: i + 1], False)
            if upto[: len(prompt)] != prompt or full[: len(upto)] != upto:
                raise SystemExit(f"chat template is not prefix-consistent on row {n}, turn {i}: {messages}")


def make_model(tokenizer, out_dir):
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=None,  # ChatML has no BOS; the tokenizer adds none either.
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.generation_config.bos_token_id = None
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def main():
    hf_logging.disable_progress_bar()
    for sub in ("data", "tokenizer", "model"):
        shutil.rmtree(HERE / sub, ignore_errors=True)  # stale files would break byte-reproducibility
    rows = make_dataset(HERE / "data" / "chat.jsonl")
    tokenizer = make_tokenizer(rows)
    check_prefix_consistency(tokenizer, rows)
    tokenizer.save_pretrained(HERE / "tokenizer")
    make_model(tokenizer, HERE / "model")
    for path in sorted(HERE.rglob("*")):
        if path.is_file() and path.suffix != ".py":
            print(f"{path.stat().st_size:>9,d}  {path.relative_to(HERE)}")


if __name__ == "__main__":
    main()
