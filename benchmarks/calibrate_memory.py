"""Measured peak GPU memory against the estimator: the native engine's own train() per configuration, one process.

    python benchmarks/calibrate_memory.py --out $OUT/calibration.json        # on the GPU (about 8 minutes)
    python benchmarks/calibrate_memory.py --device cpu --quick --out /tmp/c.json   # the loop itself, on CPU

Each row: estimate(spec) before, then `runner.train.native.train` for a few steps on the embedded chat data with a
random-init model of the named architecture, then torch's peak allocated and reserved. Rows are written as they
finish, so a run cut short still leaves its measurements.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def model_dir(root: Path, name: str, config: dict) -> str:
    """A config-only model folder (random init) with the embedded tokenizer beside it."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    for f in TOKENIZER_FILES:
        shutil.copy(REPO / "recipes" / "embedded" / "tokenizer" / f, d / f)
    return str(d)


def configs(root: Path, quick: bool) -> list[tuple[str, list[str]]]:
    from runner.facts.catalog import catalog_config

    qwen = model_dir(root, "qwen3-0.6b", catalog_config("Qwen/Qwen3-0.6B"))
    oss = json.loads((REPO / "recipes/embedded/gpt-oss-reduced/config.json").read_text())
    oss.update(num_hidden_layers=2, num_local_experts=8, layer_types=["sliding_attention", "full_attention"])
    oss_dir = model_dir(root, "gpt-oss-2l-8e", oss)
    hybrid = "embedded:qwen3.5-hybrid-reduced"
    # One process wrapped in FSDP2, as every committed row was measured (both engines train one GPU's plain module
    # by default now; the estimator's tests rebuild these rows wrapped).
    base = ["model.init=random", "model.dtype=bfloat16", "train.max_steps=3", "train.log_every=1",
            "train.fsdp_one_rank=true"]
    lora_oss = ["method.kind=lora", "method.lora.r=32", "method.lora.alpha=32",
                "method.lora.target_parameters=[mlp.experts.gate_up_proj, mlp.experts.down_proj]",
                "method.lora.rank_pattern={mlp.experts.gate_up_proj: 8, mlp.experts.down_proj: 8}"]
    rows = [
        ("qwen3-0.6b full 2k ckpt", [f"model.path={qwen}", "train.seq_len=2048", "train.activation_checkpointing=true"]),
        ("qwen3-0.6b full 8k ckpt", [f"model.path={qwen}", "train.seq_len=8192", "train.activation_checkpointing=true"]),
        ("qwen3-0.6b full 8k no-ckpt", [f"model.path={qwen}", "train.seq_len=8192"]),
        ("qwen3-0.6b full 32k ckpt", [f"model.path={qwen}", "train.seq_len=32768",
                                      "train.activation_checkpointing=true"]),
        ("qwen3-0.6b lora 8k ckpt", [f"model.path={qwen}", "train.seq_len=8192", "method.kind=lora",
                                     "train.activation_checkpointing=true"]),
        ("qwen3-0.6b lora 32k ckpt", [f"model.path={qwen}", "train.seq_len=32768", "method.kind=lora",
                                      "train.activation_checkpointing=true"]),
        ("gpt-oss-2l lora 2k ckpt", [f"model.path={oss_dir}", "train.seq_len=2048", *lora_oss,
                                     "train.activation_checkpointing=true"]),
        ("gpt-oss-2l lora 8k ckpt", [f"model.path={oss_dir}", "train.seq_len=8192", *lora_oss,
                                     "train.activation_checkpointing=true"]),
        ("gpt-oss-2l lora 2k no-ckpt", [f"model.path={oss_dir}", "train.seq_len=2048", *lora_oss]),
        ("gpt-oss-2l full 2k ckpt", [f"model.path={oss_dir}", "train.seq_len=2048",
                                     "train.activation_checkpointing=true"]),
        ("hybrid full 2k ckpt", [f"model.path={hybrid}", "model.loader=image_text_to_text", "train.seq_len=2048",
                                 "train.activation_checkpointing=true"]),
        ("hybrid full 8k ckpt", [f"model.path={hybrid}", "model.loader=image_text_to_text", "train.seq_len=8192",
                                 "train.activation_checkpointing=true"]),
        ("hybrid lora 8k ckpt", [f"model.path={hybrid}", "model.loader=image_text_to_text", "train.seq_len=8192",
                                 "method.kind=lora", "train.activation_checkpointing=true"]),
        ("hybrid lora 2k ckpt", [f"model.path={hybrid}", "model.loader=image_text_to_text", "train.seq_len=2048",
                                 "method.kind=lora", "train.activation_checkpointing=true"]),
        ("hybrid lora 32k ckpt", [f"model.path={hybrid}", "model.loader=image_text_to_text", "train.seq_len=32768",
                                  "method.kind=lora", "train.activation_checkpointing=true"]),
        # Levers of the native engine (runner/train/loss.py fused loss; train.recompute_layers).
        ("qwen3-0.6b full 8k ckpt fused-loss", [f"model.path={qwen}", "train.seq_len=8192",
                                                "train.activation_checkpointing=true", "train.loss_impl=fused"]),
        ("qwen3-0.6b full 8k recompute 20/28", [f"model.path={qwen}", "train.seq_len=8192",
                                                "train.activation_checkpointing=true", "train.recompute_layers=20"]),
        # The TRL engine (SFTTrainer + accelerate FSDP2, fp32 master weights for a full fine-tune).
        ("trl qwen3-0.6b full 8k ckpt", ["engine=trl", f"model.path={qwen}", "train.seq_len=8192",
                                         "train.activation_checkpointing=true"]),
        ("trl qwen3-0.6b lora 8k ckpt", ["engine=trl", f"model.path={qwen}", "train.seq_len=8192",
                                         "method.kind=lora", "train.activation_checkpointing=true"]),
        ("trl gpt-oss-2l lora 2k ckpt", ["engine=trl", f"model.path={oss_dir}", "train.seq_len=2048", *lora_oss,
                                         "train.activation_checkpointing=true"]),
    ]
    if quick:
        rows = [(n, [o.replace("32768", "512").replace("8192", "256").replace("2048", "128") for o in ov])
                for n, ov in rows]
    return [(n, base + ov) for n, ov in rows]


LIBRARIES = ("/runner/", "/peft/", "/trl/", "/accelerate/", "/liger_kernel/", "/transformers/")


def _where(frames: list[dict]) -> str:
    """The innermost frame in this project or a training library (else the innermost frame at all)."""
    for f in frames:
        name = f.get("filename", "")
        if any(lib in name for lib in LIBRARIES):
            return f"{name.split('site-packages/')[-1].split('/work/')[-1]}:{f.get('line')} {f.get('name')}"
    # No Python frame of ours: an allocation of the autograd engine; name the backward node (or the C++ op).
    for f in frames:
        if "Backward" in f.get("name", "") or "autograd::generated" in f.get("name", ""):
            return f["name"][:120]
    for f in frames:
        if "at::native" in f.get("name", "") or "at::_ops" in f.get("name", ""):
            return f["name"][:120]
    f = frames[0] if frames else {}
    return f"{f.get('filename', '?')}:{f.get('line')} {str(f.get('name'))[:120]}"


def _first_backward(trace: list[dict]) -> int:
    """Index of the first allocation made inside a backward pass (the training phase starts there at the latest)."""
    for i, e in enumerate(trace):
        if e["action"] == "alloc" and any("backward" in str(f.get("name", "")).lower() for f in e.get("frames", [])):
            return i
    return 0


def live_at_peak(snap: dict, top: int = 25, since_backward: bool = False) -> dict:
    """Replay the allocator trace: the largest sum of live blocks and, at that moment, where they came from.
    With `since_backward` the peak is looked for only from the first backward on (what was allocated before and is
    still live counts), so a peak made while the model was being prepared does not hide the training one."""
    trace = snap["device_traces"][0]
    start = _first_backward(trace) if since_backward else 0
    live: dict[int, int] = {}
    cur = peak = 0
    peak_i = -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
            if cur > peak and i >= start:
                peak, peak_i = cur, i
        elif e["action"] in ("free_requested", "free_completed") and e["addr"] in live:
            cur -= live.pop(e["addr"])
    groups: dict[str, int] = {}
    owners: dict[int, tuple[int, str]] = {}
    for e in trace[:peak_i + 1]:
        if e["action"] == "alloc":
            owners[e["addr"]] = (e["size"], _where(e.get("frames", [])))
        elif e["action"] in ("free_requested", "free_completed"):
            owners.pop(e["addr"], None)
    for size, where in owners.values():
        key = f"{where} [{size / 2**20:.0f} MiB blocks]" if size >= 2**26 else where
        groups[key] = groups.get(key, 0) + size
    ranked = sorted(groups.items(), key=lambda kv: -kv[1])[:top]
    # The largest single blocks, by size: a tensor's size names its shape and dtype (an fp32 copy of a bf16
    # weight is twice its size), which the grouped view cannot tell apart.
    largest = sorted(owners.values(), key=lambda sw: -sw[0])[:top]
    return {"traced_peak_gib": round(peak / 2**30, 3), "trace_entries": len(trace), "peak_entry": peak_i,
            "from_entry": start, "groups_gib": {k: round(v / 2**30, 3) for k, v in ranked},
            "largest_blocks_mib": [[round(size / 2**20, 2), where] for size, where in largest]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="comma-separated substrings of the row names to run")
    ap.add_argument("--snapshot", help="comma-separated substrings of row names whose allocations are recorded; "
                                       "the live blocks at the peak, grouped by where they were allocated, go in the row")
    args = ap.parse_args()
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29561"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                 ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    import torch

    from runner.plan import estimate
    from runner.events.lines import EventWriter
    from runner.engines import with_plain_levers
    from runner.spec import load_spec, resolve
    from runner.train import native, runtime, trl_engine

    rt = runtime.init(args.device)
    runtime.set_determinism(0, False, args.device)
    work = Path(tempfile.mkdtemp(prefix="calib-"))
    gpu = "H200" if args.device == "cuda" else "auto"
    result = {"command": " ".join(["python", *sys.argv]), "device": args.device, "rows": []}
    if args.device == "cuda":
        result["gpu_name"] = torch.cuda.get_device_name()
        result["versions"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    rows = configs(work, args.quick)
    if args.quick and not args.only:
        rows = rows[:2]
    for name, overrides in rows:
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        snapshot = args.device == "cuda" and bool(args.snapshot) and any(p in name for p in args.snapshot.split(","))
        row: dict = {"name": name, "overrides": overrides}
        t0 = time.time()
        try:
            # Levers a configuration leaves auto take their plain values: the rows measure given settings.
            spec = with_plain_levers(resolve(load_spec("tiny-cpu", [*overrides, f"hardware.device={args.device}",
                                                                    "hardware.nproc_per_node=1", f"hardware.gpu={gpu}"])))
            est = estimate(spec).to_dict()
            row["estimate"] = {k: est.get(k) for k in ("per_gpu_gib", "per_gpu_allocated_gib", "breakdown",
                                                      "attn_implementation", "loss_impl", "approximate")}
            if args.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            if snapshot:
                row["allocated_before_gib"] = round(torch.cuda.memory_allocated() / 2**30, 3)
                torch.cuda.memory._record_memory_history(max_entries=2_000_000)
            engine = trl_engine if spec.engine == "trl" else native
            from runner.decide import decide_run
            run_dir = work / f"run{len(result['rows'])}"
            run_dir.mkdir()
            try:
                summary = engine.train(spec, rt, EventWriter(run_dir / "events.jsonl", 0), decide_run(spec, probe=True),
                                       run_dir=run_dir)
                if snapshot:
                    snap = torch.cuda.memory._snapshot()
                    row["at_peak"] = live_at_peak(snap)
                    row["at_training_peak"] = live_at_peak(snap, since_backward=True)
            finally:
                if snapshot:
                    torch.cuda.memory._record_memory_history(enabled=None)
            row["steps"] = summary["steps"]
            row["final_loss"] = summary["final_loss"]
            if args.device == "cuda":
                row["peak_alloc_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
                row["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
                alloc = row["estimate"]["per_gpu_allocated_gib"]
                row["error_alloc"] = round((alloc - row["peak_alloc_gib"]) / row["peak_alloc_gib"], 4)
        except Exception as e:  # noqa: BLE001 - one failing configuration must not lose the others
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        row["wall_s"] = round(time.time() - t0, 1)
        result["rows"].append(row)
        args.out.write_text(json.dumps(result, indent=2))
        print(json.dumps({k: row.get(k) for k in ("name", "peak_alloc_gib", "peak_reserved_gib", "error_alloc",
                                                    "wall_s", "error")}), flush=True)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
