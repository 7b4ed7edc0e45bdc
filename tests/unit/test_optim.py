"""bf16 stochastic rounding and the AdamW built on it: unbiased, deterministic per (seed, rank, step), exact AdamW in
fp32, and updates below bf16's resolution survive where round-to-nearest loses them."""

from __future__ import annotations

import pytest
import torch

from runner.spec import load_spec, optimizer_precision, resolve
from runner.train import optim
from runner.train.optim import StochasticAdamW, rounding_noise, step_seed, stochastic_round_


def _round(x: torch.Tensor, seed: int) -> torch.Tensor:
    out = torch.empty_like(x, dtype=torch.bfloat16)
    stochastic_round_(out, x, step_seed(5, 0, seed))
    return out


def test_stochastic_rounding_lands_on_a_neighbour_and_is_unbiased():
    torch.manual_seed(0)
    x = torch.randn(4096) * 0.02
    bits = x.view(torch.int32)
    toward_zero = (bits & -65536).view(torch.float32)  # the bf16 neighbours: truncated, and one step further out
    away = ((bits & -65536) + 65536).view(torch.float32)
    below, above = torch.minimum(toward_zero, away), torch.maximum(toward_zero, away)
    lo = x.to(torch.bfloat16)  # round to nearest
    draws = torch.stack([_round(x, s).float() for s in range(400)])
    gap = above - below
    # Every draw is one of the two bf16 values around x (at most one bf16 step apart).
    assert torch.all((draws == below) | (draws == above))
    assert torch.all(below <= x) and torch.all(x <= above)
    # Mean of 400 draws: within 4 standard errors of x, relative to the gap (p(1-p)/n <= 1/(4n)).
    err = ((draws.mean(0) - x) / gap).abs()
    assert err.max() < 4 * (0.25 / 400) ** 0.5
    # Round-to-nearest is biased for the same inputs: its error, averaged, is far larger.
    assert ((lo.float() - x) / gap).abs().mean() > 10 * err.mean()


def test_exact_bf16_values_are_kept():
    x = torch.randn(1000).to(torch.bfloat16).float()
    assert torch.equal(_round(x, 1).float(), x)


def test_same_seed_same_bits_other_step_other_bits():
    x = torch.randn(2048)
    assert torch.equal(_round(x, 7), _round(x, 7))
    assert not torch.equal(_round(x, 7), _round(x, 8))


def test_the_noise_is_uniform_on_16_bits_and_does_not_depend_on_how_the_tensor_is_cut():
    key = torch.tensor(step_seed(1, 2, 3))
    whole = rounding_noise(1 << 16, key)
    assert whole.dtype == torch.int32 and int(whole.min()) >= 0 and int(whole.max()) < 1 << 16
    # Each of the 16 bits is set in about half of the draws (4 standard errors of 65,536 fair coins: 0.0078).
    for bit in range(16):
        share = ((whole >> bit) & 1).float().mean().item()
        assert abs(share - 0.5) < 0.008, (bit, share)
    # Neighbouring elements are not correlated (a mixer that passed the index through would fail this).
    a, b = whole[:-1].double(), whole[1:].double()
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.02
    pieces = torch.cat([rounding_noise(1000, key, 0), rounding_noise((1 << 16) - 1000, key, 1000)])
    assert torch.equal(pieces, whole)
    assert not torch.equal(rounding_noise(1 << 16, torch.tensor(step_seed(1, 2, 4))), whole)


def test_a_chunked_update_equals_the_whole_one(monkeypatch):
    """Eager updates go in chunks (bounded temporaries); the kernel goes whole: same bits either way."""
    results = []
    for chunk in (1 << 24, 100):
        monkeypatch.setattr(optim, "CHUNK", chunk)
        p, _ = _adam_pair(torch.bfloat16)
        opt = StochasticAdamW([p], lr=1e-5, seed=4)
        for step in range(3):
            p.grad = torch.randn(64, 32, generator=torch.Generator().manual_seed(step)).to(torch.bfloat16)
            opt.step()
        results.append(p.data.clone())
    assert torch.equal(results[0], results[1])


def _adam_pair(dtype: torch.dtype, lr: float = 1e-2) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    torch.manual_seed(1)
    w = torch.randn(64, 32) * 0.02
    return torch.nn.Parameter(w.clone().to(dtype)), torch.nn.Parameter(w.clone())


def test_on_fp32_parameters_it_is_torch_adamw():
    ours_p, ref_p = _adam_pair(torch.float32)
    ours = StochasticAdamW([ours_p], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ref = torch.optim.AdamW([ref_p], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(5):
        g = torch.randn(64, 32, generator=torch.Generator().manual_seed(step))
        ours_p.grad, ref_p.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(ours_p.data, ref_p.data, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("lr", [1e-5, 2e-5])
def test_small_updates_survive_in_bf16_where_nearest_rounding_loses_them(lr):
    """20 steps of a constant gradient: fp32 moves each weight by about 20·lr; bf16 rounded to nearest barely moves
    (lr is below bf16's resolution at |w| ≈ 0.02); stochastic rounding moves it by the fp32 amount on average."""
    sr_p, ref_p = _adam_pair(torch.bfloat16)
    near_p = torch.nn.Parameter(sr_p.data.clone())
    start = ref_p.data.clone()
    sr = StochasticAdamW([sr_p], lr=lr, seed=3)
    ref = torch.optim.AdamW([ref_p], lr=lr)
    near = torch.optim.AdamW([near_p], lr=lr)  # torch's AdamW on bf16 params: states and weights rounded to nearest
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    for _ in range(20):
        sr_p.grad, ref_p.grad, near_p.grad = g.to(torch.bfloat16), g.clone(), g.to(torch.bfloat16)
        sr.step()
        ref.step()
        near.step()
    moved_ref = (ref_p.data - start).abs().mean()
    moved_sr = (sr_p.data.float() - start.to(torch.bfloat16).float()).abs().mean()
    moved_near = (near_p.data.float() - start.to(torch.bfloat16).float()).abs().mean()
    assert abs(moved_sr / moved_ref - 1) < 0.1, (moved_sr, moved_ref)
    assert moved_near < 0.5 * moved_ref, (moved_near, moved_ref)


def test_replaying_the_same_steps_gives_the_same_bits():
    runs = []
    for _ in range(2):
        p, _ = _adam_pair(torch.bfloat16)
        opt = StochasticAdamW([p], lr=1e-5, seed=11, rank=1)
        for step in range(3):
            p.grad = torch.randn(64, 32, generator=torch.Generator().manual_seed(step)).to(torch.bfloat16)
            opt.step()
        runs.append(p.data.clone())
    assert torch.equal(runs[0], runs[1])


def test_a_resumed_optimizer_continues_the_same_bits():
    """Saved after one step and loaded into a new optimizer (as a checkpoint resume does), two more steps give the
    bits of three uninterrupted ones: the step counts (advanced together) and the noise keys carry over."""
    def grad(step: int) -> torch.Tensor:
        return torch.randn(64, 32, generator=torch.Generator().manual_seed(step)).to(torch.bfloat16)

    p, _ = _adam_pair(torch.bfloat16)
    q = torch.nn.Parameter(p.detach().clone())
    straight = StochasticAdamW([p], lr=1e-5, seed=11)
    for step in range(3):
        p.grad = grad(step)
        straight.step()
    first = StochasticAdamW([q], lr=1e-5, seed=11)
    q.grad = grad(0)
    first.step()
    resumed = StochasticAdamW([q], lr=1e-5, seed=11)
    resumed.load_state_dict(first.state_dict())
    for step in (1, 2):
        q.grad = grad(step)
        resumed.step()
    assert float(resumed.state[q]["step"]) == 3
    assert torch.equal(p.data, q.data)


def test_auto_precision_follows_the_weights_and_the_engine():
    assert optimizer_precision("native", "auto", "bfloat16") == "bf16_stochastic"
    assert optimizer_precision("native", "auto", "float32") == "fp32_master"
    assert optimizer_precision("native", "bf16", "bfloat16") == "bf16"
    assert optimizer_precision("trl", "auto", "bfloat16") == "fp32_master"
    cpu = resolve(load_spec("tiny-cpu"), cuda_available=False, gpu_count=0)
    assert (cpu.model.dtype, cpu.train.optimizer_precision) == ("float32", "fp32_master")  # today's CPU default
    gpu = resolve(load_spec("tiny-cpu", ["hardware.device=auto"]), cuda_available=True, gpu_count=2)
    assert (gpu.model.dtype, gpu.train.optimizer_precision) == ("bfloat16", "bf16_stochastic")
    # Asking for bf16 stochastic rounding with model.dtype=auto gives bf16 weights, on CPU too.
    sr = resolve(load_spec("tiny-cpu", ["train.optimizer_precision=bf16_stochastic"]), cuda_available=False,
                 gpu_count=0)
    assert sr.model.dtype == "bfloat16"


@pytest.mark.parametrize("sets, field", [
    (["model.dtype=bfloat16", "train.optimizer_precision=fp32_master"], "train.optimizer_precision"),
    (["model.dtype=float32", "train.optimizer_precision=bf16_stochastic"], "train.optimizer_precision"),
    (["engine=trl", "train.optimizer_precision=bf16_stochastic"], "train.optimizer_precision"),
])
def test_contradicting_precision_settings_are_refused_naming_the_field(sets, field):
    from runner.errors import SpecError

    with pytest.raises(SpecError) as err:
        load_spec("tiny-cpu", sets)
    assert field in {p.field for p in err.value.problems}


def test_a_resolved_trl_spec_on_bf16_weights_validates_again():
    """The supervisor validates the resolved spec it is handed: TRL's fixed fp32_master beside model.dtype=bfloat16
    (a GPU recipe's dtype) is what the engine runs, not a contradiction."""
    from runner.spec import validate

    sets = ["engine=trl", "model.dtype=bfloat16", "hardware.device=auto"]
    resolved = resolve(load_spec("tiny-cpu", sets), cuda_available=True, gpu_count=2)
    assert (resolved.model.dtype, resolved.train.optimizer_precision) == ("bfloat16", "fp32_master")
    assert validate(resolved.model_dump()) == resolved


KERNEL_VS_EAGER = """
import torch
from runner.train.optim import StochasticAdamW
results = []
for kernel in (False, True):
    torch.manual_seed(1)
    # Sizes around the kernel's 512-element blocks, an empty one, and two dtypes (one launch each): each program
    # finds its parameter in the launch's table.
    sizes = [(3000, torch.bfloat16), (517, torch.bfloat16), (2049, torch.float32), (1, torch.bfloat16),
             (0, torch.bfloat16), (512, torch.bfloat16), (1, torch.float32), (1025, torch.bfloat16), (7, torch.bfloat16)]
    ps = [torch.nn.Parameter((torch.randn(n) * 0.02).to(dtype)) for n, dtype in sizes]
    opt = StochasticAdamW(ps, lr=1e-5, seed=4, weight_decay=0.1, fused=kernel)
    for step in range(2):
        for i, p in enumerate(ps):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i)).to(p.dtype)
        opt.step()
    results.append([t.clone() for p in ps for t in (p.data, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])])
# bf16 tensors to the bit; fp32 ones within one unit in the last place (the interpreter may round a product once
# differently: on a GPU the compiler fuses multiply-adds anyway)
bad = [i for i, (a, b) in enumerate(zip(*results))
       if not (torch.equal(a, b) if a.dtype == torch.bfloat16 else torch.allclose(a, b, rtol=2**-23, atol=0))]
assert not bad, f"kernel and eager differ in tensors {bad}"
print("same")
"""


@pytest.mark.launches
def test_the_kernel_update_equals_the_eager_one():
    """The update CUDA runs (one Triton kernel launch per dtype over all parameters, its noise hashed in 32-bit unsigned arithmetic) is the
    eager one, to the bit for bf16 weights and states, under Triton's interpreter on CPU: the same noise and arithmetic, so a GPU run differs from
    a CPU one only where the GPU's kernels round differently. Needs the triton package (CUDA builds of torch ship
    it; CPU builds do not: `pip install triton` to run this)."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (CPU builds of torch do not ship it)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", KERNEL_VS_EAGER], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "same", out.stderr[-3000:]


def test_a_kernel_that_cannot_be_built_falls_back_to_the_eager_update_with_one_warning(monkeypatch, capsys):
    import sys
    import types

    def broken(*_: object) -> None:
        raise RuntimeError("PTX assembly failed\nmore detail")

    monkeypatch.setitem(sys.modules, "runner.train.optim_kernel", types.SimpleNamespace(adamw_update_kernel_=broken))
    results = []
    for kernel in (False, True):
        torch.manual_seed(1)
        ps = [torch.nn.Parameter((torch.randn(n) * 0.02).to(torch.bfloat16)) for n in (300, 57)]
        opt = StochasticAdamW(ps, lr=1e-5, seed=4, fused=kernel)
        for step in range(2):
            for i, p in enumerate(ps):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i)).to(torch.bfloat16)
            opt.step()
        results.append([p.data.clone() for p in ps])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    err = capsys.readouterr().err
    assert err.count("warning: the stochastic-rounding AdamW kernel could not run") == 1
    assert "RuntimeError: PTX assembly failed" in err and opt.kernel_error == "RuntimeError: PTX assembly failed"


@pytest.mark.parametrize("kind", ["stochastic", "torch", "torch-fused"])
def test_states_made_before_the_first_step_are_the_ones_it_would_make(kind):
    """allocate_states makes each AdamW state as the first step would (zeros, the same dtypes, devices and step
    counter), so the updates are the same bits; a parameter left out (a vision tower's) gets none."""
    def build(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if kind == "stochastic":
            return StochasticAdamW(params, lr=1e-3, seed=3)
        return torch.optim.AdamW(params, lr=1e-3, fused=kind == "torch-fused")  # fused: its step on the device

    dtype = torch.bfloat16 if kind == "stochastic" else torch.float32
    start = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    lazy_p, eager_p, left_out = (torch.nn.Parameter(start.clone()) for _ in range(3))
    lazy, eager = build([lazy_p]), build([eager_p, left_out])
    optim.allocate_states(eager, [eager_p])
    assert not eager.state[left_out] and set(eager.state[eager_p]) == {"step", "exp_avg", "exp_avg_sq"}
    for step in range(3):
        g = torch.randn(16, 8, generator=torch.Generator().manual_seed(step + 1)).to(dtype)
        lazy_p.grad, eager_p.grad = g.clone(), g.clone()
        lazy.step()
        eager.step()
        if step == 0:
            for k, v in lazy.state[lazy_p].items():
                w = eager.state[eager_p][k]
                assert (v.dtype, v.device, v.shape) == (w.dtype, w.device, w.shape), k
    assert torch.equal(lazy_p.data, eager_p.data) and float(eager.state[eager_p]["step"]) == 3
