"""Dataset formats: detection, mappings and the loss mask on rows shaped like published datasets, under real
chat templates (the embedded ChatML one, and Qwen2.5 / Llama-3.x templates as TRL ships them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trl
from transformers import AutoTokenizer

from runner.data.formats import FormatError, RowFormat, detect, row_texts, samples, to_sample
from runner.gate.preflight import read_rows
from runner.spec import load_spec
from runner.data.tokens import generation_prompt_is_prefix, tokenize_sample, tokenize_sft

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "fixtures" / "data"
TOKENIZER = ROOT / "recipes" / "embedded" / "tokenizer"
TEMPLATES = Path(trl.__file__).parent / "chat_templates"


def _tokenizer(template: str | None = None):
    tok = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    if template is not None:
        source = (TEMPLATES / f"{template}.jinja").read_text()
        # The real tokenizers hold these markers as single tokens; byte-level BPE would merge them across turns.
        tok.add_tokens(sorted(set(re.findall(r"<\|[^<>\s'\"{}]{1,40}\|>", source))), special_tokens=True)
        if "bos_token" in source:
            tok.bos_token = "<|begin_of_text|>"
        tok.chat_template = source
    return tok


def _rows(name: str, n: int = 16) -> list[dict]:
    return read_rows(DATA / name, n)


def _sample(name: str, fmt: RowFormat = RowFormat(), index: int = 0):
    rows = _rows(name)
    return samples(rows, fmt, detect(rows, fmt))[index]


def _trained_text(tok, ids, mask) -> str:
    """The trained tokens, with a '|' where an untrained stretch separates two trained spans."""
    out, prev = [], False
    for i, m in zip(ids, mask):
        if m:
            out.append(("|" if out and not prev else "") + tok.decode([i]))
        prev = m
    return "".join(out)


@pytest.mark.parametrize(("name", "format", "variant", "columns"), [
    ("alpaca_en_demo.json", "alpaca", "", {"instruction": "instruction", "input": "input", "output": "output"}),
    ("alpaca_history.jsonl", "alpaca", "", {"history": "history", "system": "system"}),
    ("glaive_toolcall_en_demo.json", "sharegpt", "", {"messages": "conversations", "role": "from",
                                                      "content": "value", "tools": "tools"}),
    ("prompt_completion.jsonl", "prompt_completion", "standard", {"prompt": "prompt"}),
    ("prompt_completion_conversational.jsonl", "prompt_completion", "conversational", {"completion": "completion"}),
    ("text.jsonl", "text", "", {"text": "text"}),
])
def test_format_is_detected_from_the_rows(name, format, variant, columns):
    det = detect(_rows(name), RowFormat())
    assert (det.format, det.variant, det.detected) == (format, variant, True)
    assert columns.items() <= det.column_map.items()
    assert det.describe().startswith(format) and "(detected)" in det.describe()


def test_embedded_chat_data_is_messages():
    spec = load_spec("tiny-cpu")
    det = detect(read_rows(ROOT / "recipes" / "embedded" / "data" / "chat.jsonl", 4), RowFormat.from_spec(spec.dataset))
    assert det.format == "messages" and det.column_map["messages"] == "messages"


def test_sharegpt_rows_become_tool_calls_tool_turns_and_tools():
    s = _sample("glaive_toolcall_en_demo.json")
    assert [m["role"] for m in s.messages] == ["user", "assistant", "tool", "assistant"]
    call = s.messages[1]["tool_calls"][0]
    assert call == {"type": "function", "function": {"name": "get_word_length", "arguments": {"word": "apple"}}}
    assert s.tools[0]["type"] == "function" and s.tools[0]["function"]["name"] == "get_word_length"
    assert s.trained == [False, False, False, True]  # function calls are context by default
    with_calls = _sample("glaive_toolcall_en_demo.json", RowFormat(train_on="assistant+tool_calls"))
    assert with_calls.trained == [False, True, False, True]


def test_alpaca_system_history_and_input():
    s = _sample("alpaca_history.jsonl")
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert s.trained == [False, False, True, False, True]
    plain = _sample("alpaca_en_demo.json")
    assert plain.messages[0] == {"role": "user", "content": "Reverse the letters of the word.\napple"}


def test_explicit_format_columns_and_roles_override_detection():
    rows = [{"dialog": [{"speaker": "customer", "text": "hi"}, {"speaker": "bot", "text": "hello"}], "sys": "Be kind."}]
    with pytest.raises(FormatError) as err:
        detect(rows, RowFormat())
    assert "dialog, sys" in str(err.value) and "dataset.columns" in err.value.fix
    fmt = RowFormat(format="messages", columns=(("content", "text"), ("messages", "dialog"), ("role", "speaker"),
                                               ("system", "sys")),
                    roles=(("bot", "assistant"), ("customer", "user")))
    det = detect(rows, fmt)
    assert det.detected is False and det.format == "messages"
    s = to_sample(rows[0], det, fmt)
    assert s.messages == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}]
    # an unmapped role name says which field maps it
    with pytest.raises(FormatError) as err:
        to_sample(rows[0], det, RowFormat(format="messages", columns=fmt.columns))
    assert err.value.field == "dataset.roles" and "'customer'" in str(err.value)


def test_messages_field_stays_an_alias_of_the_conversation_column():
    spec = load_spec("tiny-cpu", ["dataset.messages_field=dialog"])
    assert RowFormat.from_spec(spec.dataset).column_map == {"messages": "dialog"}
    spec = load_spec("tiny-cpu", ["dataset.messages_field=dialog", "dataset.columns={messages: chat}"])
    assert RowFormat.from_spec(spec.dataset).column_map == {"messages": "chat"}


def test_bad_row_names_its_number():
    rows = [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d", "history": "oops"}]
    fmt = RowFormat()
    with pytest.raises(FormatError, match="row 2: column 'history'"):
        samples(rows, fmt, detect(rows, fmt))


def test_row_texts_for_token_counts():
    texts, turns = row_texts(_rows("glaive_toolcall_en_demo.json", 1)[0])
    assert turns == 4 and "get_word_length" in " ".join(texts) and "The word apple has 5 letters." in texts
    assert row_texts({"text": "plain words"}) == (["plain words"], 0)  # no chat template around text
    assert row_texts({"nothing": 1}) == ([], 0)


# ---------------------------------------------------------------------------------------------
# The loss mask under real templates


def test_alpaca_under_the_embedded_chatml_template_trains_the_outputs():
    tok = _tokenizer()
    ids, mask = tokenize_sample(tok, _sample("alpaca_history.jsonl"))
    assert _trained_text(tok, ids, mask) == "elppa<|im_end|>\n|APPLE<|im_end|>\n"


def test_sharegpt_tools_reach_the_template_and_calls_train_only_when_asked():
    tok = _tokenizer("qwen2_5")
    ids, mask = tokenize_sample(tok, _sample("glaive_toolcall_en_demo.json"))
    text = tok.decode(ids)
    assert '<tools>\n{"type": "function", "function": {"name": "get_word_length"' in text
    assert '<tool_call>\n{"name": "get_word_length", "arguments": {"word": "apple"}}\n</tool_call>' in text
    assert "<tool_response>\n{\"length\": 5}\n</tool_response>" in text
    assert _trained_text(tok, ids, mask) == "The word apple has 5 letters.<|im_end|>\n"
    calls = RowFormat(train_on="assistant+tool_calls")
    ids, mask = tokenize_sample(tok, _sample("glaive_toolcall_en_demo.json", calls))
    assert _trained_text(tok, ids, mask) == ('<tool_call>\n{"name": "get_word_length", "arguments": {"word": "apple"}}'
                                             '\n</tool_call><|im_end|>\n|The word apple has 5 letters.<|im_end|>\n')


def test_the_embedded_template_renders_tools_and_trains_calls_when_asked():
    """The default tokenizer's own template: the tool list in a system block, the call as <tool_call> JSON inside
    the assistant turn's generation markers, so assistant+tool_calls puts the call's tokens in the loss."""
    tok = _tokenizer()
    ids, mask = tokenize_sample(tok, _sample("glaive_toolcall_en_demo.json"))
    text = tok.decode(ids)
    assert text.startswith('<|im_start|>system\n# Tools\n\n') and '<tools>\n{"name": "get_word_length", ' in text
    call = '<tool_call>\n{"name": "get_word_length", "arguments": {"word": "apple"}}\n</tool_call><|im_end|>\n'
    assert f"<|im_start|>assistant\n{call}<|im_start|>tool\n" in text
    assert _trained_text(tok, ids, mask) == "The word apple has 5 letters.<|im_end|>\n"
    ids, mask = tokenize_sample(tok, _sample("glaive_toolcall_en_demo.json", RowFormat(train_on="assistant+tool_calls")))
    assert _trained_text(tok, ids, mask) == f"{call}|The word apple has 5 letters.<|im_end|>\n"


def test_the_wizard_preview_shows_the_call_and_the_tool_list():
    from runner.gate.preview import tokenizer_preview

    spec = load_spec("tiny-cpu", [f"dataset.path={DATA / 'glaive_toolcall_en_demo.json'}",
                                  "dataset.train_on=assistant+tool_calls"])
    preview = tokenizer_preview(spec)
    shown = "".join(t for t, _ in preview["tokens"])
    trained = "".join(t for t, m in preview["tokens"] if m)
    assert '<tools>\n{"name": "get_word_length"' in shown
    assert '<tool_call>\n{"name": "get_word_length", "arguments": {"word": "apple"}}\n</tool_call>' in trained


def test_sharegpt_tool_calls_under_the_llama3_1_template():
    tok = _tokenizer("llama3_1")
    calls = RowFormat(train_on="assistant+tool_calls")
    ids, mask = tokenize_sample(tok, _sample("glaive_toolcall_en_demo.json", calls))
    text = tok.decode(ids)
    assert '"name": "get_word_length"' in text and "<|start_header_id|>ipython<|end_header_id|>" in text
    assert _trained_text(tok, ids, mask) == ('{"name": "get_word_length", "parameters": {"word": "apple"}}<|eot_id|>'
                                             '|The word apple has 5 letters.<|eot_id|>')


def test_llama3_template_trains_assistant_replies_without_headers():
    tok = _tokenizer("llama3")
    ids, mask = tokenize_sample(tok, _sample("alpaca_history.jsonl"))
    assert _trained_text(tok, ids, mask) == "elppa<|eot_id|>|APPLE<|eot_id|>"


def test_conversational_prompt_completion_trains_the_completion_only():
    tok = _tokenizer("llama3")
    row = {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                      {"role": "user", "content": "Spell cat backwards."}],
           "completion": [{"role": "assistant", "content": "tac"}]}
    s = to_sample(row, detect([row], RowFormat()), RowFormat())
    ids, mask = tokenize_sample(tok, s)
    assert _trained_text(tok, ids, mask) == "tac<|eot_id|>"  # the prompt's assistant turn is context


def test_standard_prompt_completion_and_text_end_in_eos():
    tok = _tokenizer()
    ids, mask = tokenize_sample(tok, _sample("prompt_completion.jsonl"))
    assert tok.decode(ids) == "The word apple spelled backwards is elppa.<|im_end|>"
    assert _trained_text(tok, ids, mask) == " elppa.<|im_end|>"
    ids, mask = tokenize_sample(tok, _sample("text.jsonl"))
    assert all(mask) and tok.decode(ids).endswith("listened.<|im_end|>")


# A ChatML variant that separates turns with a newline written before each header: the generation prompt
# ("<|im_start|>assistant\n" right after "<|im_end|>") is then not a prefix of the full render.
NEWLINE_BEFORE_HEADER = (
    "{%- for m in messages %}{%- if not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def test_generation_prompt_that_is_not_a_prefix_of_the_full_render_is_aligned():
    tok = _tokenizer()
    tok.chat_template = NEWLINE_BEFORE_HEADER
    conv = [{"role": "user", "content": "Spell cat backwards."}, {"role": "assistant", "content": "tac"},
            {"role": "user", "content": "And dog?"}, {"role": "assistant", "content": "god"}]
    prompt = tok.apply_chat_template(conv[:1], add_generation_prompt=True, tokenize=False)
    assert not tok.apply_chat_template(conv, tokenize=False).startswith(prompt)  # the property under test
    ids, mask = tokenize_sft(tok, conv)
    assert _trained_text(tok, ids, mask) == "tac<|im_end|>|god<|im_end|>"
    assert not generation_prompt_is_prefix(tok) and generation_prompt_is_prefix(_tokenizer("llama3"))


@pytest.mark.parametrize(("name", "shown"), [("glaive_toolcall_en_demo.json", "sharegpt (detected)"),
                                             ("prompt_completion.jsonl", "prompt_completion (standard)")])
def test_wizard_preview_shows_the_detected_format_and_a_row_with_its_loss_tokens(name, shown):
    from runner.gate.preview import tokenizer_preview

    p = tokenizer_preview(load_spec("tiny-cpu", [f"dataset.path={DATA / name}"]))
    assert p["detect"]["messages_ok"] and p["detect"]["detected"].startswith(shown)
    assert 0 < p["n_trained"] < p["n_tokens"] and any(on for _, on in p["tokens"])


def test_wizard_preview_names_what_does_not_fit(tmp_path):
    from runner.gate.preview import detect as preview_detect

    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    info = preview_detect(load_spec("tiny-cpu", [f"dataset.path={data}"]))
    assert not info["messages_ok"] and "answer, question" in info["detected"] and "dataset.format" in info["detected"]


def test_formats_imports_no_torch():
    """Preflight, the wizard and the estimator read rows through it without loading torch."""
    import subprocess
    import sys

    code = "import sys, runner.data.formats; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_wizard_preview_says_when_the_header_is_aligned(tmp_path):
    import shutil

    from runner.gate.preview import tokenizer_preview

    model = tmp_path / "model"
    shutil.copytree(ROOT / "recipes" / "embedded" / "tokenizer", model)
    shutil.copy(ROOT / "recipes" / "embedded" / "model" / "config.json", model)
    (model / "chat_template.jinja").write_text(NEWLINE_BEFORE_HEADER)
    p = tokenizer_preview(load_spec("tiny-cpu", [f"model.path={model}"]))
    assert p["template"].startswith("prefix bracketing (the template writes turn headers unlike")
    trained = "".join(text for text, on in p["tokens"] if on)
    assert "<|im_start|>" not in trained and "assistant" not in trained
