"""flash-attn-4's varlen kernels against PyTorch's sdpa, one head size at a time: forward output and query gradient
of a causal packed row of four documents (37, 80, 11 and 32 tokens; 4 query heads, 2 key/value heads, bf16), each
document through sdpa alone as the reference. Prints, per head size, the largest output difference and the largest
query-gradient difference relative to the reference's largest gradient (bf16 rounding is a few 1e-3).

    python benchmarks/fa4_head_sizes.py          # on an SM90/SM100 GPU with flash-attn-4 installed

Measured on an H100 with flash-attn-4 4.0.0b40 (benchmarks/fa4-head-sizes-h100.txt): heads of 16 give a correct
forward and a wrong backward, which is why runner.decide.rules.FA4_MIN_HEAD_DIM is 32.
"""

from __future__ import annotations

import sys

import torch


def main() -> int:
    from flash_attn.cute import flash_attn_varlen_func

    bounds = [0, 37, 117, 128, 160]
    cu = torch.tensor(bounds, device="cuda", dtype=torch.int32)
    for head_dim in (16, 32, 64, 128):
        torch.manual_seed(0)
        q, k, v = (torch.randn(160, h, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for h in (4, 2, 2))
        out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
        dq = q.grad.clone()
        q.grad = None
        ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
            *(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), is_causal=True, enable_gqa=True)[0].transpose(0, 1)
            for a, b in zip(bounds[:-1], bounds[1:])])
        ref.float().sum().backward()
        print(f"head size {head_dim}: output max |diff| {float((out - ref).abs().max()):.2e}, query gradient max "
              f"|diff| / max |ref| {float((dq - q.grad).abs().max() / q.grad.abs().max()):.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
