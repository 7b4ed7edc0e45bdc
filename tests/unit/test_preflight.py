"""Preflight: bad input is refused before any rank starts, every problem at once, each with its field and fix."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import yaml
from transformers import GraniteMoeHybridConfig, Qwen3_5TextConfig

from runner.cli import main as cli
from runner.errors import SpecError
from runner.gate.preflight import preflight, preflight_problems
from runner.spec import load_spec

EMBEDDED = Path(__file__).resolve().parents[2] / "recipes" / "embedded"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _spec(tmp_path: Path, **sections) -> Path:
    data = {"name": "pf", "hardware": {"device": "cpu", "nproc_per_node": 1}, "train": {"max_steps": 1}}
    for key, value in sections.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _fields(problems) -> set[str]:
    return {p.field for p in problems}


def _config_dir(tmp_path: Path, name: str, config) -> Path:
    d = tmp_path / name
    d.mkdir()
    config.save_pretrained(d)
    for f in TOKENIZER_FILES:
        shutil.copy(EMBEDDED / "tokenizer" / f, d / f)
    return d


def test_the_embedded_default_passes():
    preflight(load_spec("tiny-cpu"))


def test_dataset_whose_format_cannot_be_mapped(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"a{i}"}) for i in range(3)) + "\n")
    problems = preflight_problems(load_spec(_spec(tmp_path, dataset={"path": str(data)})))
    [p] = [p for p in problems if p.field.startswith("dataset.")]
    assert p.field == "dataset.format" and "answer, question" in p.message
    assert "dataset.format" in p.fix and "dataset.columns" in p.fix
    # the columns named explicitly map it
    mapped = _spec(tmp_path, dataset={"path": str(data), "format": "alpaca",
                                      "columns": {"instruction": "question", "output": "answer"}})
    assert not [p for p in preflight_problems(load_spec(mapped)) if p.field.startswith("dataset.")]


def test_asked_format_that_does_not_fit_names_the_columns_found(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    spec = load_spec(_spec(tmp_path, dataset={"path": str(data), "format": "sharegpt"}))
    [p] = [p for p in preflight_problems(spec) if p.field.startswith("dataset.")]
    assert p.field == "dataset.columns" and "answer, question" in p.message and "columns.messages" in p.fix


@pytest.mark.parametrize("bad_line", [1, 2, 40])
def test_malformed_jsonl_line_is_named_with_its_file_and_line(tmp_path, bad_line):
    """Every line is read, not just the sampled head: a bad line anywhere would kill the ranks mid-run."""
    rows = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
            for i in range(40)]
    rows[bad_line - 1] = rows[bad_line - 1][:-3]  # truncated, as a partial write leaves it
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(rows) + "\n")
    [p] = [p for p in preflight_problems(load_spec(_spec(tmp_path, dataset={"path": str(data)})))
           if p.field.startswith("dataset.")]
    assert p.field == "dataset.path" and f"{data}: line {bad_line} is not valid JSON" in p.message


def test_seq_len_too_short_for_any_target_is_refused(tmp_path):
    [p] = [p for p in preflight_problems(load_spec(_spec(tmp_path, train={"seq_len": 7})))
           if p.field == "train.seq_len"]
    # The embedded data's shortest prompt + first reply token is 14 tokens; the advice says that number.
    assert p.message == ("7 tokens per block cannot hold any sampled row's prompt and its first trained token (the "
                         "shortest needs 14): conversations would be cut into 7-token pieces and every reply "
                         "trained without the prompt it answers")
    assert p.fix.startswith("use train.seq_len=14 or more (") and "holds each sampled row whole" in p.fix
    assert not [p for p in preflight_problems(load_spec(_spec(tmp_path, train={"seq_len": 64})))
                if p.field == "train.seq_len"]


def test_template_that_yields_no_assistant_tokens(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED / "model", model)
    # Renders user turns only: the assistant replies never reach the token stream.
    (model / "chat_template.jinja").write_text(
        "{%- for m in messages %}{%- if m['role'] == 'user' %}<|im_start|>user\n{{ m['content'] }}<|im_end|>\n"
        "{%- endif %}{%- endfor %}")
    problems = preflight_problems(load_spec(_spec(tmp_path, model={"path": str(model)})))
    [p] = [p for p in problems if "assistant tokens" in p.message]
    assert p.field == "model.path" and "generation" in p.fix


def test_seq_len_must_suit_the_gpu_kernels(tmp_path):
    spec = load_spec(_spec(tmp_path, hardware={"device": "cuda"}, train={"seq_len": 1001}))
    [p] = [p for p in preflight_problems(spec) if p.field == "train.seq_len"]
    assert "multiple of 8" in p.message and "1001" in p.message and p.fix == "use 1008"
    assert not [p for p in preflight_problems(load_spec(_spec(tmp_path, train={"seq_len": 1001})))
                if p.field == "train.seq_len"]  # any length works on CPU


def test_seq_len_not_positive_is_a_schema_error(tmp_path):
    with pytest.raises(SpecError, match="train.seq_len"):
        load_spec(_spec(tmp_path, train={"seq_len": 0}))


def test_model_whose_recurrent_layers_cannot_pack(tmp_path):
    d = _config_dir(tmp_path, "granite", GraniteMoeHybridConfig(num_hidden_layers=2, hidden_size=64, mamba_n_heads=8,
                                                                 vocab_size=512))
    spec = load_spec(_spec(tmp_path, model={"path": str(d), "init": "random"}))
    [p] = [p for p in preflight_problems(spec) if p.field == "train.packing"]
    assert "would not stay apart" in p.message and "train.packing=false" in p.fix
    off = load_spec(_spec(tmp_path, model={"path": str(d), "init": "random"}, train={"packing": False}))
    assert "train.packing" not in _fields(preflight_problems(off))


def test_hybrid_gated_delta_model_packs_through_the_per_document_path(tmp_path, monkeypatch):
    cfg = Qwen3_5TextConfig(num_hidden_layers=2, hidden_size=32, vocab_size=512,
                            layer_types=["linear_attention", "full_attention"])
    d = _config_dir(tmp_path, "hybrid", cfg)
    spec = load_spec(_spec(tmp_path, model={"path": str(d), "init": "random"}))
    assert preflight_problems(spec) == []
    # TRL's padding-free collator passes cu_seq_lens and seq_idx: the same per-document path; a TRL whose
    # collator passed only position_ids could not keep the recurrent layers' documents apart.
    trl = load_spec(_spec(tmp_path, model={"path": str(d), "init": "random"}, engine="trl"))
    assert "train.packing" not in _fields(preflight_problems(trl))
    from runner.train import trl_engine

    monkeypatch.setattr(trl_engine, "collator_passes_boundaries", lambda: False)
    assert "train.packing" in _fields(preflight_problems(trl))


def test_pretrained_init_needs_weights(tmp_path):
    d = _config_dir(tmp_path, "noweights", Qwen3_5TextConfig(num_hidden_layers=2, hidden_size=32, vocab_size=512,
                                                              layer_types=["linear_attention", "full_attention"]))
    [p] = [p for p in preflight_problems(load_spec(_spec(tmp_path, model={"path": str(d)}))) if p.field == "model.init"]
    assert "no weights" in p.message and "model.init=random" in p.fix


def test_every_problem_is_reported_at_once(tmp_path):
    data = tmp_path / "plain.jsonl"
    data.write_text(json.dumps({"body": "x"}) + "\n")
    spec = load_spec(_spec(tmp_path, dataset={"path": str(data)}, hardware={"device": "cuda"},
                           train={"seq_len": 100}))
    with pytest.raises(SpecError) as err:
        preflight(spec)
    assert {"dataset.format", "train.seq_len"} <= _fields(err.value.problems)


def test_cli_refuses_bad_input_before_creating_anything(tmp_path, capsys):
    data = tmp_path / "plain.jsonl"
    data.write_text(json.dumps({"body": "x"}) + "\n")
    spec = _spec(tmp_path, dataset={"path": str(data)})
    runs, records = tmp_path / "runs", tmp_path / "records"
    code = cli.main(["run", str(spec), "--runs-dir", str(runs), "--records-dir", str(records)])
    err = capsys.readouterr().err
    assert code == 2
    assert "dataset.format" in err and "fix:" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not any(runs.glob("*")) and not any(records.glob("*"))


def test_precision_advice_only_when_plain_bf16_would_round_updates_away():
    from runner.gate.preflight import precision_advice

    advice = precision_advice(load_spec("qwen3-1.7b-bench-h200", ["train.optimizer_precision=bf16"]))
    assert advice and "bf16_stochastic" in advice and "lr=1e-05" in advice
    # auto never picks plain bf16, so nothing to warn about; a large lr survives bf16's rounding.
    for quiet in ([], ["train.optimizer_precision=bf16", "train.lr=1e-3"], ["train.optimizer_precision=bf16_stochastic"],
                  ["model.dtype=float32"]):
        assert precision_advice(load_spec("qwen3-1.7b-bench-h200", quiet)) is None, quiet
    assert precision_advice(load_spec("tiny-cpu")) is None


@pytest.mark.parametrize("case", ["bad_line", "seq_len", "format", "bad_gzip", "bad_line_in_gzip", "latin1",
                                  "latin1_in_gzip", "unterminated"])
def test_bad_data_exits_2_in_one_line_before_anything_is_written(tmp_path, capsys, case):
    chat = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
            for i in range(120)]
    data = tmp_path / ("data.jsonl.gz" if "gzip" in case else "data.jsonl")
    dataset: dict = {"path": str(data)}
    train: dict = {}
    if case == "bad_line":
        chat[99] = "{not json"
        needle = f"{data}: line 100 is not valid JSON"
    elif case == "seq_len":
        train["seq_len"] = 7
        needle = "every reply trained without the prompt it answers"
    elif case == "format":
        chat = [json.dumps({"question": "q", "answer": "a"})]
        needle = "columns (answer, question)"
    elif case == "bad_line_in_gzip":
        chat[99] = "{not json"
        needle = f"{data}: line 100 is not valid JSON"
    elif case.startswith("latin1"):  # one row saved by a Latin-1 editor: the ranks would die of UnicodeDecodeError
        chat[99] = json.dumps({"messages": [{"role": "user", "content": "Klämbt?"},
                                            {"role": "assistant", "content": "a"}]}, ensure_ascii=False)
        fixed = data.with_name("data.utf8.jsonl")
        command = (f"zcat {data} | iconv -f latin1 -t utf-8 > {fixed}" if "gzip" in case
                   else f"iconv -f latin1 -t utf-8 {data} > {fixed}")
        needle = (f"{data}: line 100 is not UTF-8 (byte 0xe4 at column 46) (fix: re-encode the file as UTF-8, e.g. "
                  f"from Latin-1: `{command}`, and point dataset.path at data.utf8.jsonl)")
    elif case == "unterminated":
        chat[99] = '{"messages": "Klämbt'
        needle = f"{data}: line 100 is not valid JSON (Unterminated string starting at column 14) (fix: fix or remove"
    else:  # a compressed file cut short, as an interrupted download leaves it
        needle = f"{data}: not a readable gzip file"
    text = "\n".join(chat) + "\n"
    raw = text.encode("latin-1") if case.startswith("latin1") else text.encode()
    if case == "bad_gzip":
        data.write_bytes(gzip.compress(raw)[:-40])
    elif "gzip" in case:
        data.write_bytes(gzip.compress(raw))
    else:
        data.write_bytes(raw)
    spec = _spec(tmp_path, dataset=dataset, train={"max_steps": 1, **train})
    runs, records = tmp_path / "runs", tmp_path / "records"
    code = cli.main(["run", str(spec), "--runs-dir", str(runs), "--records-dir", str(records)])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("fix or remove that line" in err) == (case in ("bad_line", "bad_line_in_gzip", "unterminated"))
    assert not runs.exists() and not records.exists()


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_a_pad_id_outside_the_vocabulary_is_refused_in_one_line(tmp_path, capsys, kind):
    """transformers' Phi3Config default has pad_token_id 32000 with vocab_size 32000: the ranks would die building
    the embedding, and LoRA's check built the model in preflight itself."""
    from transformers import Phi3Config

    config = Phi3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2)
    config.pad_token_id = 512  # what the default does at its own vocabulary size (set after: the class warns)
    model = _config_dir(tmp_path, "phi3", config)
    spec = _spec(tmp_path, model={"path": str(model), "init": "random"}, method={"kind": kind})
    runs, records = tmp_path / "runs", tmp_path / "records"
    code = cli.main(["run", str(spec), "--runs-dir", str(runs), "--records-dir", str(records)])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and "Traceback" not in err, err
    assert errors == [f"error: preflight found problems: model.path: pad_token_id is 512 in {model}/config.json, "
                      "outside the vocabulary (vocab_size 512: ids 0 to 511) (fix: set pad_token_id in config.json to "
                      "the tokenizer's id for that token (below 512), or to null)"]
    assert not runs.exists() and not records.exists()


GLAIVE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "glaive_toolcall_en_demo.json"
# The embedded ChatML template as it was before it learnt tools: assistant content only, no tools block.
PLAIN_CHATML = ("{%- for message in messages %}{%- if message['role'] == 'assistant' %}"
                "{{- '<|im_start|>assistant\\n' }}{%- generation %}{{- message['content'] + '<|im_end|>\\n' }}"
                "{%- endgeneration %}{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>\\n' }}{%- endif %}{%- endfor %}")


def test_a_template_that_drops_tool_calls_is_refused_before_launch(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED / "model", model)
    (model / "chat_template.jinja").write_text(PLAIN_CHATML)
    spec = _spec(tmp_path, model={"path": str(model)}, dataset={"path": str(GLAIVE), "train_on": "assistant+tool_calls"})
    problems = [p for p in preflight_problems(load_spec(spec)) if p.field == "model.path"]
    assert [p.message for p in problems] == [
        "the chat template drops tool calls: a sampled row calls 'get_word_length' but the rendered text has no "
        "call, so its assistant turn trains empty",
        "the chat template drops the tools list: a sampled row offers 'get_word_length' but the rendered text does "
        "not list it"]
    assert "tool_calls" in problems[0].fix and "chat_template.jinja" in problems[0].fix
    runs, records = tmp_path / "runs", tmp_path / "records"
    code = cli.main(["run", str(spec), "--runs-dir", str(runs), "--records-dir", str(records)])
    err = capsys.readouterr().err
    assert code == 2 and "drops tool calls" in err and "Traceback" not in err
    assert not runs.exists() and not records.exists()
    # The embedded template renders both: the same data passes.
    ok = _spec(tmp_path, dataset={"path": str(GLAIVE), "train_on": "assistant+tool_calls"})
    assert preflight_problems(load_spec(ok)) == []


def test_a_bom_jsonl_reads_its_first_row(tmp_path):
    rows = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
            for i in range(3)]
    data = tmp_path / "bom.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + ("\n".join(rows) + "\n").encode())
    assert preflight_problems(load_spec(_spec(tmp_path, dataset={"path": str(data)}))) == []
    from runner.data.datafiles import read_rows

    assert read_rows(data, 5)[0]["messages"][0]["content"] == "q0"
    csv = tmp_path / "bom.csv"
    csv.write_bytes(b"\xef\xbb\xbfinstruction,output\nq,a\n")
    assert read_rows(csv, 5) == [{"instruction": "q", "output": "a"}]


def test_sequence_parallel_refuses_gated_delta_layers_before_launch(tmp_path):
    cfg = Qwen3_5TextConfig(num_hidden_layers=2, hidden_size=32, vocab_size=512,
                            layer_types=["linear_attention", "full_attention"])
    d = _config_dir(tmp_path, "hybrid", cfg)
    spec = load_spec(_spec(tmp_path, model={"path": str(d), "init": "random"},
                           hardware={"nproc_per_node": 2, "sequence_parallel": 2}))
    [p] = [p for p in preflight_problems(spec) if p.field == "hardware.sequence_parallel"]
    assert "gated-delta" in p.message and p.fix == "use hardware.sequence_parallel=1"
    whole = load_spec(_spec(tmp_path, model={"path": str(d), "init": "random"}, hardware={"nproc_per_node": 2}))
    assert "hardware.sequence_parallel" not in _fields(preflight_problems(whole))


def test_sequence_parallel_refuses_heads_that_do_not_divide(tmp_path):
    # The embedded model has 4 attention heads: 2 ranks split them, 4 do too; 8 cannot.
    assert preflight_problems(load_spec("tiny-cpu", ["hardware.sequence_parallel=2"])) == []
    spec = load_spec("tiny-cpu", ["hardware.nproc_per_node=8", "hardware.sequence_parallel=8"])
    [p] = [p for p in preflight_problems(spec) if p.field == "hardware.sequence_parallel"]
    assert "4 attention heads do not divide over 8 ranks" in p.message


@pytest.mark.parametrize("case", ["no_config", "unknown_model_type", "unknown_role", "yaml_tab"])
def test_a_broken_folder_file_or_role_is_one_line_with_the_right_fix(tmp_path, capsys, case):
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED / "tokenizer", model)
    sections: dict = {"model": {"path": str(model), "init": "random"}}
    if case == "unknown_model_type":
        config = json.loads((EMBEDDED / "model" / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "model_type": "nosuchmodel"}))
        needle = "config.json's model_type 'nosuchmodel' is not one transformers"
    elif case == "no_config":
        needle = f"{model} has no config.json (fix: point model.path at an HF model folder)"
    else:
        shutil.copy(EMBEDDED / "model" / "config.json", model / "config.json")
    if case == "unknown_role":  # the customer speaks first: mapping it to assistant would train on its words
        data = tmp_path / "chat.jsonl"
        data.write_text(json.dumps({"messages": [{"role": "customer", "content": "hi"},
                                                 {"role": "assistant", "content": "hello"}]}) + "\n")
        sections["dataset"] = {"path": str(data), "format": "messages"}
        needle = "(fix: map it, e.g. dataset.roles={customer: user})"
    spec = _spec(tmp_path, **sections)
    if case == "yaml_tab":
        spec.write_text(spec.read_text().replace("  max_steps", "\tmax_steps"))
        needle = "found character '\\t' that cannot start any token (fix: indent with spaces, not tabs)"
    runs, records = tmp_path / "runs", tmp_path / "records"
    code = cli.main(["run", str(spec), "--runs-dir", str(runs), "--records-dir", str(records)])
    out, err = capsys.readouterr()
    assert code == 2 and needle in err and out == "" and "Traceback" not in err, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert not runs.exists() and not records.exists()
