"""Fixtures for the TUI tests: fixed backends, a synthetic run folder, synthetic records, and Pilot helpers."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.record import records as records_mod
from runner.spec import RunSpec, load_spec
from tui.backends import Backends

REPO = Path(__file__).resolve().parents[2]
T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC: fixed times make fixed pictures
RUN_ID = "20260101-000000-demo-0a1b2c"
RUN_ID_B = "20260101-001500-demo-3d4e5f"
DASH_ID = "20260101-003000-h200-7a8b9c"  # the synthetic live run the dashboard shows
STEP_S = 0.5
SYNTH_STEPS = 40
CLOCK_T = T0 + 10 + SYNTH_STEPS * STEP_S + 2.0  # two seconds after the last step
CAPACITY_GIB = {"H100-80GB": 79.65, "H200": 140.4, "B200": 179.06, "B300": 268.59, "A100-80GB": 80.0}


# -- fixed backends ----------------------------------------------------------------------------------


def fake_estimate(spec: RunSpec) -> dict[str, Any]:
    """A deterministic stand-in with every field of the real `Estimate` (test_fake_backends holds it to them):
    memory grows with tokens per block."""
    device = spec.hardware.device
    gpu = spec.hardware.gpu if device == "cuda" else "cpu"
    capacity = CAPACITY_GIB.get(gpu, 23.4)
    # A CPU rank's own memory is its process; a GPU's, the CUDA context and NCCL (the estimator's part names).
    parts = {"params": 3.2, "grads": 3.2, "optimizer": 12.8, "activations": round(spec.train.seq_len / 1024 * 2.5, 2),
             "process" if device == "cpu" else "cuda_context_nccl": 1.5}
    total = round(sum(parts.values()), 2)
    headroom = round(capacity - total, 2)
    verdict = "fits" if headroom > 0.1 * capacity else "tight" if headroom > 0 else "does not fit"
    steps = spec.train.max_steps or 1000
    t = spec.train
    levers = fake_levers(spec)
    tokens = t.seq_len * levers["micro_batch"] * levers["grad_accum"] * spec.world_size
    return {"fits": headroom > 0, "verdict": verdict, "headroom_gib": headroom, "per_gpu_gib": total,
            "per_gpu_allocated_gib": round(total - 1.5, 2), "per_gpu_reserved_gib": total,
            "gpu_memory_gib": capacity, "gpu": gpu, "world_size": spec.world_size, "breakdown": parts,
            "step_s": 0.75, "steps": steps, "total_s": 0.75 * steps, "tokens_per_step": tokens,
            "flops_per_step": 6.0 * 230_080 * tokens, "hfu_assumed": 0.4, "approximate": device == "cpu",
            "approximate_reason": "",
            "suggestion": None if headroom > 0 else "turn on train.activation_checkpointing or halve train.seq_len",
            "arch": fake_arch(spec), "peak_phase": "backward_start", "per_gpu_basis": "", "device": device,
            "engine": spec.engine, "method": spec.method.kind, "seq_len": t.seq_len,
            "attn_implementation": spec.model.attn_implementation, "loss_impl": levers["loss_impl"],
            "activation_checkpointing": levers["activation_checkpointing"], "params_trainable": 230_080,
            "arch_source": "path", "doc_len": 49, "dataset_tokens": None, "hfu_source": "", "phases_gib": {},
            "host_offload_gib": 0.0, "host_memory_gib": None,
            "peak_mem_gib": {"rss": total} if device == "cpu" else {"allocated": total - 1.5, "reserved": total},
            "approximate_scope": "", "dataset_format": None, "packing": None,
            "levers": levers, "levers_tuned": [f for f in levers if t.model_dump()[f] == "auto"],
            "levers_reason": "no recompute, chunked loss: the fastest that leaves 20.0 GiB free", "runners_up": [],
            "planner_headroom_gib": round(0.05 * capacity, 2)}


def fake_levers(spec: RunSpec) -> dict[str, Any]:
    """The levers as the planner would report them, the auto ones at their plain values (runner.engines.PLAIN)."""
    from runner.engines import SPEED_LEVERS, plain_levers

    t = plain_levers(spec.train.model_dump())
    out = {f: t[f] for f in SPEED_LEVERS}
    out["recompute_layers"] = 0 if not out["activation_checkpointing"] else (out["recompute_layers"] or 4)
    return out


def fake_sweep(spec: RunSpec, axes: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    import itertools

    rows = []
    for combo in itertools.product(*(v for _, v in axes)):
        values = dict(zip((k for k, _ in axes), combo))
        row_spec = load_spec(spec.to_dict(), [f"{k}={v}" for k, v in values.items()])
        rows.append({**values, "swept": values, **fake_estimate(row_spec)})  # a real sweep row's layout
    return rows


def fake_arch(spec: RunSpec) -> dict[str, Any]:
    return {"model_type": "qwen3", "params_total": 230_080, "params_active": 230_080, "layers": 4, "vocab": 512,
            "hidden": 64, "layer_types": {"full_attention": 4}, "source": "path"}


def fixed_backends() -> Backends:
    return Backends(estimate_fn=fake_estimate, sweep_fn=fake_sweep, load_arch_fn=fake_arch,
                    detect_gpus_fn=lambda: [], gpu_types_list=("H100-80GB", "H200", "B200", "B300", "A100-80GB"),
                    preflight_fn=lambda spec: [])


@pytest.fixture
def backends() -> Backends:
    return fixed_backends()


# -- a synthetic run folder and records ---------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def synthetic_loss(rank: int, step: int) -> float:
    return 6.2 * math.exp(-step / 18) + 0.9 + 0.08 * math.sin(step * (1.3 + 0.4 * rank)) + 0.12 * rank


def write_synthetic_run(base: Path, run_id: str = DASH_ID, steps: int = SYNTH_STEPS, world: int = 2,
                        gpus: int = 2) -> Path:
    """runs/<id>/ with the events two ranks and one node sampler would write, and rank logs."""
    run_dir = base / "runs" / run_id
    for r in range(world):
        rows: list[dict[str, Any]] = [{"event": "start", "t": T0 + 10, "rank": r, "local_rank": r, "node_rank": 0,
                                       "world_size": world, "pid": 4000 + r, "host": "gpu-node-0", "max_steps": 100}]
        for s in range(1, steps + 1 - (3 if r == 1 else 0)):  # rank 1 trails by three steps
            rows.append({"t": T0 + 10 + s * STEP_S, "rank": r, "step": s, "loss": synthetic_loss(r, s),
                         "lr": 3e-4, "grad_norm": 1.1, "tokens": 8192, "step_s": STEP_S, "mem_gib": 38.25 + r})
        _write_jsonl(run_dir / "events" / f"rank{r}.jsonl", rows)
    sample = {"t": T0 + 10 + steps * STEP_S, "node": 0, "host": "gpu-node-0", "cpu_pct": 31.0,
              "ram_used_gib": 212.5, "ram_total_gib": 2015.6, "rank_rss_gib": {"0": 6.1, "1": 6.0},
              "gpus": [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "util_pct": 97.0 - 3 * i,
                        "mem_used_gib": 41.5 + i, "mem_total_gib": 140.4, "temp_c": 61 + i, "power_w": 612.0 - 9 * i,
                        "sm_clock_mhz": 1980, "ranks": [i] if i < world else []} for i in range(gpus)]}
    _write_jsonl(run_dir / "events" / "node0.jsonl", [sample])
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs" / "rank0.log").write_text(
        "[rank 0] loading sft-tui/tiny-qwen3 (4 layers)\n[rank 0] fully_shard: 4 decoder layers + root\n"
        "[rank 0] data: 2,500 conversations, packing into 512-token blocks\n[rank 0] training\n")
    (run_dir / "logs" / "rank1.log").write_text("[rank 1] training\n")
    running = synthetic_record(run_id, status="running", created="2026-01-01T00:30:00+00:00")
    running.update(metrics=None, finished=None, estimate={"per_gpu_gib": 44.8, "gpu_memory_gib": 140.4,
                                                          "verdict": "fits", "approximate": False})
    records_mod.save(base / "records" / f"{run_id}.json", running)
    return run_dir


def synthetic_record(run_id: str, status: str = "succeeded", lr: float = 3e-3, final_loss: float = 1.2345,
                     replay_of: str | None = None, created: str = "2026-01-01T00:00:00+00:00") -> dict[str, Any]:
    # A literal spec, not RunSpec's dump: the record's lock (shown on screen) must not move when fields are added.
    spec = {"name": "demo", "description": "", "engine": "native",
            "model": {"id": "sft-tui/tiny-qwen3", "path": "embedded:model", "revision": None, "dtype": "float32"},
            "dataset": {"id": "sft-tui/tiny-chat", "path": "embedded:data/chat.jsonl", "split": "train"},
            "method": {"kind": "full"}, "hardware": {"device": "cpu", "gpu": "auto", "nproc_per_node": 2, "nodes": 1},
            "train": {"seq_len": 512, "micro_batch": 1, "grad_accum": 1, "lr": lr, "max_steps": 40, "seed": 0},
            "output": {"save": "none"}}
    curve = {str(r): [[s, round(synthetic_loss(r, s), 6)] for s in range(1, 41)] for r in range(2)}
    rec = {
        "schema": records_mod.SCHEMA, "id": run_id, "created": created, "finished": created.replace("00:00+", "00:42+"),
        "status": status, "spec": spec,
        "pins": {"python": "3.11.7", "torch": "2.13.0", "cuda": None, "nccl": None,
                 "packages": {"torch": "2.13.0", "transformers": "5.24.0", "textual": "8.2.8"},
                 "git": {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
                 "model": {"id": "sft-tui/tiny-qwen3", "content_sha256": "ab" * 32},
                 "dataset": {"id": "sft-tui/tiny-chat", "content_sha256": "cd" * 32},
                 "tokenizer_sha256": "ef" * 32, "gpus": {"names": [], "driver": None}},
        "launch": {"command": "python -m torch.distributed.run --nproc-per-node=2 --max-restarts=0 --standalone "
                              f"-m runner.train --spec runs/{run_id}/spec.json", "world_size": 2, "nodes": 1},
        "estimate": {"per_gpu_gib": 0.32, "approximate": True, "verdict": "fits"},
        "metrics": {"steps": 40, "loss_curve": curve, "first_loss": curve["0"][0][1], "final_loss": final_loss,
                    "final_global_loss": final_loss - 0.01, "tokens": 40960, "train_s": 12.5, "wall_s": 26.0,
                    "tokens_per_s": 3276.8, "mfu": None,
                    "per_rank": {"0": {"last_step": 40, "peak_mem_gib": 0.548}, "1": {"last_step": 40,
                                                                                      "peak_mem_gib": 0.55}}},
        "failure": None, "run_dir": f"runs/{run_id}",
    }
    if status == "failed":
        rec["failure"] = {"rank": 1, "cause": "signal", "message": "killed by signal 9 (SIGKILL)", "last_step": 17,
                          "log": f"runs/{run_id}/logs/rank1.log"}
    if replay_of:
        rec["replay_of"] = replay_of
    return rec


def write_synthetic_records(base: Path) -> Path:
    recs_dir = base / "records"
    records_mod.save(recs_dir / f"{RUN_ID}.json", synthetic_record(RUN_ID))
    records_mod.save(recs_dir / f"{RUN_ID_B}.json",
                     synthetic_record(RUN_ID_B, status="failed", lr=1e-2, final_loss=2.5,
                                      created="2026-01-01T00:15:00+00:00"))
    return recs_dir


@pytest.fixture
def synth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding runs/<RUN_ID> and records/ with two records; the test runs inside it, so paths
    show relative and the pictures do not depend on the temporary folder's name."""
    write_synthetic_run(tmp_path)
    write_synthetic_records(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fixed_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun commands show `python`, not this machine's interpreter path."""
    import sys

    monkeypatch.setattr(sys, "executable", "python")


# -- Pilot helpers ------------------------------------------------------------------------------------


POLL_S = 0.05  # how often a condition is looked at again while the app runs; never a wait for something to happen


async def wait_for(pilot: Any, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Let the app run until `predicate()` holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        await pilot.pause()  # the messages queued for the app and the screen are handled, then the app is idle
        if predicate():
            # Let a screen that just appeared finish mounting (Header sets its title in a task of its own).
            await pilot.pause()
            return
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(POLL_S)  # workers and timers run meanwhile


def quiet(app: Any) -> bool:
    """Nothing pending could still change what the screen shows: its panes are mounted, no debounce timer is armed,
    no worker is running, and on the Plan or Launch step the plan, sweep and preflight are in."""
    screen = app.screen
    if getattr(screen, "_debounce", None) or not getattr(screen, "ready", True):
        return False
    if getattr(screen, "step", None) in ("plan", "launch") and not screen.plan_complete:
        return False
    return all(worker.is_finished for worker in app.workers)


async def settle(pilot: Any, timeout_s: float = 60) -> None:
    """Wait until the app is quiet three looks in a row (a worker's result can schedule more work): what an action
    could have caused has happened by then, so a check that something did not happen means it."""
    deadline = time.monotonic() + timeout_s
    looks = 0
    while looks < 3:
        await pilot.pause()
        looks = looks + 1 if quiet(pilot.app) else 0
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for the app to settle"
        if not looks:
            await asyncio.sleep(POLL_S)


def record_notices(app: Any) -> list[tuple[str, str]]:
    """Every notification the app shows from now on, as (title, message): kept after its toast times out."""
    seen: list[tuple[str, str]] = []
    notify = app.notify

    def recorded(message: str, *, title: str = "", **kw: Any) -> Any:
        seen.append((title, message))
        return notify(message, title=title, **kw)

    app.notify = recorded
    return seen


async def ready(pilot: Any) -> Any:
    """The wizard screen once all its panes are mounted (they follow the first frame)."""
    await wait_for(pilot, lambda: getattr(pilot.app.screen, "ready", False), 10, "the wizard's panes")
    return pilot.app.screen


def run_async(coro: Any) -> Any:
    return asyncio.run(coro)
