"""AdamW over bf16 weights that learns like fp32 master weights: the update is computed in fp32 and written back to
bf16 with stochastic rounding, from noise keyed by (seed, rank, step, parameter, element).

Why: bf16 has 8 bits of significand, so an update of about lr on a weight of magnitude w is rounded away when
lr / w < 2^-9 (at lr 1e-5 and w 0.02, every one). Rounding up with probability equal to the lost fraction keeps the
expected weight equal to the fp32 one, at 8 bytes per parameter (bf16 weights, gradients and both moments).

Why the noise is a hash and not a generator: a step is a pass over every weight, and its cost is the bytes it moves.
Eager, the update makes about a dozen fp32 passes plus a drawn noise tensor (~180 bytes per parameter: a fifth of a 32k
step for a 3B model on an H100, benchmarks/README.md). On CUDA the update is one Triton kernel launch over all
parameters (`optim_kernel.py`) that reads weight, gradient and both moments and writes three of them back (14 bytes per
parameter, as torch's fused AdamW), which needs noise made inside the kernel: an integer hash of the element's index
and a per-(step, parameter) key. The same function runs eagerly (in chunks, on CPU): the noise of an element does not
depend on how the tensor is cut.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Iterable

import torch

LOW_BITS = 1 << 16
"""An fp32 holds 16 more significand bits than a bf16: the bits stochastic rounding decides on."""
M32 = 0xFFFFFFFF
MIX = 0x45D9F3B
"""Multiplier of a 32-bit integer mixer (a bijection with good avalanche); below 2**31, so int64 products of 32-bit
values never overflow."""


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of an FSDP2 DTensor (the tensor itself otherwise): the step is elementwise."""
    return getattr(t, "_local_tensor", t)


CHUNK = 1 << 24
"""Elements updated at once when eager: the fp32 temporaries stay near a dozen × 64 MiB however large a parameter is."""


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """Mix the 32-bit values held in an int64 tensor (every output bit depends on every input bit)."""
    x = ((x >> 16) ^ x) * MIX & M32
    x = ((x >> 16) ^ x) * MIX & M32
    return (x >> 16) ^ x


def rounding_noise(numel: int, key: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Uniform integers in [0, 2^16) for elements offset .. offset+numel of a tensor, fixed by the int64 `key`."""
    idx = torch.arange(offset, offset + numel, dtype=torch.int64, device=key.device)
    x = _mix32(_mix32((idx ^ (key & M32)) & M32) ^ (key >> 32) & M32)
    return (x & (LOW_BITS - 1)).to(torch.int32)


def stochastic_round(src: torch.Tensor, key: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """src (fp32, flat) rounded to one of its two bf16 neighbours, up with probability the fraction of the gap it lies
    above the lower one: adds uniform noise below the kept bits, then truncates. Returns a bf16 tensor."""
    bits = src.view(torch.int32)
    # Truncating the sum's low 16 bits leaves an exact bf16 value in fp32 form: the cast does not round.
    return ((bits + rounding_noise(src.numel(), key, offset)) & -LOW_BITS).view(torch.float32).to(torch.bfloat16)


def stochastic_round_(dst: torch.Tensor, src: torch.Tensor, key: torch.Tensor | int, offset: int = 0) -> None:
    """In place: dst (bf16) = src (fp32) stochastically rounded with the noise of `key`."""
    key = torch.as_tensor(key, dtype=torch.int64, device=src.device)
    dst.view(-1).copy_(stochastic_round(src.contiguous().view(-1), key, offset))


def adamw_update_(w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, hp: torch.Tensor,
                  key: torch.Tensor, offset: int = 0) -> None:
    """One AdamW update of flat pieces of a parameter and its states, in fp32, written back in their dtypes (the
    weight stochastically rounded when bf16). hp = [beta1, beta2, eps, 1 - lr·wd, lr / (1 - beta1^n),
    1 - beta2^n] as an fp32 tensor on the weights' device, so a compiled update never sees a changing constant."""
    b1, b2, eps, decay, step_size, bc2 = hp.unbind()
    gf = g.float()
    mf = m.float() * b1 + gf * (1 - b1)
    vf = v.float() * b2 + gf * gf * (1 - b2)
    new = w.float() * decay - step_size * mf / ((vf / bc2).sqrt() + eps)
    m.copy_(mf)
    v.copy_(vf)
    if w.dtype == torch.bfloat16:
        w.copy_(stochastic_round(new, key, offset))
    else:
        w.copy_(new)


def _on_device(values: list[float] | list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host-made tensor on `device` without a host sync (pinned memory, asynchronous copy): the training
    step queues its work ahead of the GPU and nothing in it may wait for the GPU."""
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@functools.cache
def _have_triton() -> bool:
    """Whether the kernel can run: CUDA builds of torch ship triton; without it the update runs eagerly (slower).
    Asked once per process, not at every step."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def step_seed(seed: int, rank: int, step: int) -> int:
    """One key per (run seed, rank, optimizer step): replays and resumes draw the same bits."""
    return (seed * 1_000_003 + rank * 7_919 + step * 104_729) % (2**63 - 1)


def param_key(seed: int, rank: int, step: int, index: int) -> int:
    """The step's key for the parameter numbered `index`."""
    return (step_seed(seed, rank, step) + index * 2_654_435_761) % (2**63 - 1)


class StochasticAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments) whose states live in the parameters' dtype and whose
    weight update is stochastically rounded when the parameters are bf16. Parameters of another dtype are updated
    exactly (plain rounding is exact for fp32). `fused`: one Triton kernel launch for all parameters of a dtype (the
    default on CUDA)."""

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, seed: int = 0, rank: int = 0,
                 fused: bool | None = None) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed, self.rank, self.fused = seed, rank, fused
        self.kernel_error: str | None = None

    @staticmethod
    def _hyper(group: dict[str, Any], n: int) -> tuple[float, float, float, float, float, float]:
        b1, b2 = group["betas"]
        lr = group["lr"]
        return (b1, b2, group["eps"], 1 - lr * group["weight_decay"], lr / (1 - b1**n), 1 - b2**n)

    @staticmethod
    def _eager(tensors: list[torch.Tensor], hp: torch.Tensor, key: torch.Tensor) -> None:
        """One parameter's update, in chunks (bounded fp32 temporaries)."""
        if all(t.is_contiguous() for t in tensors):
            flat = [t.view(-1) for t in tensors]
            for start in range(0, flat[0].numel(), CHUNK):
                adamw_update_(*(t[start:start + CHUNK] for t in flat), hp, key, start)
            return
        work = [t.contiguous().view(-1) for t in tensors]  # a non-contiguous piece: updated through copies
        adamw_update_(*work, hp, key)
        for t, c in zip(tensors, work):
            t.copy_(c.view_as(t))

    def _kernel(self, items: list[tuple[list[torch.Tensor], int]], hp: tuple[float, ...]) -> bool:
        """The updates of `items` ((tensors, key) of parameters of one dtype on one device) by one launch of the
        Triton kernel; False (and the eager update from then on) when the kernel cannot be built here, with a
        warning once: a slower step, not a lost run. The first launch builds it, before it writes anything, so a
        failure leaves the parameters as they were."""
        if self.kernel_error is not None:
            return False
        try:
            from runner.train.optim_kernel import adamw_update_kernel_

            adamw_update_kernel_(items, hp)  # contiguous tensors: the kernel reads addresses and sizes only
            return True
        except Exception as e:  # noqa: BLE001 - any build failure of the kernel falls back to the same update, eager
            self.kernel_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"warning: the stochastic-rounding AdamW kernel could not run ({self.kernel_error}); the update "
                  "runs eagerly (the same arithmetic, slower)", file=sys.stderr, flush=True)
            return False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 - torch.optim.Optimizer's contract
        loss = closure() if closure is not None else None
        # Parameters with a gradient, numbered in a fixed order (their index picks their noise), by group and device.
        batches: dict[tuple[int, torch.device], list[tuple[int, list[torch.Tensor]]]] = {}
        groups: dict[int, dict[str, Any]] = {}
        steps: list[torch.Tensor] = []
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                steps.append(state["step"])
                tensors = [_local(t) for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])]
                batches.setdefault((id(group), tensors[0].device), []).append((index, tensors))
                groups[id(group)] = group
                index += 1
        # Every parameter steps together: one count, the step tensors (kept per parameter, as torch's AdamW keeps
        # them, for checkpoints) advanced by one call rather than one each (host time is the step's cost here).
        if steps:
            torch._foreach_add_(steps, 1)
        n = int(steps[0].item()) if steps else 0
        for (gid, device), items in batches.items():
            hp = self._hyper(groups[gid], n)
            kernel = self.fused if self.fused is not None else device.type == "cuda" and _have_triton()
            eager: list[tuple[list[torch.Tensor], int]] = []
            # One launch per dtype pair (the kernel reads one weight dtype and one gradient dtype).
            by_dtype: dict[tuple[torch.dtype, torch.dtype], list[tuple[list[torch.Tensor], int]]] = {}
            for i, ts in items:
                key = param_key(self.seed, self.rank, n, i)
                if kernel and all(t.is_contiguous() for t in ts):
                    by_dtype.setdefault((ts[0].dtype, ts[1].dtype), []).append((ts, key))
                else:
                    eager.append((ts, key))
            for same in by_dtype.values():
                if not self._kernel(same, hp):
                    eager += same
            if eager:  # hp made once per group, without a host sync (see _on_device)
                hp_tensor = _on_device(list(hp), torch.float32, device)
                for ts, key in eager:
                    self._eager(ts, hp_tensor, _on_device([key], torch.int64, device)[0])
        return loss


def allocate_states(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    """Make the AdamW states of `params` now, as the first step would make them (zeros; torch's step counter on the
    device where its fused AdamW keeps it). Made lazily, they would fill the blocks the first backward freed, and
    the second step's activations, which need those blocks whole, would no longer find them: runs that fit their
    first step then ran out of memory in the second (long blocks on an H100, benchmarks/long-blocks-h200/). Made
    before the first forward, they sit with the weights and every step reuses the same blocks."""
    from torch.optim.optimizer import _get_scalar_dtype

    wanted = {id(p) for p in params}
    for group in opt.param_groups:
        for p in group["params"]:
            if id(p) not in wanted or opt.state[p]:
                continue
            if isinstance(opt, StochasticAdamW):
                step = torch.zeros((), dtype=torch.float32)
            elif group.get("fused") or group.get("capturable"):
                step = torch.zeros((), dtype=_get_scalar_dtype(is_fused=group.get("fused")), device=p.device)
            else:
                step = torch.tensor(0.0, dtype=_get_scalar_dtype())
            opt.state[p].update(step=step, exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                                exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))


def build_optimizer(params: list[torch.nn.Parameter], precision: str, lr: float, betas: tuple[float, float],
                    weight_decay: float, device: str, seed: int, rank: int) -> torch.optim.Optimizer:
    """The native engine's optimizer for a resolved train.optimizer_precision."""
    if precision == "bf16_stochastic":
        return StochasticAdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, seed=seed, rank=rank)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=device == "cuda")
