"""The `runner` command as a new user meets it: exit codes, piped output, ids, empty and mistaken inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.cli.main import EXIT_BAD_INPUT, EXIT_NOT_VERIFIED, EXIT_OK, main
from runner.record import records as records_mod
from tests.tui.conftest import RUN_ID, RUN_ID_B, write_synthetic_records

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def recs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write_synthetic_records(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "records"


def runner(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real console entry with stdout a pipe, as `runner ... | cat` runs it."""
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, timeout=120)


def test_piped_list_and_diff_are_never_cut(recs: Path) -> None:
    out = runner("list", cwd=recs.parent)
    assert out.returncode == 0, out.stderr
    assert RUN_ID in out.stdout and RUN_ID_B in out.stdout
    assert "sft-tui/tiny-chat" in out.stdout  # the dataset column
    diff = runner("diff", RUN_ID, RUN_ID_B, cwd=recs.parent)
    assert diff.returncode == 0, diff.stderr
    # Every differing field is there in full, on one line with both values.
    lines = diff.stdout.splitlines()
    assert any("metrics.per_rank" not in ln and "spec.train.lr" in ln and "0.003" in ln and "0.01" in ln
               for ln in lines), diff.stdout
    # Long values too, whole (in a terminal they may be cut to a glance).
    long = records_mod.load(recs / f"{RUN_ID_B}.json")
    long["id"], long["spec"]["description"] = "20260101-003000-demo-long", "a description " * 12 + "that ends here"
    records_mod.save(recs / f"{long['id']}.json", long)
    diff = runner("diff", RUN_ID, long["id"], cwd=recs.parent)
    assert "…" not in diff.stdout and long["spec"]["description"] in diff.stdout, diff.stdout


def test_list_keeps_the_id_whole_at_80_columns(recs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from runner.record.compare import print_list
    from runner.record.records import list_records

    console = Console(width=80, force_terminal=True, color_system=None)
    with console.capture() as cap:
        print_list(list_records(recs), console)
    assert RUN_ID in cap.get() and RUN_ID_B in cap.get()


def test_list_json_has_the_dataset(recs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json"]) == EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [RUN_ID, RUN_ID_B] and rows[0]["dataset"] == "sft-tui/tiny-chat"


def test_verify_takes_a_bare_id_and_a_tampered_record_exits_4(recs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", RUN_ID]) == EXIT_OK
    assert "ok" in capsys.readouterr().out
    path = recs / f"{RUN_ID}.json"
    rec = json.loads(path.read_text())
    rec["metrics"]["final_loss"] = 0.1
    path.write_text(json.dumps(rec))
    assert main(["verify", RUN_ID[:12]]) == EXIT_NOT_VERIFIED == 4
    assert "lock mismatch" in capsys.readouterr().err
    assert main(["verify", "nope"]) == EXIT_BAD_INPUT


def test_an_empty_spec_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("", "# only a comment\n", "{}\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        assert main(["run", str(empty), "--runs-dir", str(tmp_path / "runs")]) == EXIT_BAD_INPUT
        assert "is empty" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_replay_of_a_recipe_says_use_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "recipes/tiny-cpu.yaml"]) == EXIT_BAD_INPUT
    assert "runner run recipes/tiny-cpu.yaml" in capsys.readouterr().err
    assert main(["replay", "tiny-cpu"]) == EXIT_BAD_INPUT
    assert "is a recipe" in capsys.readouterr().err


def test_a_union_field_gets_one_error_with_its_own_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "tiny-cpu", "--set", "hardware.nproc_per_node=abc"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("hardware.nproc_per_node") == 1 and "nproc_per_node.int" not in err
    assert "hardware.nproc_per_node: should be a valid integer or 'auto', got \"abc\"" in err


def test_fields_lists_enum_values_and_indents_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fields"]) == EXIT_OK
    out = capsys.readouterr().out
    assert 'One of: "constant", "cosine", "linear".' in " ".join(out.split())
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("train.schedule "))
    assert lines[at + 1].startswith("    ")
    # Every line is a field's head (at column 0) or its description (indented): nothing wraps back to column 0.
    from runner.spec import field_docs

    heads = {p for p, _, _ in field_docs()}
    assert all(ln.startswith("    ") or ln.split(" ")[0] in heads for ln in lines if ln)


def test_max_steps_below_warmup_warns(tmp_path: Path) -> None:
    from runner.spec import load_spec, spec_warnings

    spec = load_spec("tiny-cpu", ["train.max_steps=5", "train.warmup_steps=20"])
    (warning,) = spec_warnings(spec)
    assert "train.warmup_steps" in warning and "never reaches" in warning
    assert spec_warnings(load_spec("tiny-cpu", ["train.max_steps=50", "train.warmup_steps=20"])) == []


def test_piped_estimate_keeps_each_sentence_on_its_line(tmp_path: Path) -> None:
    out = runner("estimate", "tiny-cpu", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    time_line = next(ln for ln in out.stdout.splitlines() if ln.startswith("time: "))
    # One line, not wrapped at 80 columns: the sentence's closing parenthesis is on it.
    assert len(time_line) > 80 and time_line.rstrip().endswith(")")


def test_run_refuses_a_hub_model_it_cannot_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import runner.gate.hub

    monkeypatch.setattr(runner.gate.hub, "hub_reachable", lambda: False)
    monkeypatch.setattr(runner.gate.hub, "_cache_dir", lambda: tmp_path / "empty-cache")
    code = main(["run", "tiny-cpu", "--set", "model.path=null", "--set", "model.id=org/not-cached",
                 "--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")])
    assert code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "model.id: org/not-cached is not in the local cache and the hub" in err and "model.path" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "records").exists()
    # local model and data: nothing to reach, no probe
    from runner.spec import load_spec

    assert runner.gate.hub.hub_problems(load_spec("tiny-cpu")) == []


def test_packaging_metadata_and_make_targets_say_what_a_new_user_needs() -> None:
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    # An SPDX string (a TOML table is deprecated and warned about on every install), which needs setuptools 77.
    assert meta["project"]["license"] == "Apache-2.0"
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in meta["build-system"]["requires"])
    make = subprocess.run(["make", "-n", "demo", "runner", "ARGS=list", "-W", "pyproject.toml"], cwd=REPO,
                          capture_output=True, text=True, timeout=60).stdout
    assert "setting up .venv/" in make and "source .venv/bin/activate" in make
    assert ".venv/bin/runner list" in make


def test_verify_of_a_corrupt_record_exits_4_and_a_missing_one_2(recs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = recs / f"{RUN_ID}.json"
    path.write_text(path.read_text()[:200])  # truncated, as a full disk leaves it
    assert main(["verify", RUN_ID]) == EXIT_NOT_VERIFIED
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["verify", str(recs / "gone.json")]) == EXIT_BAD_INPUT
    assert "no such record file" in capsys.readouterr().err


@pytest.mark.parametrize(("setting", "fix"), [("train.lr=-1", "use a value > 0"),
                                              ("dataset.eval_fraction=2", "use a value in [0.0, 1.0)"),
                                              ("hardware.nodes=0", "use a value >= 1")])
def test_range_errors_say_the_range(setting: str, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "tiny-cpu", "--set", setting]) == EXIT_BAD_INPUT
    assert f"(fix: {fix})" in capsys.readouterr().err


def test_an_unknown_gpu_name_is_refused_on_cpu_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs, records_dir = tmp_path / "runs", tmp_path / "records"
    code = main(["run", "tiny-cpu", "--set", "hardware.gpu=RTX-9999", "--runs-dir", str(runs),
                 "--records-dir", str(records_dir)])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and "hardware.gpu" in err and "did you mean" in err and "Traceback" not in err
    assert not runs.exists() and not records_dir.exists()


def test_cpu_estimate_says_gib_needed_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "tiny-cpu"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "needed per rank" in out and "GiB needed per rank of" in out
    assert "RSS" not in out and "per GPU" not in out and "per-GPU" not in out


def test_list_marks_replays_and_resumed_runs(recs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = recs / f"{RUN_ID_B}.json"
    rec = json.loads(path.read_text())
    rec["replay_of"], rec["resumes"] = RUN_ID, [{"at": "2026-01-01T00:20:00+00:00"}]
    path.write_text(json.dumps(rec))
    out = runner("list", cwd=recs.parent).stdout
    [line_b] = [ln for ln in out.splitlines() if ln.split()[:1] == [RUN_ID_B]]
    [line_a] = [ln for ln in out.splitlines() if ln.split()[:1] == [RUN_ID]]
    assert f"replay of {RUN_ID}, resumed ×1" in line_b and "replay of" not in line_a
    assert main(["list", "--json"]) == EXIT_OK
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[RUN_ID_B]["resumes"] == 1 and rows[RUN_ID]["resumes"] == 0


def test_every_records_dir_option_has_help() -> None:
    from runner.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    with_dir = {name: p for name, p in sub.choices.items()
                if any("--records-dir" in a.option_strings for a in p._actions)}
    assert {"run", "replay", "verify", "diff", "list", "calibrate", "bench"} <= set(with_dir)
    for name, p in with_dir.items():
        [opt] = [a for a in p._actions if "--records-dir" in a.option_strings]
        assert opt.help and "records" in opt.help, name


def test_fields_takes_a_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fields", "train."]) == EXIT_OK
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith(" ")]
    assert names and all(n.startswith("train.") for n in names) and "train.seq_len" in names
    assert main(["fields", "trian."]) == EXIT_BAD_INPUT
    assert "no spec field starts with 'trian.'" in capsys.readouterr().err


def test_long_documents_tokenise_without_the_indexing_warning(capfd: pytest.CaptureFixture[str]) -> None:
    from runner.spec import load_spec
    from runner.data.tokens import tokenize_text
    from runner.train.model import load_tokenizer

    tok = load_tokenizer(load_spec("tiny-cpu"))
    ids, _ = tokenize_text(tok, [("word " * 6000, True)])
    assert len(ids) > tok.model_max_length
    assert "indexing errors" not in capfd.readouterr().err


def test_ids_follow_a_new_path_and_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from runner.record.compare import dataset_name

    data = REPO / "tests" / "fixtures" / "data" / "alpaca_en_demo.json"
    model = tmp_path / "my-llama"
    __import__("shutil").copytree(REPO / "recipes" / "embedded" / "model", model)
    assert main(["show", "tiny-cpu", "--as-written", "--set", f"dataset.path={data}", "--set", f"model.path={model}"]) \
        == EXIT_OK
    out, err = capsys.readouterr()
    spec = yaml.safe_load(out)
    assert spec["dataset"]["id"] == "local/alpaca_en_demo" and spec["model"]["id"] == "local/my-llama"
    assert dataset_name(spec) == "local/alpaca_en_demo"  # what `runner list` and the records show
    assert err.splitlines()[:2] == [
        "note: dataset.id is now local/alpaca_en_demo (named after dataset.path; it was sft-tui/tiny-chat); set "
        "dataset.id to name it otherwise",
        "note: model.id is now local/my-llama (named after model.path; it was sft-tui/tiny-qwen3); set model.id to "
        "name it otherwise"]
    # An id given with the path, or no path change, keeps the id; nothing is said.
    assert main(["show", "tiny-cpu", "--as-written", "--set", f"dataset.path={data}", "--set", "dataset.id=mine"]) \
        == EXIT_OK
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["dataset"]["id"] == "mine" and "dataset.id" not in err
    assert main(["show", "tiny-cpu"]) == EXIT_OK
    assert yaml.safe_load(capsys.readouterr().out)["dataset"]["id"] == "sft-tui/tiny-chat"


def test_show_prints_what_a_launch_would_run_and_as_written_what_was_written(capsys) -> None:
    """`runner show` fills the `auto` values a launch fills (ranks, device, dtype, precision, the planner's levers)
    for the machine the run will see: this one, or the GPUs a recipe names."""
    import yaml

    assert main(["show", "tiny-cpu"]) == EXIT_OK
    out, err = capsys.readouterr()
    spec = yaml.safe_load(out)
    assert (spec["hardware"]["device"], spec["hardware"]["nproc_per_node"], spec["model"]["dtype"]) == ("cpu", 2, "float32")
    assert spec["train"]["optimizer_precision"] == "fp32_master"
    assert spec["train"]["micro_batch"] == 1 and spec["train"]["grad_accum"] == 1
    assert err.startswith("# auto values filled for this machine, levers by the planner")
    assert main(["show", "tiny-cpu", "--as-written"]) == EXIT_OK
    written = yaml.safe_load(capsys.readouterr().out)
    assert written["train"]["micro_batch"] == "auto" and written["train"]["optimizer_precision"] == "auto"
    assert main(["show", "llama-3.2-3b-bench-h200"]) == EXIT_OK  # one H200 named: planned for it, from here
    out, err = capsys.readouterr()
    spec = yaml.safe_load(out)
    assert (spec["hardware"]["device"], spec["hardware"]["nproc_per_node"]) == ("cuda", 1)
    assert spec["model"]["dtype"] == "bfloat16" and spec["train"]["optimizer_precision"] == "bf16_stochastic"
    assert "for the GPUs it names" in err


def test_the_run_report_says_where_the_export_went() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from runner.cli.session import _report

    rec = {"status": "succeeded", "metrics": {"steps": 3, "first_loss": 6.2, "final_loss": 5.0, "tokens_per_s": 9.0,
                                              "export": {"dir": "runs/x/export", "kind": "full", "files": {}}}}
    console = Console(width=200, color_system=None)
    with console.capture() as cap:
        _report(console, SimpleNamespace(record=rec, record_path=Path("records/x.json"), run_id="x"))
    assert "export (full): runs/x/export\nrecord: records/x.json" in cap.get()
    with console.capture() as cap:
        _report(console, SimpleNamespace(record={**rec, "metrics": {"steps": 3}}, record_path=Path("r.json"),
                                         run_id="x"))
    assert "export" not in cap.get()


def test_bad_run_id_and_records_folder_are_refused_first(tmp_path: Path) -> None:
    """Refused before anything else is read: the recipe named here does not even exist."""
    (tmp_path / "recfile").write_text("")
    for args, needle in ((["--run-id", "../x"], "--run-id '../x': a run id is one folder name"),
                         (["--records-dir", "recfile"], "--records-dir recfile: recfile is a file, not a folder")):
        out = runner("run", "no-such-recipe", *args, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.splitlines() == [f"error: {out.stderr[7:].strip()}"], out.stderr
        assert needle in out.stderr and "unknown recipe" not in out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "records").exists()


def test_help_lists_every_exit_code(tmp_path: Path) -> None:
    out = runner("--help", cwd=tmp_path)
    text = " ".join(out.stdout.split())
    for code in ("0 ok", "1 run failed", "2 bad input", "3 replay did not reproduce", "4 record does not verify",
                 "129 the view lost its terminal", "130 cancelled", "143 stopped gracefully by SIGTERM"):
        assert code in text, code
