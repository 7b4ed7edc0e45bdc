"""Real 2-rank runs on datasets in the peers' formats, trained with no conversion, and on blocks where one rank has
no target token: every event line is strict JSON, such a rank logs a null loss, the record keeps the global one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.record import records
from tests.conftest import dir_args, last_json, run_cli

pytestmark = pytest.mark.dist

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
STEPS = 3


def _strict(line: str) -> dict:
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def _events(rec: dict, rank: int) -> list[dict]:
    return [_strict(x) for x in (Path(rec["run_dir"]) / "events" / f"rank{rank}.jsonl").read_text().splitlines()]


def _run(dirs: dict, capsys, *sets: str) -> dict:
    args = ["run", "tiny-cpu", "--set", f"train.max_steps={STEPS}", "--set", "train.seq_len=128",
            "--set", "train.warmup_steps=0"]
    for s in sets:
        args += ["--set", s]
    code, out, _ = run_cli([*args, "--json", "--plain", *dir_args(dirs)], capsys)
    assert code == 0, out
    return records.load(Path(last_json(out)["record"]))


# The tool-calling rows render their tool definitions into the prompt (310+ tokens): preflight refuses a block too
# short to hold a prompt and its first reply token, so that format gets blocks that do.
@pytest.mark.parametrize(("engine", "name", "format", "seq_len"), [
    ("native", "alpaca_en_demo.json", "alpaca", 128),
    ("trl", "glaive_toolcall_en_demo.json", "sharegpt", 512),
])
def test_peer_format_trains_headless(engine, name, format, seq_len, dirs, capsys):
    rec = _run(dirs, capsys, f"engine={engine}", f"dataset.path={DATA / name}", f"train.seq_len={seq_len}")
    assert rec["status"] == "succeeded" and rec["metrics"]["steps"] == STEPS
    assert rec["pins"]["dataset"]["format"]["format"] == format
    for r in (0, 1):
        steps = [e for e in _events(rec, r) if "event" not in e]
        assert [e["step"] for e in steps] == [1, 2, 3] and all(e["loss"] is not None for e in steps)


@pytest.mark.parametrize("engine", ["native", "trl"])
def test_a_rank_without_targets_logs_null_and_the_record_keeps_the_global_loss(engine, tmp_path, dirs, capsys):
    """Rows alternate between ranks (one file, split by row): rank 0 gets prompts longer than a block, so its first
    block holds no target token while rank 1's does."""
    long_prompt = " ".join(f"word{i}" for i in range(120))
    rows = []
    for i in range(16):
        user = long_prompt if i % 2 == 0 else f"Say {i}."
        rows.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": f"{i}."}]})
    data = tmp_path / "long_prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Wrapped packing keeps the stream order this construction relies on (bfd sorts a buffer longest first).
    rec = _run(dirs, capsys, f"engine={engine}", f"dataset.path={data}", "train.max_steps=1",
               "train.packing_strategy=wrapped")
    first = [e for e in _events(rec, 0) if "event" not in e][0]
    assert first["target_tokens"] == 0 and first["loss"] is None and first["global_loss"] is not None
    other = [e for e in _events(rec, 1) if "event" not in e][0]
    assert other["target_tokens"] > 0 and other["loss"] == pytest.approx(first["global_loss"])
    m = rec["metrics"]
    assert m["final_loss"] == m["final_global_loss"] == first["global_loss"]


def test_blocks_no_rank_can_train_on_are_skipped_counted_and_said(tmp_path, dirs, capsys):
    """The first rows' prompts are longer than a block, on both ranks (each takes its share of the rows): their
    first blocks hold only prompt, so the native engine takes no step on them; the record counts them apart and
    counts trained tokens only. (Each share ends on a short row: preflight refuses blocks that none of the rows it
    samples fits.)"""
    long_prompt = " ".join(f"word{i}" for i in range(120))
    rows = [{"messages": [{"role": "user", "content": f"{i} {long_prompt}" if i % 8 != 7 else f"Say {i}."},
                          {"role": "assistant", "content": f"{i}."}]} for i in range(16)]
    data = tmp_path / "long_prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = _run(dirs, capsys, f"dataset.path={data}", "train.max_steps=2", "train.packing_strategy=wrapped")
    packing, m = rec["metrics"]["packing"], rec["metrics"]
    skipped = [e for r in (0, 1) for e in _events(rec, r) if e.get("event") == "skipped"]
    assert skipped and all(e["reason"] == "no target token on any rank" for e in skipped)
    assert packing["skipped_no_target_blocks"] == sum(e["blocks"] for e in skipped) > 0
    assert packing["skipped_no_target_tokens"] == sum(e["tokens"] for e in skipped) > 0
    assert "not trained: no rank's blocks of that step held a target token" in packing["skipped"]
    # What trained: the steps' blocks, their tokens the record's tokens.
    t = rec["spec"]["train"]
    assert packing["real_tokens"] == m["tokens"] and packing["blocks"] == 2 * t["grad_accum"] * t["micro_batch"] * 2
    log = (Path(rec["run_dir"]) / "logs" / "rank0.log").read_text()
    assert "skipped" in log and "no rank's blocks held a target token" in log
