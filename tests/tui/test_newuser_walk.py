"""A new user's walk at 80×24 in tmux (tests/tui/newuser_walk.sh): their own alpaca file under other column names,
read once the wizard's Dataset step is told the format and the columns; launch, dashboard, summary, records, the
record. The recorded screens are benchmarks/newuser-walk-80x24.txt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.record.records import verify

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("newuser_walk.sh")


@pytest.mark.dist
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_new_user_sets_format_and_columns_and_trains_to_a_record(tmp_path: Path) -> None:
    binary = Path(sys.executable).with_name("sft-tui")
    if not binary.exists():
        pytest.skip(f"no sft-tui console script next to {sys.executable} (pip install -e .)")
    proc = subprocess.run([str(SCRIPT), str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "SFT_TUI": str(binary), "MAX_STEPS": "3"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    record = Path(out.strip().splitlines()[-1].removeprefix("record: "))
    screens = dict(part.split("\n", 1) for part in out.split("--- ")[1:])
    # The Dataset step asked for the columns, then read the file through them.
    asked = " ".join(screens["dataset: format alpaca picked, the columns not yet mapped"].replace("▕", " ").split())
    assert "needs columns 'instruction' and 'output'" in asked
    mapped = screens["dataset: format alpaca, columns mapped"]
    assert "alpaca (set): question, context, answer" in mapped and "local/qa" in mapped
    assert "messages column" not in out
    assert "SUCCEEDED" in screens["summary"] and record.stem in screens["records"]
    shown = " ".join(screens["record"].split())
    assert "dataset local/qa (qa.json) · alpaca · input=context, instruction=question, output=answer" in shown
    rec = json.loads(record.read_text())
    ds = rec["spec"]["dataset"]
    assert (ds["id"], ds["format"], ds["columns"]) == ("local/qa", "alpaca", {"instruction": "question",
                                                                              "input": "context", "output": "answer"})
    assert rec["status"] == "succeeded" and rec["metrics"]["steps"] == 3 and verify(record)[0]
    packing = rec["metrics"]["packing"]
    assert packing["doc_tokens"]["tokens"] == packing["real_tokens"] > 0  # what trained, counted


FAST = Path(__file__).with_name("fast_keys_walk.sh")


@pytest.mark.dist
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_fast_typist_trains_a_config_only_model_on_their_file(tmp_path: Path) -> None:
    """tests/tui/fast_keys_walk.sh: keys sent with no pause after ^n land where they are meant to (the data's path
    in the Dataset step's local path), random init is proposed for a folder without weights, LoRA is picked, and
    the record is named and described after the run."""
    binary = Path(sys.executable).with_name("sft-tui")
    if not binary.exists():
        pytest.skip(f"no sft-tui console script next to {sys.executable} (pip install -e .)")
    proc = subprocess.run([str(FAST), str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=500,
                          env={**os.environ, "SFT_TUI": str(binary), "MAX_STEPS": "3", "TIMEOUT_S": "240"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    screens = dict(part.split("\n", 1) for part in out.split("--- ")[1:])
    path_line = next(line for line in screens["dataset: the path typed right after ^n"].splitlines()
                     if "local path" in line)
    assert "/names.js" in path_line, path_line  # the field shows the path's end (a long one is scrolled)
    rec = json.loads(Path(out.strip().splitlines()[-1].removeprefix("record: ")).read_text())
    spec = rec["spec"]
    assert (spec["model"]["path"], spec["model"]["init"]) == (str(tmp_path / "tiny-config"), "random")
    assert (spec["dataset"]["id"], spec["dataset"]["path"]) == ("local/names", str(tmp_path / "names.jsonl"))
    assert spec["method"]["kind"] == "lora" and rec["status"] == "succeeded" and rec["metrics"]["steps"] == 3
    # Named and described after what it is, not after the recipe it started from (tiny-cpu).
    assert spec["name"].startswith("tiny-config-lora") and "tiny-cpu" not in rec["id"]
    assert spec["description"].startswith("lora fine-tune of local/tiny-config on local/names")
