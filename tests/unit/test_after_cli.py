"""`runner export`, `generate` and `chat` on bad input: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli.main import main as runner_main
from runner.record.schema import SCHEMA
from runner.spec import RunSpec, resolve


def _record(tmp_path: Path, sets: dict | None = None, params: int = 1000, run_dir: bool = True) -> Path:
    spec = resolve(RunSpec(**(sets or {})), cuda_available=False, gpu_count=0)
    folder = tmp_path / "runs" / "r1"
    if run_dir:
        folder.mkdir(parents=True, exist_ok=True)
    rec = {"schema": SCHEMA, "id": "r1", "status": "succeeded", "spec": spec.to_dict(), "run_dir": str(folder),
           "estimate": {"arch": {"params_total": params}}, "metrics": {}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "r1.json"
    path.write_text(json.dumps(rec))
    return path


def _fails(args: list[str], capsys) -> str:
    assert runner_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_export_of_a_full_fine_tune_as_an_adapter_is_refused(tmp_path, capsys):
    err = _fails(["export", str(_record(tmp_path)), "--as", "adapter", "-o", str(tmp_path / "out")], capsys)
    assert "has no adapter" in err and "--as full" in err and not (tmp_path / "out").exists()


def test_export_of_a_run_that_kept_nothing_says_how_to_keep_it(tmp_path, capsys):
    rec = _record(tmp_path, {"output": {"save": "none"}})
    err = _fails(["export", str(rec), "--as", "full", "-o", str(tmp_path / "out")], capsys)
    assert "kept no weights" in err and "output.save=auto" in err and not (tmp_path / "out").exists()
    err = _fails(["generate", str(_record(tmp_path / "gone", run_dir=False)), "--prompt", "hi"], capsys)
    assert "run folder" in err


def test_export_into_a_folder_with_files_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = _fails(["export", str(_record(tmp_path)), "--as", "full", "-o", str(out)], capsys)
    assert "not empty" in err and (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("flags, words", [(["--max-new-tokens", "0"], "--max-new-tokens"),
                                          (["--temperature", "-1"], "--temperature")])
def test_generate_bad_numbers(tmp_path, capsys, flags, words):
    assert words in _fails(["generate", str(_record(tmp_path)), "--prompt", "hi", *flags], capsys)


def test_a_model_that_does_not_fit_is_refused_with_the_estimate(tmp_path, capsys):
    err = _fails(["generate", str(_record(tmp_path, params=10 ** 14)), "--prompt", "hi", "--base"], capsys)
    assert "does not fit" in err and "100000.0B parameters" in err
    err = _fails(["chat", str(_record(tmp_path, params=10 ** 14))], capsys)
    assert "does not fit" in err
