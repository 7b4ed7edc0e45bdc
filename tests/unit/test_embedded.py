"""Tests for the embedded default assets: offline loading, ChatML template, assistant mask, data."""

import json
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

EMBEDDED = Path(__file__).resolve().parents[2] / "recipes" / "embedded"
TWO_TURNS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "Uppercase this word: cat"},
    {"role": "assistant", "content": "CAT"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(EMBEDDED / "tokenizer", local_files_only=True)


@pytest.fixture(scope="module")
def rows():
    with (EMBEDDED / "data" / "chat.jsonl").open(encoding="ascii") as f:
        return [json.loads(line) for line in f]


def render_ids(tokenizer, messages, add_generation_prompt=False):
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, return_dict=False
    )


def test_model_and_tokenizers_load_offline_with_matching_vocab(tokenizer):
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED / "model", local_files_only=True)
    bundled = AutoTokenizer.from_pretrained(EMBEDDED / "model", local_files_only=True)
    config = model.config
    assert config.model_type == "qwen3"
    assert config.vocab_size == len(tokenizer) == len(bundled) == 512
    assert bundled.get_vocab() == tokenizer.get_vocab()
    assert config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config.pad_token_id == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert config.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_config_shape():
    config = AutoConfig.from_pretrained(EMBEDDED / "model", local_files_only=True)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 192, 4)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.max_position_embeddings == 4096


def test_chat_template_renders_chatml(tokenizer):
    expected = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n2 + 3 = 5.<|im_end|>\n"
        "<|im_start|>user\nUppercase this word: cat<|im_end|>\n"
        "<|im_start|>assistant\nCAT<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(TWO_TURNS, tokenize=False) == expected
    prompt = tokenizer.apply_chat_template(TWO_TURNS[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")


def test_assistant_mask_covers_exactly_the_assistant_replies(tokenizer):
    out = tokenizer.apply_chat_template(TWO_TURNS, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    spans, current = [], []
    for token_id, flag in zip(ids, mask):
        if flag:
            current.append(token_id)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    assert [tokenizer.decode(span) for span in spans] == ["2 + 3 = 5.<|im_end|>\n", "CAT<|im_end|>\n"]


def test_template_is_prefix_consistent_on_dataset(tokenizer, rows):
    for row in rows[:200]:
        messages = row["messages"]
        full = render_ids(tokenizer, messages)
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                prompt = render_ids(tokenizer, messages[:i], add_generation_prompt=True)
                upto = render_ids(tokenizer, messages[: i + 1])
                assert upto[: len(prompt)] == prompt, messages
                assert full[: len(upto)] == upto, messages


def test_dataset_shape(rows):
    assert len(rows) >= 2000
    assert all(isinstance(row.get("messages"), list) and row["messages"] for row in rows)
    assert all(m["role"] in {"system", "user", "assistant"} for row in rows for m in row["messages"])
    n_assistant = [sum(m["role"] == "assistant" for m in row["messages"]) for row in rows]
    assert any(n >= 2 for n in n_assistant), "no multi-turn conversations"
    assert 0 < n_assistant.count(0) < len(rows) // 20, "prompt-only rows should be rare but present"
    assert any(row["messages"][0]["role"] == "system" for row in rows)


def test_assets_are_small():
    total = sum(p.stat().st_size for p in EMBEDDED.rglob("*") if p.is_file())
    # About 2.7 MB of it is the bench data (data/long-chat.jsonl.gz).
    assert total < 8 * 1024 * 1024, f"recipes/embedded is {total} bytes"
