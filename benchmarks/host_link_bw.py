"""Host <-> GPU copy rate through page-locked memory, alone and beside a matrix product (CUDA only).

    python3 benchmarks/host_link_bw.py [--gib 2] [--repeat 5]

Prints GB/s (10^9 bytes per second, median of --repeat timed copies, CUDA events) for: device to host, host to
device, both at once on two streams, and device to host while a bf16 matmul runs on the default stream (with the
matmul's own TFLOP/s alone and beside the copy). This is the rate `train.offload_activations` depends on
(HOST_LINK_GB_S in runner/plan/).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def timed(fn, repeat: int) -> float:
    """Median seconds of fn() over repeat runs, timed with CUDA events after one untimed run."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    n = int(args.gib * 2**30) // 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
    dev2 = torch.empty_like(dev)
    host = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    host2 = torch.randn(n, dtype=torch.bfloat16).pin_memory()
    nbytes = n * 2
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
    mm_reps = 40

    def d2h() -> None:
        host.copy_(dev, non_blocking=True)

    def h2d() -> None:
        dev2.copy_(host2, non_blocking=True)

    def both() -> None:
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        with torch.cuda.stream(s1):
            host.copy_(dev, non_blocking=True)
        with torch.cuda.stream(s2):
            dev2.copy_(host2, non_blocking=True)
        cur.wait_stream(s1)
        cur.wait_stream(s2)

    def matmuls() -> None:
        for _ in range(mm_reps):
            torch.mm(a, b)

    def d2h_beside_matmul() -> None:
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur)
        with torch.cuda.stream(s1):
            host.copy_(dev, non_blocking=True)
        matmuls()
        cur.wait_stream(s1)

    flops = 2 * 8192**3 * mm_reps
    t_mm = timed(matmuls, args.repeat)
    # The copy alone, on its stream, timed while matmuls run: event on s1.
    s1_times = []
    for _ in range(args.repeat):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur)
        with torch.cuda.stream(s1):
            start.record()
            host.copy_(dev, non_blocking=True)
            end.record()
        matmuls()
        torch.cuda.synchronize()
        s1_times.append(start.elapsed_time(end) / 1e3)
    result = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "bytes": nbytes,
        "d2h_GB_s": round(nbytes / timed(d2h, args.repeat) / 1e9, 1),
        "h2d_GB_s": round(nbytes / timed(h2d, args.repeat) / 1e9, 1),
        "both_directions_GB_s_each": round(nbytes / timed(both, args.repeat) / 1e9, 1),
        "d2h_beside_matmul_GB_s": round(nbytes / statistics.median(s1_times) / 1e9, 1),
        "matmul_alone_TFLOP_s": round(flops / t_mm / 1e12, 1),
        "matmul_beside_d2h_TFLOP_s": round(flops / timed(d2h_beside_matmul, args.repeat) / 1e12, 1),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
