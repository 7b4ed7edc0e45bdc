"""A run's name and description follow what the run is (runner.naming.follow_run), from the CLI as a user types it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runner.naming import follow_run, run_name
from runner.record import records as records_mod
from tests.tui.conftest import synthetic_record

REPO = Path(__file__).resolve().parents[2]


def runner(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, timeout=120)


@pytest.mark.launches
def test_a_changed_model_names_and_describes_the_run(tmp_path: Path) -> None:
    model = tmp_path / "gemma2-small"
    shutil.copytree(REPO / "recipes" / "embedded" / "model", model)
    out = runner("show", "tiny-cpu", "--as-written", "--set", f"model.path={model}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    spec = yaml.safe_load(out.stdout)
    assert spec["name"] == "gemma2-small-full-tiny-chat"
    assert spec["description"] == "full fine-tune of local/gemma2-small on sft-tui/tiny-chat"
    assert "note: name and description now follow the run: 'gemma2-small-full-tiny-chat'" in out.stderr
    # What the recipe describes, unchanged (only a training setting differs): the recipe's name and description.
    same = yaml.safe_load(runner("show", "tiny-cpu", "--as-written", "--set", "train.lr=1e-3", cwd=tmp_path).stdout)
    assert same["name"] == "tiny-cpu" and same["description"].startswith("embedded tiny Qwen3")
    # A name the user typed is theirs; the description still follows the run.
    typed = yaml.safe_load(runner("show", "tiny-cpu", "--as-written", "--set", "method.kind=lora", "--set",
                                  "name=mine", cwd=tmp_path).stdout)
    assert typed["name"] == "mine" and typed["description"] == "lora fine-tune of sft-tui/tiny-qwen3 on sft-tui/tiny-chat"


@pytest.mark.launches
def test_runs_differing_only_in_train_on_differ_in_the_list(tmp_path: Path) -> None:
    ids = []
    for i, train_on in enumerate(("assistant", "assistant+tool_calls")):
        out = runner("show", "tiny-cpu", "--as-written", "--set", f"dataset.train_on={train_on}", cwd=tmp_path)
        spec = yaml.safe_load(out.stdout)
        run_id = f"20260101-00000{i}-{spec['name']}-abcdef"
        rec = synthetic_record(run_id)
        rec["spec"] = spec
        records_mod.save(tmp_path / "records" / f"{run_id}.json", rec)
        ids.append(run_id)
    assert ids[0].endswith("-tiny-cpu-abcdef") and ids[1].endswith("-tiny-qwen3-full-tiny-chat-tool-calls-abcdef")
    listed = runner("list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {ln.split()[0]: ln for ln in listed.stdout.splitlines() if ln.split() and ln.split()[0] in ids}
    assert set(rows) == set(ids)
    assert "(+tool calls)" in rows[ids[1]] and "(+tool calls)" not in rows[ids[0]]


def test_the_rule_keeps_what_the_user_chose() -> None:
    origin = {"name": "llama-tiny-lora", "description": "lora fine-tune of local/llama-tiny on local/lima",
              "model": {"id": "local/llama-tiny"}, "dataset": {"id": "local/lima"}, "method": {"kind": "lora"}}
    changed = {**origin, "method": {"kind": "full"}, "dataset": {"id": "local/alpaca"}}
    follow_run(changed, origin)
    assert (changed["name"], changed["description"]) == run_name(changed) == \
        ("llama-tiny-full-alpaca", "full fine-tune of local/llama-tiny on local/alpaca")
    typed = {**origin, "name": "my-run", "method": {"kind": "full"}}
    follow_run(typed, origin)
    assert typed["name"] == "my-run" and typed["description"] == "full fine-tune of local/llama-tiny on local/lima"
    same = {**origin}
    assert follow_run(same, origin) == [] and same["name"] == "llama-tiny-lora"
