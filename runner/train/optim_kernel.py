"""The stochastic-rounding AdamW update of many parameters as one Triton kernel launch (CUDA).

Why a kernel of our own and not torch.compile: the update must read weight, gradient and both moments once and
write three of them back (14 bytes per parameter, as torch's fused AdamW), with the rounding noise made inside the
kernel. Compiled per parameter, each call paid the compiled wrapper's host cost, every step for every parameter
(benchmarks/README.md); compiled once over all of them, the graph took minutes to compile.

Why one launch for all parameters: a Triton launch costs the host tens of microseconds, and the training step is
queued by the host ahead of the GPU. One launch per parameter cost more host time a step than the update takes on
the GPU (benchmarks/README.md), and a step whose host work runs behind its GPU work is as slow as the host.
So the launch takes a table, one row per parameter (its four tensors' addresses, its size, its noise key), and each
program finds its parameter by binary search over the parameters' first block numbers: a few loads from a table of a
few kilobytes, where the block's own work moves 7 KB.

The noise is `runner.train.optim.rounding_noise`'s hash, written again in 32-bit unsigned arithmetic (the eager
version masks int64 products to 32 bits: the same values); tests/unit/test_optim.py checks the two agree bit for bit
under Triton's interpreter, and benchmarks/optim_gpu_check.py on a GPU (where fused multiply-adds round the fp32
moments differently from torch's separate multiply and add, now and then by one bf16 step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 512
WARPS = 4
"""Elements per program and warps: the fastest of the sweep on an H200 over 1.72B bf16 parameters
(benchmarks/precision-h200/optim-kernel-sweep.txt; the rates in benchmarks/README.md)."""
ROW = 7
"""A table row: weight, gradient, exp_avg, exp_avg_sq addresses, numel, key low 32 bits, key high 32 bits."""
TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float32: tl.float32, torch.float16: tl.float16}


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


# The count of parameters is a plain value: never compiled in as a constant (Triton specialises an int equal to 1).
@triton.jit(do_not_specialize=["count"])
def _adamw_sr(starts_ptr, table_ptr, count, b1, b2, eps, decay, step_size, bc2,
              W: tl.constexpr, G: tl.constexpr, ROUND: tl.constexpr, SEARCH: tl.constexpr, ROW: tl.constexpr,
              BLOCK: tl.constexpr):
    # This program's parameter: the last whose first block is at or before it (starts[count] is the total, so
    # starts[lo] <= pid < starts[hi] holds throughout; SEARCH >= log2(count) halvings leave hi = lo + 1).
    pid = tl.program_id(0).to(tl.int64)
    lo = 0
    hi = count
    for _ in tl.static_range(SEARCH):
        mid = (lo + hi) // 2
        before = tl.load(starts_ptr + mid) <= pid
        lo = tl.where(before, mid, lo)
        hi = tl.where(before, hi, mid)
    row = table_ptr + lo.to(tl.int64) * ROW
    w_ptr = tl.load(row).to(tl.pointer_type(W))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(G))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(W))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(W))
    n = tl.load(row + 4)
    key_lo = tl.load(row + 5).to(tl.uint32)
    key_hi = tl.load(row + 6).to(tl.uint32)
    # fp32 arithmetic throughout, as the eager update's: a GPU launch passes float arguments as fp32, Triton's
    # interpreter as Python floats, whose `1 - b1` would be computed in fp64.
    b1, b2, eps = tl.cast(b1, tl.float32), tl.cast(b2, tl.float32), tl.cast(eps, tl.float32)
    decay, step_size, bc2 = tl.cast(decay, tl.float32), tl.cast(step_size, tl.float32), tl.cast(bc2, tl.float32)
    offs = (pid - tl.load(starts_ptr + lo)) * BLOCK + tl.arange(0, BLOCK)
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
        x = _mix32(_mix32(offs.to(tl.uint32) ^ key_lo) ^ key_hi)
        # Uniform noise below the 16 bits a bf16 drops, then truncation: the sum's low bits cleared leave an exact
        # bf16 value in fp32 form, so the cast does not round again.
        bits = (new.to(tl.uint32, bitcast=True) + (x & 0xFFFF)) & 0xFFFF0000
        tl.store(w_ptr + offs, bits.to(tl.float32, bitcast=True).to(W), mask=mask)
    else:  # fp32: nothing to round
        tl.store(m_ptr + offs, m.to(W), mask=mask)
        tl.store(v_ptr + offs, v.to(W), mask=mask)
        tl.store(w_ptr + offs, new.to(W), mask=mask)


def _table(items: list[tuple[list[torch.Tensor], int]], device: torch.device) -> tuple[torch.Tensor, int]:
    """([first block of each parameter..., total blocks, then ROW values per parameter] as one int64 tensor on
    `device`, copied from pinned memory without waiting for the GPU (the addresses change when gradients do);
    the total number of blocks)."""
    starts, rows = [0], []
    for (w, g, m, v), key in items:
        n = w.numel()
        starts.append(starts[-1] + -(-n // BLOCK))  # not triton.cdiv: a jit function, slow to call from the host
        rows += [w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), n, key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF]
    host = torch.tensor(starts + rows, dtype=torch.int64)
    return (host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host), starts[-1]


def adamw_update_kernel_(items: list[tuple[list[torch.Tensor], int]], hp: tuple[float, float, float, float, float, float]
                         ) -> None:
    """In place, one update of each (weight, gradient, exp_avg, exp_avg_sq) with its noise key: contiguous tensors
    on one device, the weights and moments of one dtype, the gradients of one dtype. hp as in
    optim.adamw_update_."""
    items = [(ts, key) for ts, key in items if ts[0].numel()]
    if not items:
        return
    (w, g, _, _), _ = items[0]
    count = len(items)
    buf, blocks = _table(items, w.device)
    b1, b2, eps, decay, step_size, bc2 = hp
    _adamw_sr[(blocks,)](buf, buf[count + 1:], count, b1, b2, eps, decay, step_size, bc2,
                    W=TL_DTYPES[w.dtype], G=TL_DTYPES[g.dtype], ROUND=w.dtype == torch.bfloat16,
                    SEARCH=max(1, count.bit_length()), ROW=ROW, BLOCK=BLOCK, num_warps=WARPS)
