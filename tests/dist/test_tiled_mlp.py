"""Tiled MLP through real torchrun (2 CPU ranks, gloo, FSDP2): the embedded recipe's loss curve and gradient norms
with train.tiled_mlp=true (and activation checkpointing) are the untiled ones, to fp32 rounding."""

from __future__ import annotations

import pytest

from runner.events.lines import read_events
from runner.launch import run as run_mod
from runner.spec import load_spec, resolve

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

STEPS = 3


def _curve(tmp_path, *overrides: str) -> tuple[list[dict], dict]:
    spec = resolve(load_spec("tiny-cpu", [f"train.max_steps={STEPS}", *overrides]))
    active = run_mod.start(spec, tmp_path / "runs", tmp_path / "records")
    code = active.wait()
    active.finish(code)
    run_dir = active.paths.run_dir
    assert active.record["status"] == "succeeded", (run_dir / "logs" / "rank0.log").read_text()[-3000:]
    events = list(read_events(run_dir / "events" / "rank0.jsonl"))
    begin = next(e for e in events if e.get("event") == "train_begin")
    return [e for e in events if "event" not in e], begin


def test_tiled_mlp_trains_the_untiled_curve_under_fsdp2_with_checkpointing(tmp_path):
    plain, begin_plain = _curve(tmp_path / "plain")
    tiled, begin_tiled = _curve(tmp_path / "tiled", "train.tiled_mlp=true", "train.activation_checkpointing=true")
    assert begin_plain["tiled_mlp"] == "off (auto): tiles run in the native engine's eager layers on a GPU"
    assert begin_tiled["tiled_mlp"].startswith("on (train.tiled_mlp=true): tiles of 64 tokens")
    assert begin_tiled["fsdp"] == "fsdp2 over 2 ranks"
    assert [s["step"] for s in tiled] == [s["step"] for s in plain] == list(range(1, STEPS + 1))
    for a, b in zip(tiled, plain, strict=True):
        assert abs(a["global_loss"] - b["global_loss"]) <= 1e-5 * b["global_loss"], (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * b["grad_norm"], (a, b)
    assert tiled[-1]["global_loss"] != tiled[0]["global_loss"]  # it trained: the curve is compared, not one point
