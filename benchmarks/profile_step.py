"""Where a native training step's time goes: a kernel-level profile of a few steps after warm-up.

    torchrun --nproc_per_node 1 benchmarks/profile_step.py qwen3-1.7b-bench-h200 --set train.seq_len=8192 \
        [--warmup 4] [--steps 3] [--json OUT.json]

Builds the model exactly as `runner run` does (runner.train.native.build, the same data stream and train_step),
runs the warm-up steps, then profiles the next steps and prints, per step:

* wall: host time from the step's start until the GPU has finished it (what the engine's step events time);
* enqueue: host time until the last kernel of the step was queued (close to wall: the host is the bottleneck);
* GPU busy: the union of kernel intervals over wall (idle gaps = launch overhead, syncs, host work);
* kernel time by kind (matmul, attention, fused Triton, copies, collectives, optimizer, other) and the top kernels.

Meant for CUDA (on CPU only the step times mean anything). Nothing is written except --json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

# First match wins: attention kernels carry cutlass template names, so they are tested before matmuls.
KINDS = [
    ("attention", re.compile(r"flash|fmha|attn|attention|flex", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|sm90_xmma|sm100|cublas|wgmma|splitK", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|l2norm|norm_kernel", re.I)),
    ("collective", re.compile(r"nccl", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|cat|chunk_cat|split_with_sizes", re.I)),
    ("fused triton", re.compile(r"^triton_", re.I)),
]


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class StackSampler(threading.Thread):
    """Samples every thread's Python stack every `interval` s (the autograd engine's threads included, which
    cProfile does not see): host time by function, self (innermost Python frame: it or the C++ it called) and
    inclusive."""

    def __init__(self, interval: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[tuple[str, tuple[str, ...]]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        names = {}
        while not self._halt.is_set():
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                stack = []
                while frame is not None:
                    code = frame.f_code
                    stack.append(f"{Path(code.co_filename).name}:{code.co_name}")
                    frame = frame.f_back
                if ident not in names:
                    names[ident] = "main" if ident == threading.main_thread().ident else f"thread-{len(names)}"
                self.samples.append((names[ident], tuple(stack)))
            time.sleep(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def report(self, top: int) -> str:
        lines = []
        for thread in sorted({t for t, _ in self.samples}):
            stacks = [st for t, st in self.samples if t == thread]
            own: dict[str, int] = defaultdict(int)
            incl: dict[str, int] = defaultdict(int)
            for st in stacks:
                if st:
                    own[st[0]] += 1
                for name in set(st):
                    incl[name] += 1
            n = len(stacks)
            lines.append(f"== {thread}: {n} samples")
            lines.append("  self:      " + "; ".join(f"{k} {v / n:.1%}" for k, v in
                                                    sorted(own.items(), key=lambda x: -x[1])[:top]))
            lines.append("  inclusive: " + "; ".join(f"{k} {v / n:.1%}" for k, v in
                                                    sorted(incl.items(), key=lambda x: -x[1])[:top]))
        return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="recipe name or spec file")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--mode", choices=["kernels", "ops", "host", "time"], default="kernels",
                        help="kernels: device time by kernel; ops: by operator and input shapes; host: Python "
                             "functions by host time (cProfile); time: step times only, no profiler")
    args = parser.parse_args()

    import torch.distributed as dist

    from runner.plan.autotune import resolve_levers
    from runner.spec import load_spec, resolve
    from runner.train import native, runtime
    from runner.train.data import collate, to_device

    spec = resolve_levers(resolve(load_spec(args.spec, args.overrides)))  # the levers a launch would pick
    rt = runtime.init(spec.hardware.device)
    runtime.set_determinism(spec.train.seed, spec.train.deterministic, rt.device)
    from runner.decide import decide_run

    parts = native.build(spec, rt, decide_run(spec, probe=True))
    model, opt = parts["model"], parts["optimizer"]
    blocks = native.block_iterator(spec, parts["tokenizer"], rt.rank, rt.world_size, rt.device)

    def step() -> tuple[float, float, int]:
        start = time.perf_counter()
        block = next(blocks)
        batch = to_device(collate([block]), rt.device)
        native.train_step(model, opt, [batch], max(block.target_tokens, 1), rt.world_size, parts["loss_impl"],
                          spec.train.max_grad_norm)
        enqueued = time.perf_counter()
        rt.synchronize()
        return enqueued - start, time.perf_counter() - start, block.real_tokens

    for i in range(args.warmup):
        _, wall, _ = step()
        print(f"warm-up step {i + 1}: {wall:.3f} s", flush=True)

    host: list[tuple[float, float, int]] = []
    if args.mode in ("time", "host"):
        import statistics

        sampler = StackSampler() if args.mode == "host" else None
        if sampler:
            sampler.start()
        for _ in range(args.steps):
            host.append(step())
        if sampler:
            sampler.stop()
        walls = [h[1] for h in host]
        result = {"spec": args.spec, "overrides": args.overrides, "mode": args.mode,
                  "tokens_per_s": round(sum(h[2] for h in host) / sum(walls), 1),
                  "median_wall_s": round(statistics.median(walls), 4),
                  "spread": round((max(walls) - min(walls)) / statistics.median(walls), 4),
                  "median_enqueue_s": round(statistics.median(h[0] for h in host), 4),
                  "peak_mem_gib": rt.peak_mem_gib()}
        if rt.rank == 0:
            print(json.dumps(result), flush=True)
            if sampler:
                print(sampler.report(args.top), flush=True)
        dist.destroy_process_group()
        return 0

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=args.mode == "ops") as prof:
        for _ in range(args.steps):
            host.append(step())
    if args.mode == "ops" and rt.rank == 0:
        table = prof.key_averages(group_by_input_shape=True).table(sort_by="self_cuda_time_total",
                                                                   row_limit=args.top, max_name_column_width=60,
                                                                   max_shapes_column_width=90)
        print(table, flush=True)

    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for e in kernels:
        d = e.time_range.end - e.time_range.start
        by_name[e.name] += d
        by_kind[kind_of(e.name)] += d
    busy_us = union_length([(e.time_range.start, e.time_range.end) for e in kernels])
    wall_s = sum(h[1] for h in host)
    tokens = sum(h[2] for h in host)
    kernel_s = sum(by_kind.values()) / 1e6

    n = args.steps
    result = {
        "spec": args.spec, "overrides": args.overrides, "choices": parts["info"],
        "steps": [{"enqueue_s": round(a, 4), "wall_s": round(b, 4), "tokens": t} for a, b, t in host],
        "tokens_per_s": round(tokens / wall_s, 1),
        "gpu_busy_share": round(busy_us / 1e6 / wall_s, 4),
        "kernel_s_per_step": round(kernel_s / n, 4),
        "kernel_count_per_step": len(kernels) // n,
        "by_kind_s_per_step": {k: round(v / 1e6 / n, 4) for k, v in sorted(by_kind.items(), key=lambda x: -x[1])},
        "top_kernels_s_per_step": {k[:120]: round(v / 1e6 / n, 4)
                                   for k, v in sorted(by_name.items(), key=lambda x: -x[1])[:args.top]},
        "peak_mem_gib": rt.peak_mem_gib(),
    }
    if rt.rank == 0:
        print(json.dumps(result, indent=1), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
