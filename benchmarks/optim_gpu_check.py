"""The bf16 stochastic-rounding AdamW on one GPU: the Triton kernel update equals the eager one to within one bf16 step, and a step
costs what torch's fused AdamW costs on the same bf16 weights (the time a 3.2B-parameter step adds to a training step).

    python3 benchmarks/optim_gpu_check.py [--params 3.2e9]

Prints one line per optimizer: milliseconds per step (median of 10 after 3 warm-up steps) and bytes moved per
parameter at that speed; exits 1 if the kernel and eager updates differ by more than one bf16 step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from runner.train.optim import StochasticAdamW


def _params(total: float, seed: int = 0) -> list[torch.nn.Parameter]:
    """Weights shaped like a 3B decoder's (a 3072×8192 MLP matrix repeated), bf16, with bf16 gradients."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (3072, 8192)
    count = max(1, int(total // (shape[0] * shape[1])))
    ps = []
    for _ in range(count):
        p = torch.nn.Parameter((torch.randn(shape, device="cuda", generator=gen) * 0.02).to(torch.bfloat16))
        p.grad = (torch.randn(shape, device="cuda", generator=gen) * 1e-3).to(torch.bfloat16)
        ps.append(p)
    return ps


def _time(opt: torch.optim.Optimizer) -> float:
    times = []
    for i in range(13):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _bf16_steps(x: torch.Tensor, y: torch.Tensor) -> float:
    """The largest |x - y| in units of one bf16 step at the larger magnitude of each pair."""
    x, y = x.float(), y.float()
    exponent = torch.frexp(torch.maximum(x.abs(), y.abs())).exponent
    return ((x - y).abs() / torch.ldexp(torch.ones_like(x), exponent - 8)).max().item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=3.2e9)
    a = ap.parse_args()
    # Equality on a few odd sizes (one launch per parameter, any size).
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
    # Eager and kernel code may round an fp32 intermediate differently (fused multiply-adds), which can move a
    # stochastically rounded weight by one bf16 step; more than that is a bug.
    differ = sum(int((x != y).sum()) for x, y in zip(*results))
    total = sum(x.numel() for x in results[0])
    worst = max(_bf16_steps(x, y) for x, y in zip(*results))
    same = worst <= 1
    print(f"kernel vs eager on CUDA: {differ} of {total} values differ, the largest by {worst:g} bf16 steps "
          "(of the larger value's binade)")
    ps = _params(a.params)
    n = sum(p.numel() for p in ps)
    rows = [("torch AdamW fused (bf16 weights, nearest)", torch.optim.AdamW(ps, lr=1e-5, fused=True)),
            ("StochasticAdamW Triton kernel", StochasticAdamW(ps, lr=1e-5, seed=1)),
            ("StochasticAdamW eager", StochasticAdamW(ps, lr=1e-5, seed=1, fused=False))]
    for name, opt in rows:
        s = _time(opt)
        print(f"{name}: {s * 1e3:.1f} ms per step for {n / 1e9:.2f}B parameters "
              f"({14 * n / s / 1e12:.2f} TB/s at 14 B per parameter) on {torch.cuda.get_device_name()}")
        opt.state.clear()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
