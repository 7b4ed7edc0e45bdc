"""AdamW over bf16 weights that learns like fp32 master weights: the update is computed in fp32 and written back to
bf16 with stochastic rounding, from a generator seeded by (seed, rank, step).

Why: bf16 has 8 bits of significand, so an update of about lr on a weight of magnitude w is rounded away when
lr / w < 2^-9 (at lr 1e-5 and w 0.02, every one). Rounding up with probability equal to the lost fraction keeps the
expected weight equal to the fp32 one, at 8 bytes per parameter (bf16 weights, gradients and both moments).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

LOW_BITS = 1 << 16
"""An fp32 holds 16 more significand bits than a bf16: the bits stochastic rounding decides on."""


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of an FSDP2 DTensor (the tensor itself otherwise): the step is elementwise."""
    return getattr(t, "_local_tensor", t)


CHUNK = 1 << 24
"""Elements updated at once: the fp32 temporaries of a step stay near 6 × 64 MiB however large a parameter is."""


def _chunks(t: torch.Tensor) -> list[torch.Tensor]:
    flat = t.view(-1)
    return [flat[i:i + CHUNK] for i in range(0, flat.numel(), CHUNK)]


def stochastic_round_(dst: torch.Tensor, src: torch.Tensor, generator: torch.Generator) -> None:
    """dst (bf16) = src (fp32) rounded to one of its two bf16 neighbours, up with probability the fraction of the
    gap it lies above the lower one: adds uniform noise below the kept bits, then truncates."""
    bits = src.contiguous().view(torch.int32)
    noise = torch.randint(0, LOW_BITS, bits.shape, dtype=torch.int32, device=bits.device, generator=generator)
    # Truncating the sum's low 16 bits leaves an exact bf16 value in fp32 form: the cast below does not round.
    dst.copy_(((bits + noise) & -LOW_BITS).view(torch.float32))


def step_seed(seed: int, rank: int, step: int) -> int:
    """One generator seed per (run seed, rank, optimizer step): replays and resumes draw the same bits."""
    return (seed * 1_000_003 + rank * 7_919 + step * 104_729) % (2**63 - 1)


class StochasticAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments) whose states live in the parameters' dtype and whose
    weight update is stochastically rounded when the parameters are bf16. Parameters of another dtype are updated
    exactly (plain rounding is exact for fp32)."""

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, seed: int = 0, rank: int = 0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed, self.rank = seed, rank
        self._generators: dict[torch.device, torch.Generator] = {}

    def _update(self, w: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, n: int,
                group: dict[str, Any]) -> None:
        """One AdamW update of a piece of a parameter, in fp32, written back in the parameter's dtype."""
        b1, b2 = group["betas"]
        g = grad.float()
        m = exp_avg.float().mul_(b1).add_(g, alpha=1 - b1)
        v = exp_avg_sq.float().mul_(b2).addcmul_(g, g, value=1 - b2)
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)
        denom = (v / (1 - b2**n)).sqrt_().add_(group["eps"])  # v may be the state itself (fp32): not in place
        new = w.float().mul_(1 - group["lr"] * group["weight_decay"])
        new.addcdiv_(m, denom, value=-group["lr"] / (1 - b1**n))
        if w.dtype == torch.bfloat16:
            stochastic_round_(w, new, self._generators[w.device])
        else:
            w.copy_(new)

    def _generator(self, device: torch.device, step: int) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device)
        gen.manual_seed(step_seed(self.seed, self.rank, step))
        return gen

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 - torch.optim.Optimizer's contract
        loss = closure() if closure is not None else None
        seeded: set[torch.device] = set()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                n = int(state["step"].item())
                w = _local(p)
                if w.dtype == torch.bfloat16 and w.device not in seeded:
                    seeded.add(w.device)
                    self._generator(w.device, n)
                tensors = [_local(t) for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])]
                whole = not all(t.is_contiguous() for t in tensors)
                for w, g, m, v in zip(*([t] if whole else _chunks(t) for t in tensors)):
                    self._update(w, g, m, v, n, group)
        return loss


def build_optimizer(params: list[torch.nn.Parameter], precision: str, lr: float, betas: tuple[float, float],
                    weight_decay: float, device: str, seed: int, rank: int) -> torch.optim.Optimizer:
    """The native engine's optimizer for a resolved train.optimizer_precision."""
    if precision == "bf16_stochastic":
        return StochasticAdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, seed=seed, rank=rank)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=device == "cuda")

