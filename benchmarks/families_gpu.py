"""The family matrix on one machine: every decoder family of runner.facts.families.MATRIX × engine × block length,
a few steps each, through the engines' own `train` functions; writes families-<machine>.json and .md into --out.

    python benchmarks/families_gpu.py --out benchmarks            # one H200: 14 families × 2 engines × 8k, 32k
    python benchmarks/families_gpu.py --out /tmp/fam --device cpu --quick --nproc 2   # CPU smoke, tiny widths

Each cell is a RunSpec (random init from a config-only folder built from transformers' config classes by
tests/families.py, LoRA on the family's attention and MLP projections and expert tensors). Preflight runs first
(runner.gate.preflight, as `runner run` does): a refused cell is a row with its reason. The cells that pass all train
in ONE torchrun launch whose ranks loop over them, each cell as runner.train.__main__ runs a rank: determinism
switches, the engine's `train(spec, rt, events, run_dir)`, its end or error event (one launch per cell would
cost 10–20 s of startup each). Status: trained | refused-at-preflight | failed | not-run (past --budget-s);
tokens/s over the steps after the first (which compiles).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.facts.families import MATRIX  # noqa: E402

ENGINES = ("native", "trl")
GPU_SEQ_LENS = (8192, 32768)
QUICK_SEQ_LENS = (256,)


# ---------------------------------------------------------------------------------------------
# Cells: specs, preflight


def lora_settings(config: Any) -> dict[str, Any]:
    """LoRA on the family's attention and MLP projections (runner.facts.families) and, for MoE, its expert tensors."""
    from runner.facts.families import family_of, lora_targets

    fam = family_of(config)
    targets = lora_targets(config, "all")
    return {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": targets,
            "target_parameters": list(fam.expert_tensors)}


def cell_spec(family: str, engine: str, seq_len: int, folder: Path, data: Path, args: argparse.Namespace) -> Any:
    from runner.engines import with_plain_levers
    from runner.decide.rules import chunked_supported
    from runner.spec import load_spec, resolve
    from tests.families import family_config

    config = family_config(family)
    data_spec = {
        "name": f"families-{family}-{engine}-{seq_len}",
        "model": {"id": f"families/{family}", "path": str(folder), "init": "random"},
        "dataset": {"id": "families/chat", "path": str(data)},
        "engine": engine,
        "method": {"kind": "lora", "lora": lora_settings(config)} if args.method == "lora" else {"kind": "full"},
        "hardware": {"device": args.device, "nproc_per_node": args.nproc},
        "train": {"seq_len": seq_len, "micro_batch": 1, "grad_accum": 1, "lr": args.lr, "schedule": "constant",
                  "warmup_steps": 0, "max_steps": args.steps, "log_every": 1, "seed": 0,
                  # The plain loss is chunked, except for a model that transforms its logits (Gemma-2's softcap),
                  # where only the full loss is exact (what the loss's former `auto` chose).
                  **({"loss_impl": "full"} if chunked_supported(config.to_dict()) else {})},
        "output": {"save": "none"},
    }
    return with_plain_levers(resolve(load_spec(data_spec)))  # the matrix runs the plain levers, as it always did


def _problem_text(problems: list[Any]) -> str:
    return "; ".join(f"{p.field}: {p.message} (fix: {p.fix})" if getattr(p, "fix", None) else
                     f"{p.field}: {p.message}" for p in problems)


def plan_cells(args: argparse.Namespace, work: Path, data: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(cells to train, rows refused at preflight)."""
    from runner.decide import decide_run
    from runner.events.paths import RunPaths
    from runner.gate.preflight import preflight_problems
    from tests.families import GPU, TINY, write_model_folder

    width = TINY if args.quick else GPU
    cells, refused = [], []
    for family in args.families:
        folder = write_model_folder(family, work / "models" / family, width)
        for engine in args.engines:
            for seq_len in args.seq_lens:
                row = {"family": family, "engine": engine, "seq_len": seq_len}
                spec = cell_spec(family, engine, seq_len, folder, data, args)
                row["model_type"] = json.loads((folder / "config.json").read_text())["model_type"]
                problems = preflight_problems(spec)
                if problems:
                    refused.append({**row, "status": "refused-at-preflight", "attn": None,
                                    "reason": _problem_text(problems), "tokens_per_s": None})
                    continue
                run_dir = work / "runs" / f"{family}-{engine}-{seq_len}"
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / "spec.json").write_text(spec.model_dump_json(indent=1))
                decide_run(spec, probe=True).write(RunPaths(run_dir).decisions)  # as a launch decides, once
                cells.append({**row, "run_dir": str(run_dir)})
    return cells, refused


# ---------------------------------------------------------------------------------------------
# The worker: one process per rank, every cell in turn


def _cleanup(device: str) -> None:
    # The native engine freezes every live object out of the collector after two steps (GC_FREEZE_AFTER_STEPS):
    # unfrozen, the finished cell's model and optimizer can be collected before the next cell builds its own.
    gc.unfreeze()
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_cell(cell: dict[str, Any], rt: Any) -> None:
    """One cell on this rank, as runner.train.__main__ runs a rank: its events file gets start, the engine's
    events, and end or error."""
    from runner.decide import Decisions
    from runner.events.lines import EventWriter
    from runner.events.failure import classify_exception
    from runner.events.paths import RunPaths
    from runner.spec import RunSpec
    from runner.train import runtime

    run_dir = Path(cell["run_dir"])
    spec = RunSpec.model_validate(json.loads((run_dir / "spec.json").read_text()))
    decisions = Decisions.read(RunPaths(run_dir).decisions)
    events = EventWriter(run_dir / "events" / f"rank{rt.rank}.jsonl", rt.rank)
    events.event("start", world_size=rt.world_size, pid=os.getpid(), max_steps=spec.train.max_steps)
    print(f"== {cell['family']} {cell['engine']} {cell['seq_len']}", flush=True)
    try:
        runtime.set_determinism(spec.train.seed, spec.train.deterministic, rt.device)
        if spec.engine == "trl":
            from runner.train.trl_engine import train
        else:
            from runner.train.native import train
        summary = train(spec, rt, events, decisions, run_dir=run_dir)
        events.event("end", step=summary["steps"], **summary)
    except Exception as e:  # noqa: BLE001 - a failed cell is a row of the table, the next cell still runs
        traceback.print_exc()
        cause, message = classify_exception(e)
        events.event("error", step=0, cause=cause, message=message)
    finally:
        events.close()
        _cleanup(rt.device)


def worker(cells_file: Path) -> int:
    import torch

    from runner.train import runtime

    plan = json.loads(cells_file.read_text())
    rt = runtime.init(plan["device"])
    # Many models in one process: flex attention recompiles for each new mask and shape; let it.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    for cell in plan["cells"]:
        # Every rank skips together once the time budget is spent (one would otherwise wait in a collective).
        late = torch.tensor([float(time.time() > plan["deadline"])], device=rt.device)
        import torch.distributed as dist

        dist.all_reduce(late, op=dist.ReduceOp.MAX)
        if late.item():
            skipped = Path(cell["run_dir"]) / "skipped"
            skipped.write_text(f"time budget of {plan['budget_s']} s spent before this cell\n")
            continue
        run_cell(cell, rt)
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


def launch(cells: list[dict[str, Any]], args: argparse.Namespace, work: Path) -> None:
    """One torchrun launch whose ranks train every cell; rank logs under work/logs."""
    plan = work / "cells.json"
    plan.write_text(json.dumps({"device": args.device, "cells": cells, "budget_s": args.budget_s,
                                "deadline": args.start + args.budget_s}, indent=1))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           "--log-dir", str(work / "logs"), "--redirects", "3", "--tee", "1", str(Path(__file__).resolve()),
           "--worker", str(plan)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    subprocess.run(cmd, env=env, cwd=str(REPO), check=False)


# ---------------------------------------------------------------------------------------------
# Rows and report


def _read(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    from runner.events.lines import read_events

    return read_events(run_dir / "events" / f"rank{rank}.jsonl")


def cell_row(cell: dict[str, Any], nproc: int) -> dict[str, Any]:
    """The cell's row from its ranks' events: attention path, status, reason, tokens/s after the first step."""
    run_dir = Path(cell["run_dir"])
    row = {k: cell[k] for k in ("family", "model_type", "engine", "seq_len")}
    if (run_dir / "skipped").exists():
        return {**row, "status": "not-run", "attn": None, "tokens_per_s": None,
                "reason": (run_dir / "skipped").read_text().strip()}
    per_rank = [_read(run_dir, r) for r in range(nproc)]
    begin = next((e for e in per_rank[0] if e.get("event") == "train_begin"), {})
    errors = [e for evs in per_rank for e in evs if e.get("event") == "error"]
    ends = [e for evs in per_rank for e in evs if e.get("event") == "end"]
    steps = [[e for e in evs if "event" not in e] for evs in per_rank]
    row["attn"] = begin.get("attn")
    row["global_loss"] = [e.get("global_loss") for e in steps[0]]
    later = [[e for e in s if e["step"] > 1] or s for s in steps]
    tokens = sum(e["tokens"] for s in later for e in s)
    seconds = max((sum(e["step_s"] for e in s) for s in later), default=0.0)
    row["tokens_per_s"] = round(tokens / seconds) if seconds else None
    row["peak_mem_gib"] = max((e.get("mem_gib", 0.0) for s in steps for e in s), default=None)
    stamps = [e["t"] for e in per_rank[0] if "t" in e]
    row["cell_s"] = round(stamps[-1] - stamps[0], 1) if stamps else None  # model build, data, steps
    if errors:
        row.update(status="failed", reason=f"{errors[0].get('cause')}: {errors[0].get('message')}")
    elif len(ends) == nproc and all(e.get("steps", 0) > 0 for e in ends):
        row.update(status="trained", reason="")
    else:
        row.update(status="failed", reason="no end event (the rank died: see logs/)")
    return row


def machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores"
    except Exception:  # noqa: BLE001
        pass
    return f"CPU only ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def write_report(rows: list[dict[str, Any]], args: argparse.Namespace, wall_s: float) -> tuple[Path, Path]:
    from runner.versions import package_versions

    stem = "families-h200" if args.device == "cuda" else "families-cpu"
    versions = package_versions(("torch", "transformers", "trl", "peft", "accelerate", "flash-attn",
                                 "flash-linear-attention", "causal-conv1d", "liger-kernel"))
    command = "python benchmarks/families_gpu.py " + " ".join(sys.argv[1:])
    meta = {"command": command, "machine": machine(), "versions": versions, "python": platform.python_version(),
            "wall_s": round(wall_s, 1), "steps": args.steps, "method": args.method,
            "width": "tests/families.py " + ("TINY" if args.quick else "GPU")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    json_path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# Family matrix ({meta['machine']})", "",
             f"`{command}` — {args.steps} steps per cell, LoRA on attention, MLP and expert tensors"
             if args.method == "lora" else f"`{command}` — {args.steps} steps per cell, full fine-tune",
             f"({meta['width']} width, random init), {len(rows)} cells in {wall_s / 60:.1f} min.", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v), "",
             "| family | model_type | engine | tokens/block | attention | status | tokens/s | reason |",
             "| --- | --- | --- | ---: | --- | --- | ---: | --- |"]
    for r in rows:
        tps = f"{r['tokens_per_s']:,}" if r.get("tokens_per_s") else ""
        reason = (r.get("reason") or "").replace("|", "/").replace("\n", " ")[:300]
        lines.append(f"| {r['family']} | {r['model_type']} | {r['engine']} | {r['seq_len']:,} | {r.get('attn') or ''} "
                     f"| {r['status']} | {tps} | {reason} |")
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="where families-<machine>.json/.md go")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny widths and 256-token blocks (CPU smoke test)")
    ap.add_argument("--families", default=",".join(MATRIX), help="comma-separated model_types (default: the matrix)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--seq-lens", default=None, help="tokens per block, comma-separated (default 8192,32768; "
                                                     "--quick: 256)")
    ap.add_argument("--steps", type=int, default=None, help="steps per cell (default 4; --quick: 2)")
    ap.add_argument("--nproc", type=int, default=1, help="ranks (default 1)")
    ap.add_argument("--method", choices=("lora", "full"), default="lora")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no cell after this many seconds from the script's start (default 450 on GPU: the "
                         "whole matrix within ~8 minutes; none with --quick); later cells are rows 'not-run'")
    ap.add_argument("--work", type=Path, default=None,
                    help="model folders, run dirs, rank logs (default: a new folder under the system's temp dir)")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.out is None:
        ap.error("--out is required")
    args.families = [f for f in args.families.split(",") if f]
    args.engines = [e for e in args.engines.split(",") if e]
    args.seq_lens = [int(x) for x in args.seq_lens.split(",")] if args.seq_lens else \
        list(QUICK_SEQ_LENS if args.quick else GPU_SEQ_LENS)
    args.steps = args.steps or (2 if args.quick else 4)
    args.lr = args.lr or (1e-2 if args.quick else 1e-4)
    args.budget_s = args.budget_s or (10**9 if args.quick else 450.0)
    args.start = time.time()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="families-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder (models, runs, rank logs): {work}", flush=True)
    data = REPO / "recipes" / "embedded" / "data" / "chat.jsonl"
    if not args.quick:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from make_long_chat import make

        data = work / "long-chat.jsonl"
        if not data.exists():
            make(data, rows=48, min_tokens=65, max_tokens=11_775)  # ~285k tokens: 8 blocks at 32k
    cells, refused = plan_cells(args, work, data)
    if cells:
        launch(cells, args, work)
    by_key = {(r["family"], r["engine"], r["seq_len"]): r for r in refused}
    for cell in cells:
        by_key[(cell["family"], cell["engine"], cell["seq_len"])] = cell_row(cell, args.nproc)
    rows = [by_key[(f, e, s)] for f in args.families for e in args.engines for s in args.seq_lens]
    json_path, md_path = write_report(rows, args, time.perf_counter() - start)
    for r in rows:
        print(f"{r['family']:12} {r['engine']:6} {r['seq_len']:6} {r.get('attn') or '-':16} {r['status']:22} "
              f"{r.get('tokens_per_s') or '':>8} {(r.get('reason') or '')[:120]}")
    print(f"wrote {json_path} and {md_path}")
    return 0 if all(r["status"] in ("trained", "refused-at-preflight") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
