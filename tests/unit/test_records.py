"""Records: canonical lock, verify on any changed byte, atomic writes that survive a killed writer, redaction."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.record import records
from runner.record.compare import diff_records, summary_row
from runner.record.pins import relevant_env
from runner.writes import redact, redact_text
from runner.record.records import RecordError, compare_curves


def _record(run_id: str = "r1", status: str = "succeeded", loss: float = 1.5) -> dict:
    spec = {"name": "x", "engine": "native", "model": {"id": "m"}, "method": {"kind": "full"}}
    rec = records.new_record(run_id, spec,
                             {"python": "3.11", "packages": {"torch": "2.13.0"}}, {"argv": ["a"]}, None,
                             Path("runs") / run_id)
    rec["status"] = status
    rec["metrics"] = {"steps": 2, "final_loss": loss, "tokens_per_s": 10.0,
                      "loss_curve": {"0": [[1, 2.0], [2, loss]], "1": [[1, 2.1], [2, loss + 0.1]]}}
    return rec


def test_verify_ok_then_fails_on_every_single_byte_change(tmp_path: Path):
    path = tmp_path / "r1.json"
    records.save(path, _record())
    ok, _ = records.verify(path)
    assert ok
    original = path.read_bytes()
    content = json.loads(original)
    # Flip each leaf value of the content (not whitespace): every change must break the lock.
    for key in ("status", "id", "created"):
        changed = dict(content)
        changed[key] = str(changed[key]) + "x"
        path.write_text(json.dumps(changed))
        ok, reason = records.verify(path)
        assert not ok and "lock mismatch" in reason and "\n" not in reason
    # Any byte of a value: change one digit of the final loss inside the file text.
    text = original.decode()
    i = text.index('"final_loss": 1.5') + len('"final_loss": 1.')
    path.write_text(text[:i] + "6" + text[i + 1:])
    assert not records.verify(path)[0]


@pytest.mark.parametrize("content,reason", [
    ('{"schema": "sft-tui.record/1", "id": "x"', "not valid JSON"),
    ('{"schema": "sft-tui.record/99"}', "unknown record schema"),
    ('{"hello": 1}', "not a run record"),
    ("[1, 2]", "not a run record"),
])
def test_load_errors_are_one_line(tmp_path: Path, content: str, reason: str):
    p = tmp_path / "r.json"
    p.write_text(content)
    with pytest.raises(RecordError) as e:
        records.load(p)
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_missing_file_is_a_user_error(tmp_path: Path):
    with pytest.raises(RecordError, match="no such record"):
        records.load(tmp_path / "nope.json")


_WRITER = r"""
import sys, time
from pathlib import Path
from runner.writes import atomic_write_json
path = Path(sys.argv[1])
big = {"blob": "x" * 5_000_000}
i = 0
while True:
    atomic_write_json(path, {"schema": "sft-tui.record/1", "i": i, **big})
    i += 1
"""


@pytest.mark.launches
def test_killed_writer_never_leaves_a_half_written_record(tmp_path: Path):
    path = tmp_path / "r.json"
    for _ in range(5):
        before = set(tmp_path.glob(".r.json.*"))  # killed writes before this one leave theirs
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], cwd=Path(__file__).resolve().parents[2])
        deadline = time.monotonic() + 60
        # Killed mid-write: once a record was written whole, while a new write's temporary file is there.
        while not (path.exists() and set(tmp_path.glob(".r.json.*")) - before):
            assert time.monotonic() < deadline and proc.poll() is None, "the writer wrote nothing in 60 s"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if path.exists():
            data = json.loads(path.read_text())  # complete JSON, never a prefix
            assert data["blob"] == "x" * 5_000_000
    assert path.exists()
    assert list(tmp_path.glob(".r.json.*")), "no kill landed mid-write"  # each leaves its temporary file
    # The temporary files of killed writes are dot-files, never picked up as records.
    assert [p.name for p in tmp_path.glob("*.json")] == ["r.json"]


def test_redaction_of_env_and_urls():
    env = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz", "NCCL_DEBUG": "WARN", "OPENAI_API_KEY": "sk-x",
           "TOKENIZERS_PARALLELISM": "false", "HF_ENDPOINT": "https://user:pa55@hub.example.com/x", "HOME": "/root"}
    out = relevant_env(env)
    assert out["HF_TOKEN"] == "<redacted>" and out["NCCL_DEBUG"] == "WARN"
    assert out["TOKENIZERS_PARALLELISM"] == "false"
    assert "pa55" not in out["HF_ENDPOINT"] and "HOME" not in out and "OPENAI_API_KEY" not in out
    assert redact({"db_password": "x", "nested": [{"api_key": "k"}]}) == {"db_password": "<redacted>",
                                                                         "nested": [{"api_key": "<redacted>"}]}
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in redact_text("token hf_abcdefghijklmnopqrstuvwxyz here")


def test_compare_curves_exact_and_first_divergence():
    a = {"0": [[1, 2.0], [2, 1.5]], "1": [[1, 2.0], [2, 1.4]]}
    assert compare_curves(a, a)["max_abs_loss_diff"] == 0.0
    b = {"0": [[1, 2.0], [2, 1.5]], "1": [[1, 2.0], [2, 1.5]]}
    r = compare_curves(a, b)
    assert r["first_divergence"]["rank"] == 1 and r["first_divergence"]["step"] == 2
    assert r["max_abs_loss_diff"] == pytest.approx(0.1)
    c = {"0": [[1, 2.0]], "1": [[1, 2.0]]}
    assert compare_curves(a, c)["same_steps"] is False


def test_first_divergence_is_the_earliest_step_over_all_ranks():
    a = {"0": [[1, 1.0], [2, 1.0], [3, 1.0]], "1": [[1, 1.0], [2, 1.0], [3, 1.0]]}
    b = {"0": [[1, 1.0], [2, 1.0], [3, 9.0]], "1": [[1, 1.0], [2, 7.0], [3, 1.0]]}
    assert compare_curves(a, b)["first_divergence"]["step"] == 2


def test_diff_and_summary_on_all_statuses():
    ok, failed, cancelled = _record("a"), _record("b", "failed", 2.5), _record("c", "cancelled")
    failed["failure"] = {"rank": 1, "cause": "signal", "message": "killed by signal 9 (SIGKILL)", "last_step": 3}
    rows = dict((k, (x, y)) for k, x, y in diff_records(ok, failed))
    assert rows["status"] == ("succeeded", "failed")
    assert rows["metrics.final_loss"] == (1.5, 2.5)
    assert rows["failure.cause"] == (None, "signal")
    assert "metrics.steps" not in rows  # equal values are not shown
    assert [summary_row(r)["status"] for r in (ok, failed, cancelled)] == ["succeeded", "failed", "cancelled"]
