"""Runs the reduced GPT-OSS LoRA recipe through the trl engine for a few steps; writes tokens/s and peak memory as JSON.

On a GPU machine (one H200, offline: the model is initialised from config.json, the data is the embedded chat set):

    python benchmarks/trl_gpu_check.py --out benchmarks/trl_gpu_check_h200.json

Here, on CPU, the same path with the tiny GPT-OSS model on 2 gloo ranks:

    python benchmarks/trl_gpu_check.py --dry-run --out /tmp/trl_dry.json

The run goes through `runner.cli.session.run_headless` (torchrun, events, record) into a scratch folder (`--work`), so
the repository's records/ stays untouched. Throughput counts the steps after `--warmup` (compilation and allocator
warm-up), summed over ranks; MFU uses the 6·N convention with N the parameters a token passes through (attention,
top-k of the experts, router, LM head; not the embedding lookup) against 790 TFLOP/s per GPU, the H200's measured
bf16 matmul ceiling. LoRA skips the frozen weights' gradients, so the real work is nearer 4·N: by this convention
the MFU of a LoRA run overstates the utilisation by up to 1.5x; it is comparable with other rows that use 6·N.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from runner.versions import package_versions  # noqa: E402 - after the path setup above

PEAK_TFLOPS = 790.0  # references.md: an 8192^3 bf16 matmul on the H200
GPU_RECIPE = "gpt-oss-reduced-lora-h200"
DRY_RECIPE = "tiny-gpt-oss-cpu"
VERSIONS = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def active_params(model_dir: Path) -> int:
    """Parameters one token passes through: everything but the input embedding, experts scaled by top-k / experts."""
    from transformers import AutoConfig

    from runner.train.lora import meta_model

    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config()
    experts = getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None) or 1
    top_k = getattr(text, "num_experts_per_tok", None) or 1
    model = meta_model(config)
    emb = model.get_input_embeddings().weight
    total = 0.0
    for name, p in model.named_parameters():
        if p is emb:
            continue
        total += p.numel() * (top_k / experts if ".experts." in name else 1.0)
    return int(total)


def versions() -> dict[str, str | None]:
    return package_versions(VERSIONS)


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()})"


def summarize(record: dict[str, Any], events_dir: Path, warmup: int) -> dict[str, Any]:
    """tokens/s after warm-up (all ranks), step-time spread, peak memory, and what the engine chose."""
    from runner.events.lines import read_events

    world = record["launch"]["world_size"]
    rates, step_times, peaks_alloc, peaks_res, begin, end = [], [], [], [], {}, {}
    tokens_total, slowest_s = 0, 0.0
    for r in range(world):
        evs = read_events(events_dir / f"rank{r}.jsonl")
        steps = [e for e in evs if "event" not in e and e.get("step", 0) > warmup]
        if r == 0:
            begin = next((e for e in evs if e.get("event") == "train_begin"), {})
            end = next((e for e in evs if e.get("event") == "end"), {})
            step_times = [e["step_s"] for e in steps]
        rank_tokens = sum(e["tokens"] for e in steps)
        rank_s = sum(e["step_s"] for e in steps)
        tokens_total += rank_tokens
        slowest_s = max(slowest_s, rank_s)
        if rank_s:
            rates.append(rank_tokens / rank_s)
        peak = next((e.get("peak_mem_gib") for e in evs if e.get("event") == "end"), None) or {}
        peaks_alloc.append(peak.get("allocated", peak.get("rss")))
        peaks_res.append(peak.get("reserved"))
    tokens_per_s = tokens_total / slowest_s if slowest_s else None
    return {
        "steps_measured": len(step_times),
        "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s else None,
        "tokens_per_s_per_rank": [round(x, 1) for x in rates],
        "step_s_median": round(statistics.median(step_times), 4) if step_times else None,
        "step_s_min": round(min(step_times), 4) if step_times else None,
        "step_s_max": round(max(step_times), 4) if step_times else None,
        "peak_alloc_gib": max((x for x in peaks_alloc if x is not None), default=None),
        "peak_reserved_gib": max((x for x in peaks_res if x is not None), default=None),
        "params": begin.get("params"),
        "trainable_params": begin.get("trainable_params"),
        "attn": begin.get("attn"),
        "packing": begin.get("packing"),
        "fsdp": begin.get("fsdp"),
        "fsdp_sharded": end.get("fsdp_sharded"),
        "final_loss": end.get("final_loss"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--recipe", default=None,
                        help=f"recipe to run (default {GPU_RECIPE}; {DRY_RECIPE} with --dry-run)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default 12; 4 with --dry-run)")
    parser.add_argument("--warmup", type=int, default=None, help="first steps left out of throughput (default 3; 1)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="spec override, as for `runner run` (repeatable)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder for runs/ and records/")
    parser.add_argument("--dry-run", action="store_true", help="tiny GPT-OSS on 2 CPU ranks: checks the path here")
    args = parser.parse_args(argv)

    from runner.cli.session import run_headless
    from runner.spec import load_spec, resolve, resolve_embedded

    recipe = args.recipe or (DRY_RECIPE if args.dry_run else GPU_RECIPE)
    steps = args.steps or (4 if args.dry_run else 12)
    warmup = args.warmup if args.warmup is not None else (1 if args.dry_run else 3)
    if warmup >= steps:
        parser.error(f"--warmup must be below --steps, got {warmup} >= {steps}")
    overrides = [f"train.max_steps={steps}", "train.log_every=1", *args.overrides]
    if args.dry_run:
        overrides = ["hardware.device=cpu", "hardware.nproc_per_node=2", *overrides]
    spec = resolve(load_spec(recipe, overrides))
    work = args.work or Path(tempfile.mkdtemp(prefix="trl_gpu_check."))
    runs_dir, records_dir = work / "runs", work / "records"
    code = run_headless(spec, runs_dir, records_dir, plain=True, force=True)

    from runner.record import records

    record_path = sorted(records_dir.glob("*.json"))[-1]
    record = records.load(record_path)
    row = {"engine": "trl", "model": spec.model.id, "recipe": recipe, "seq_len": spec.train.seq_len,
           "micro_batch": spec.train.micro_batch, "grad_accum": spec.train.grad_accum, "world_size": spec.world_size,
           "activation_checkpointing": spec.train.activation_checkpointing, "status": record["status"],
           **summarize(record, Path(record["run_dir"]) / "events", warmup)}
    if record.get("failure"):
        row["failure"] = record["failure"]
    if spec.model.path and row["tokens_per_s"]:
        n_active = active_params(resolve_embedded(spec.model.path))
        row["active_params"] = n_active
        tflops = 6.0 * n_active * row["tokens_per_s"] / 1e12
        row["model_tflops"] = round(tflops, 2)
        row["mfu"] = round(tflops / (PEAK_TFLOPS * spec.world_size), 4) if spec.hardware.device == "cuda" else None
    result = {"command": shlex.join([sys.executable, *sys.argv]), "gpu": device_name(spec.hardware.device),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "versions": versions(),
              "record": str(record_path), "rows": [row]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0 if code == 0 and record["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
