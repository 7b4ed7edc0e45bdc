"""The prefix method's assistant mask against the `{% generation %}` mask of TRL's training templates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trl
from transformers import AutoTokenizer

from runner.data.tokens import _common_prefix, _ids, has_generation_markers, tokenize_sft, tokenize_sft_generation

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "recipes" / "embedded" / "tokenizer"
DATA = ROOT / "recipes" / "embedded" / "data" / "chat.jsonl"
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
N_CONVERSATIONS = 24

# Templates whose generation block starts exactly where the generation prompt ends: the masks must be equal.
SAME_BOUNDARIES = ["qwen3", "qwen3_instruct_2507", "qwen3_vl", "qwen2_5_vl", "llama3", "phi3", "phi3_5", "lfm2",
                   "lfm2_v2", "glm4moe", "cohere2", "idefics3", "smolvlm", "diffusion_gemma"]
# Templates whose generation block also covers the tail of the generation prompt (the role header's newline,
# `<|start|>assistant`, a prefilled `<think>`): the prefix method leaves those prompt tokens out by design,
# since the model is given them at inference time. Everything else must agree.
PROMPT_INSIDE_GENERATION = ["qwen2_5", "deepseekv3", "deepseek_r1_distill", "nemotron_3_nano", "qwen3_5_think",
                            "qwen3_5_nothink", "qwen3_6", "qwen3_8", "muse_glimmer"]
# Not covered: gptoss ends the final assistant turn with <|return|> and earlier ones with <|end|>, so the prefix
# method, which sees every turn as the final one, misses <|end|>; such templates ship generation markers and take
# the fast path. gemma/gemma3/cohere reject system prompts, llava_next needs content blocks.


def _tokenizer(template: str):
    tok = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    source = (TEMPLATES / f"{template}_training.jinja").read_text()
    # The real tokenizers hold these markers as single tokens; byte-level BPE would merge them across turns.
    tok.add_tokens(sorted(set(re.findall(r"<[^<>\s'\"{}]{1,40}>", source))), special_tokens=True)
    tok.chat_template = source
    return tok


def _conversations(tok) -> list[list[dict]]:
    rows = [json.loads(line)["messages"] for line in DATA.read_text().splitlines()[:N_CONVERSATIONS]]
    out = []
    for i, conv in enumerate(rows):
        if i % 2 == 0:
            with_system = [SYSTEM, *conv]
            try:
                tok.apply_chat_template(with_system, tokenize=False)
                conv = with_system
            except Exception:  # noqa: BLE001 - the template has no system role
                pass
        out.append(conv)
    return out


def _render(tok, messages, generation_prompt=False) -> list[int]:
    if not messages:
        return []
    return _ids(tok.apply_chat_template(messages, tokenize=True, return_dict=False,
                                        add_generation_prompt=generation_prompt))


def _generation_prompt_tokens(tok, messages, full) -> set[int]:
    """Positions of each assistant turn's generation prompt (role header and any prefill) in the full render."""
    out: set[int] = set()
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start = _common_prefix(_render(tok, messages[:i]), full)
            end = _common_prefix(_render(tok, messages[:i], generation_prompt=True), full)
            out.update(range(start, end))
    return out


@pytest.mark.parametrize("template", SAME_BOUNDARIES)
def test_prefix_mask_equals_generation_mask(template):
    tok = _tokenizer(template)
    assert has_generation_markers(tok)
    convs = _conversations(tok)
    assert len(convs) >= 20 and any(c[0]["role"] == "system" for c in convs)
    for conv in convs:
        ids_p, mask_p = tokenize_sft(tok, conv)
        ids_g, mask_g = tokenize_sft_generation(tok, conv)
        assert ids_p == ids_g
        assert any(mask_p)
        assert mask_p == mask_g, [tok.decode([t]) for t, a, b in zip(ids_p, mask_p, mask_g) if a != b]


@pytest.mark.parametrize("template", PROMPT_INSIDE_GENERATION)
def test_prefix_mask_differs_only_by_the_generation_prompt(template):
    tok = _tokenizer(template)
    convs = _conversations(tok)
    assert len(convs) >= 20
    extra_seen = 0
    for conv in convs:
        ids, mask_p = tokenize_sft(tok, conv)
        _, mask_g = tokenize_sft_generation(tok, conv)
        prompt = _generation_prompt_tokens(tok, conv, ids)
        only_gen = {j for j, (a, b) in enumerate(zip(mask_p, mask_g)) if b and not a}
        only_prefix = {j for j, (a, b) in enumerate(zip(mask_p, mask_g)) if a and not b}
        assert not only_prefix, [tok.decode([ids[j]]) for j in sorted(only_prefix)]
        assert only_gen <= prompt, [tok.decode([ids[j]]) for j in sorted(only_gen - prompt)]
        extra_seen += len(only_gen)
    assert extra_seen > 0  # the template really does put prompt tokens in its generation block


def test_prefix_method_survives_a_generation_prompt_the_full_render_lacks():
    """A prefilled `<think>` in the generation prompt that the full render does not repeat must not shift the
    mask: the response starts where the renders stop agreeing, not at the prompt's length."""
    tok = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    tok.chat_template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}")
    conv = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    ids, mask = tokenize_sft(tok, conv)
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "Blue.<|im_end|>"
