"""Varlen attention through flash-attn-4's Hopper/Blackwell kernels, with `varlen_attn`'s signature.

PyTorch's own `varlen_attn` runs the FlashAttention-2 kernels, which on an H200 run well below the matmul rate on
packed conversations of one to two thousand tokens (benchmarks/attention-h200.txt); flash-attn-4
(the `flash-attn-4` package, CuTe DSL kernels compiled at first use) uses Hopper's warpgroup matrix instructions.
On real SFT data attention is the larger part of a 32k step, so this is the kernel that matters most there.

The kernels are wrapped as two custom ops (forward, backward) with fake implementations, so a compiled decoder
layer sees one opaque call, as it sees `varlen_attn`, and never traces into the kernel compiler. PyTorch's own
"FA4" switch (`torch.nn.attention.activate_flash_attention_impl`) is not used: it replaces every flash kernel of
the process and is tied to one flash-attn-4 interface (PyTorch 2.11's breaks on 4.0.0b40's five return values).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from runner.decide.support import fa4_available as available  # noqa: F401 - the engine asks here
from runner.decide.support import has_cute as has_cute  # noqa: F401

MODULE = "flash_attn.cute.interface"
PERSIST = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
KERNELS_DIR = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"


def _interface() -> Any:
    keep_kernels()
    return importlib.import_module(MODULE)


def keep_kernels() -> None:
    """Have flash-attn-4 keep its compiled kernels on disk, in the runner's cache folder (runner.machine.cache_dir).
    It compiles each kernel at its first call in a process, which kept kernels make several times shorter
    (benchmarks/packcheck-h200.md). Kept, the packing check's compile serves
    the run's ranks after it (all but the one or two kernels the run's own sizes select) and every later launch on
    the machine; flash-attn-4 keys each kernel by its own sources, package versions and shapes. Read when
    flash-attn-4 is first imported, so set before; a user's own setting of either variable wins."""
    if PERSIST not in os.environ:
        from runner.machine import cache_dir

        os.environ[PERSIST] = "1"
        os.environ.setdefault(KERNELS_DIR, str(cache_dir() / "fa4-kernels"))


def _window(left: int) -> tuple[bool, int | None, int | None]:
    """(causal, left, right) as flash-attn-4 takes them: causal alone, or a causal sliding window."""
    return (True, None, None) if left < 0 else (False, left, 0)


@torch.library.custom_op("sft_tui::fa4_varlen_fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int,
         max_k: int, scale: float, left: int) -> tuple[torch.Tensor, torch.Tensor]:
    causal, wl, wr = _window(left)
    out, lse, *_ = _interface()._flash_attn_fwd(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, softmax_scale=scale,
        causal=causal, window_size_left=wl, window_size_right=wr, return_lse=True)
    return out, lse


@_fwd.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, scale, left):
    return q.new_empty(*q.shape[:2], v.shape[-1]), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)


@torch.library.custom_op("sft_tui::fa4_varlen_bwd", mutates_args=())
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
         cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, scale: float,
         left: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    causal, wl, wr = _window(left)
    dq, dk, dv = _interface()._flash_attn_bwd(
        q, k, v, out, dout.contiguous(), lse, softmax_scale=scale, causal=causal, window_size_left=wl,
        window_size_right=wr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)[:3]
    return dq, dk, dv


@_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, left):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, scale, left = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, left)


def _backward(ctx: Any, dout: torch.Tensor, _dlse: Any) -> tuple[Any, ...]:
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


_fwd.register_autograd(_backward, setup_context=_setup)


def varlen_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                max_q: int, max_k: int, *, scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                enable_gqa: bool = False) -> torch.Tensor:
    """torch.nn.attention.varlen.varlen_attn's contract ([tokens, heads, head_dim] q/k/v, cumulative document
    bounds; keys may have fewer heads than queries) on flash-attn-4. window_size (left, right) counts as
    flash-attn does; right must be 0 (causal)."""
    left, right = (int(x) for x in window_size)
    if right != 0:
        raise ValueError(f"flash-attn-4 varlen here is causal: window_size right must be 0, got {right}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return _fwd(q, k, v, cu_q, cu_k, max_q, max_k, float(scale), left)[0]
