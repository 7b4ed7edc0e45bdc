"""The bf16 stochastic-rounding AdamW on one GPU: the Triton kernel update equals the eager one to within one bf16 step,
and a step costs what torch's fused AdamW costs on the same bf16 weights, in GPU time and in host time (the host
queues the training step ahead of the GPU: a step whose host work runs behind is as slow as the host).

    python3 benchmarks/optim_gpu_check.py

The parameters are the Qwen3-1.7B layout's 310 tensors (1.72B parameters: embedding, 28 layers of attention, MLP
and norms), bf16 with bf16 gradients. Prints one line per optimizer: milliseconds per step until the GPU is done
(median of 10 after 3 warm-up steps), the host's share of it (until step() returns), and bytes moved per parameter
at that speed; exits 1 if the kernel and eager updates differ by more than one bf16 step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from runner.train.optim import StochasticAdamW

QWEN3_1_7B = [(151936, 2048)] + [(2048, 2048), (1024, 2048), (1024, 2048), (2048, 2048), (6144, 2048), (6144, 2048),
                                 (2048, 6144), (2048,), (2048,), (128,), (128,)] * 28 + [(2048,)]
"""Qwen3-1.7B's parameter shapes: tied embedding; per layer q, k, v, o, gate, up, down, two norms, q and k norms."""


def _params(shapes: list[tuple[int, ...]], seed: int = 0) -> list[torch.nn.Parameter]:
    """bf16 weights of magnitude ~0.02 with bf16 gradients of ~1e-3."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ps = []
    for shape in shapes:
        p = torch.nn.Parameter((torch.randn(shape, device="cuda", generator=gen) * 0.02).to(torch.bfloat16))
        p.grad = (torch.randn(shape, device="cuda", generator=gen) * 1e-3).to(torch.bfloat16)
        ps.append(p)
    return ps


def _time(opt: torch.optim.Optimizer) -> tuple[float, float]:
    """Median seconds per step until the GPU is done, and until step() returned."""
    times, host = [], []
    for i in range(13):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.step()
        queued = time.perf_counter()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t)
            host.append(queued - t)
    return statistics.median(times), statistics.median(host)


def _bf16_steps(x: torch.Tensor, y: torch.Tensor, floor: float = 0.0) -> float:
    """The largest |x - y| in units of one bf16 step at the larger magnitude of each pair (at least `floor`)."""
    x, y = x.float(), y.float()
    exponent = torch.frexp(torch.maximum(torch.maximum(x.abs(), y.abs()), torch.tensor(floor))).exponent
    return ((x - y).abs() / torch.ldexp(torch.ones_like(x), exponent - 8)).max().item()


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    # Equality on a few odd sizes (blocks of one launch cross from one parameter to the next).
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        ps = [torch.nn.Parameter((torch.randn(n, device="cuda") * 0.02).to(torch.bfloat16)) for n in (4099, 1 << 20, 77)]
        opt = StochasticAdamW(ps, lr=1e-5, weight_decay=0.1, seed=3, fused=fused)
        for step in range(3):
            for i, p in enumerate(ps):
                p.grad = (torch.randn(p.shape, device="cuda", generator=torch.Generator(device="cuda")
                                      .manual_seed(10 * step + i)) * 1e-3).to(torch.bfloat16)
            opt.step()
        results.append([p.detach().clone() for p in ps] + [opt.state[p]["exp_avg"].clone() for p in ps])
    # The kernel's fused multiply-adds round an fp32 moment now and then differently from torch's separate multiply
    # and add, which can move a bf16 moment by one step, and a stochastically rounded weight by one step; more than
    # that is a bug. A moment's one-step difference stays in it (times b1 each step) while the moment itself may
    # shrink (m·b1 and g·(1 - b1) cancel): one step at its earlier magnitude is a hundred at its later one (measured:
    # 115 at 2^-10 of the tensor's largest value). So moments are judged in steps at their tensor's largest value;
    # a wrong gradient, parameter or row would be ~128 of those.
    count = len(results[0]) // 2
    differ = sum(int((x != y).sum()) for x, y in zip(*results))
    total = sum(x.numel() for x in results[0])
    worst_w = max(_bf16_steps(x, y) for x, y in zip(results[0][:count], results[1][:count]))
    worst_m = max(_bf16_steps(x, y, x.abs().max().item())
                  for x, y in zip(results[0][count:], results[1][count:]))
    same = worst_w <= 1 and worst_m <= 1
    print(f"kernel vs eager on CUDA: {differ} of {total} values differ; the largest by {worst_w:g} bf16 steps in the "
          f"weights, {worst_m:g} in the first moments (at each tensor's largest value)")
    ps = _params(QWEN3_1_7B)
    n = sum(p.numel() for p in ps)
    rows = [("torch AdamW fused (bf16 weights, nearest)", torch.optim.AdamW(ps, lr=1e-5, fused=True)),
            ("StochasticAdamW Triton kernel (one launch)", StochasticAdamW(ps, lr=1e-5, seed=1)),
            ("StochasticAdamW eager", StochasticAdamW(ps, lr=1e-5, seed=1, fused=False))]
    for name, opt in rows:
        s, host = _time(opt)
        print(f"{name}: {s * 1e3:.1f} ms per step ({host * 1e3:.1f} ms of it on the host) for {len(ps)} tensors, "
              f"{n / 1e9:.2f}B parameters ({14 * n / s / 1e12:.2f} TB/s at 14 B per parameter) on "
              f"{torch.cuda.get_device_name()}")
        opt.state.clear()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
