"""Attention whose backward runs one group of KV heads at a time (a tiled layer's, past a length: runner.facts.tiling
`attention_head_groups`).

A flash kernel's varlen backward allocates, beside the q, k and v gradients it returns, dq in fp32 and, under
grouped-query attention, the k and v gradients of every query head before it sums them per KV head: 8 bytes × q_dim a
token, 32 KiB for an 8B or a 4B layout, 32 GiB at a million tokens, more than a tiled layer keeps. Heads never mix in
attention, so the block's attention is the concatenation of each KV-head group's (that KV head and the query heads
that read it): `HeadGroups` runs forward without keeping the kernel's graph (it keeps q, k and v, which the kernel
would keep too), and in backward recomputes one group's attention at a time and takes its gradients, so the
kernel's workspace is one group's. The cost: one more attention forward per layer, in backward.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch


def _slices(q: torch.Tensor, k: torch.Tensor, groups: int) -> list[tuple[slice, slice]]:
    """(query heads, KV heads) of each group: query head h reads KV head h // (heads_q / heads_kv), so contiguous
    runs of each pair up."""
    per_q, per_kv = q.shape[1] // groups, k.shape[1] // groups
    return [(slice(g * per_q, (g + 1) * per_q), slice(g * per_kv, (g + 1) * per_kv)) for g in range(groups)]


def _forward(attend: Callable[..., torch.Tensor], groups: int, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> torch.Tensor:
    out = q.new_empty(*q.shape[:2], v.shape[-1])
    with torch.no_grad():
        for hq, hk in _slices(q, k, groups):
            out[:, hq] = attend(q[:, hq].contiguous(), k[:, hk].contiguous(), v[:, hk].contiguous())
    return out


class HeadGroups(torch.autograd.Function):
    """out = attend(q, k, v) for q, k, v of [tokens, heads, head_dim], computed and differentiated one KV-head group
    at a time (see the module docstring). `attend` holds the documents' boundaries and the kernel's options."""

    @staticmethod
    def forward(ctx: Any, attend: Callable[..., torch.Tensor], groups: int, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        ctx.attend, ctx.groups = attend, groups
        ctx.save_for_backward(q, k, v)
        return _forward(attend, groups, q, k, v)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        q, k, v = ctx.saved_tensors
        grads = [torch.empty_like(x) for x in (q, k, v)]
        for hq, hk in _slices(q, k, ctx.groups):
            leaves = [x[:, h].detach().contiguous().requires_grad_() for x, h in ((q, hq), (k, hk), (v, hk))]
            with torch.enable_grad():
                out = ctx.attend(*leaves)
            parts = torch.autograd.grad(out, leaves, grad_out[:, hq].contiguous())
            for grad, h, part in zip(grads, (hq, hk, hk), parts, strict=True):
                grad[:, h] = part
        return (None, None, *grads)


def attend_in_groups(attend: Callable[..., torch.Tensor], groups: int, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> torch.Tensor:
    """`attend(q, k, v)` one of `groups` KV-head groups at a time (a count that does not divide the KV heads falls
    back to their greatest common divisor), its backward too where there are gradients to take. Without them the
    groups run all the same: a forward run again without gradients (a regenerated layer input) then makes the
    kernel calls, and the bits, of the forward it repeats."""
    groups = math.gcd(groups, k.shape[1])
    if groups <= 1:
        return attend(q, k, v)
    if not torch.is_grad_enabled() or not any(x.requires_grad for x in (q, k, v)):
        return _forward(attend, groups, q, k, v)
    return HeadGroups.apply(attend, groups, q, k, v)
