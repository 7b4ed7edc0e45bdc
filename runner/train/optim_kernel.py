"""The stochastic-rounding AdamW update of one parameter as one Triton kernel (CUDA).

Why a kernel of our own and not torch.compile: the update must read weight, gradient and both moments once and
write three of them back (14 bytes per parameter, as torch's fused AdamW), with the rounding noise made inside the
kernel. Compiled per parameter, each call paid the compiled wrapper's host cost (~0.6 ms, ~0.16 s a step for the
~255 parameters of a 3B model); compiled once over all of them, the graph took minutes to compile. A Triton launch
costs tens of microseconds, compiles once per dtype, and takes the hyper-parameters and keys as plain arguments, so
nothing is copied to the GPU and nothing waits for it.

The noise is `runner.train.optim.rounding_noise`'s hash, written again in 32-bit unsigned arithmetic (the eager
version masks int64 products to 32 bits: the same values); tests/unit/test_optim.py checks the two agree bit for bit
under Triton's interpreter, and benchmarks/optim_gpu_check.py on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _mix32(x):
    x = ((x >> 16) ^ x) * 0x45D9F3B
    x = ((x >> 16) ^ x) * 0x45D9F3B
    return (x >> 16) ^ x


@triton.jit
def _bf16_nearest(x):
    """fp32 → bf16 rounded to nearest, ties to even, as torch's copy into a bf16 tensor rounds. Done on the bits:
    Triton's interpreter casts by truncation whatever rounding the cast asks for, and the kernel must be checkable
    there."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)


# The keys and the size are plain values: never compiled in as constants (Triton specialises an int equal to 1).
@triton.jit(do_not_specialize=["n", "key_lo", "key_hi"])
def _adamw_sr(w_ptr, g_ptr, m_ptr, v_ptr, n, b1, b2, eps, decay, step_size, bc2, key_lo, key_hi,
              ROUND: tl.constexpr, BLOCK: tl.constexpr):
    # fp32 arithmetic throughout, as the eager update's: a GPU launch passes float arguments as fp32, Triton's
    # interpreter as Python floats, whose `1 - b1` would be computed in fp64.
    b1, b2, eps = tl.cast(b1, tl.float32), tl.cast(b2, tl.float32), tl.cast(eps, tl.float32)
    decay, step_size, bc2 = tl.cast(decay, tl.float32), tl.cast(step_size, tl.float32), tl.cast(bc2, tl.float32)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32) * b1 + g * (1 - b1)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32) * b2 + g * g * (1 - b2)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # IEEE-rounded division and square root, as torch's kernels use (Triton's `/` and tl.sqrt are approximate).
    new = w * decay - tl.div_rn(step_size * m, tl.sqrt_rn(tl.div_rn(v, bc2)) + eps)
    if ROUND:  # bf16 weights, and so bf16 moments (the states take the parameters' dtype)
        tl.store(m_ptr + offs, _bf16_nearest(m), mask=mask)
        tl.store(v_ptr + offs, _bf16_nearest(v), mask=mask)
        x = _mix32(_mix32(offs.to(tl.uint32) ^ key_lo.to(tl.uint32)) ^ key_hi.to(tl.uint32))
        # Uniform noise below the 16 bits a bf16 drops, then truncation: the sum's low bits cleared leave an exact
        # bf16 value in fp32 form, so the cast does not round again.
        bits = (new.to(tl.uint32, bitcast=True) + (x & 0xFFFF)) & 0xFFFF0000
        tl.store(w_ptr + offs, bits.to(tl.float32, bitcast=True).to(w_ptr.dtype.element_ty), mask=mask)
    else:  # fp32: nothing to round
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(w_ptr + offs, new, mask=mask)


def adamw_update_kernel_(w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                         hp: tuple[float, float, float, float, float, float], key: int) -> None:
    """One parameter's update in place (flat, contiguous tensors on one GPU). hp as in optim.adamw_update_."""
    n = w.numel()
    if n == 0:
        return
    b1, b2, eps, decay, step_size, bc2 = hp
    _adamw_sr[(triton.cdiv(n, BLOCK),)](w, g, m, v, n, b1, b2, eps, decay, step_size, bc2,
                                        key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF,
                                        ROUND=w.dtype == torch.bfloat16, BLOCK=BLOCK)
