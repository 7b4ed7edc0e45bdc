"""This project's own per-document forward for the gated-delta layers of qwen3_5 / qwen3_5_moe and qwen3_next:
packed documents each start from a zero recurrent state and a zero convolution history.

It reads only the layer's parameters (its input projections, conv1d, A_log, dt_bias, the gated norm, out_proj) and
its sizes, which checkpoints pin, not the module functions transformers' forward calls: a
release that moves or renames those cannot take packing away from the family. The math is the gated delta rule
(DeltaNet with a per-token decay), computed chunk by chunk as transformers' and flash-linear-attention's PyTorch
references compute it; the packing check (runner.gate.packcheck) compares it with transformers' own forward of each
document alone, tests/unit/test_packcheck.py with flash-linear-attention's reference of the rule where that is
installed, and where flash-linear-attention and causal-conv1d are installed the layer's own forward runs instead
(those kernels read cu_seqlens themselves).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

COMMON_PARTS = ("conv1d", "A_log", "dt_bias", "norm", "out_proj")
LAYOUTS = {"qwen3_5": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
           "qwen3_next": ("in_proj_qkvz", "in_proj_ba")}
"""The projections of each layout: Qwen3.5 projects q/k/v, z, b and a apart; Qwen3-Next fuses them per key head."""
SIZES = ("key_dim", "value_dim", "head_k_dim", "head_v_dim", "num_k_heads", "num_v_heads")
CHUNK = 64


def layout_of(parts: Any) -> str | None:
    """The layout whose parts `parts(name)` says all exist (None when neither)."""
    for name, projections in LAYOUTS.items():
        if all(parts(p) for p in projections + COMMON_PARTS):
            return name
    return None


def has_own_path(module: torch.nn.Module) -> bool:
    """Whether this gated-delta layer has a layout the own path reads."""
    return layout_of(lambda n: hasattr(module, n)) is not None and all(hasattr(module, n) for n in SIZES)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      chunk: int = CHUNK) -> torch.Tensor:
    """The gated delta rule over one document from a zero state: q, k [T, H, dk] (L2-normalised here), v [T, H, dv],
    g (log decay) and beta [T, H]; returns [T, H, dv] in float32.

    State S (dk x dv) per head: S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - (exp(g_t) S_{t-1})^T k_t))^T, output
    o_t = S_t^T q_t / sqrt(dk). Within a chunk the updates are condensed by the UT transform (a unit lower
    triangular solve), across chunks the state is carried.
    """
    length = q.shape[0]
    q, k = _l2norm(q.float()), _l2norm(k.float())
    q, k, v, g, beta = (x.float().transpose(0, 1) for x in (q, k, v, g, beta))  # heads first
    q = q * q.shape[-1] ** -0.5
    pad = (chunk - length % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    heads, dk, dv = q.shape[0], q.shape[-1], v.shape[-1]
    q, k, v = (x.reshape(heads, -1, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(heads, -1, chunk), beta.reshape(heads, -1, chunk)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = g.cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * decay  # lower triangular with beta k.k on the diagonal
    ut = ut.tril(-1) + torch.eye(chunk, device=q.device)
    new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(ut, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    q_read = q * cum.exp()[..., None]
    k_write = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]
    state = q.new_zeros(heads, dk, dv)
    outs = []
    for i in range(q.shape[1]):
        fresh = new_v[:, i] - k_cum[:, i] @ state
        outs.append(q_read[:, i] @ state + intra[:, i] @ fresh)
        state = state * chunk_decay[:, i] + k_write[:, i].transpose(-1, -2) @ fresh
    out = torch.cat(outs, dim=1)[:, :length]
    return out.transpose(0, 1)


def _conv(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The causal depthwise convolution (and its activation) over one document, x [channels, T]."""
    conv = module.conv1d
    width = conv.weight.shape[-1]
    y = F.conv1d(F.pad(x[None], (width - 1, 0)), conv.weight, conv.bias, groups=x.shape[0])[0]
    return F.silu(y) if getattr(module, "activation", "silu") in ("silu", "swish") else y


def _projections(m: torch.nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(q/k/v before the convolution [T, 2 key_dim + value_dim], z [T, v heads, dv], b, a [T, v heads])."""
    length = h.shape[0]
    if hasattr(m, "in_proj_qkv"):
        return (m.in_proj_qkv(h), m.in_proj_z(h).reshape(length, -1, m.head_v_dim), m.in_proj_b(h),
                m.in_proj_a(h))
    # Qwen3-Next: per key head, [q, k, v of its value heads, z of its value heads] and [b, a].
    per = m.num_v_heads // m.num_k_heads
    qkvz = m.in_proj_qkvz(h).reshape(length, m.num_k_heads, -1)
    q, k, v, z = torch.split(qkvz, [m.head_k_dim, m.head_k_dim, per * m.head_v_dim, per * m.head_v_dim], dim=-1)
    b, a = torch.split(m.in_proj_ba(h).reshape(length, m.num_k_heads, -1), [per, per], dim=-1)
    qkv = torch.cat([q.reshape(length, -1), k.reshape(length, -1), v.reshape(length, -1)], dim=-1)
    return qkv, z.reshape(length, -1, m.head_v_dim), b.reshape(length, -1), a.reshape(length, -1)


def _document(module: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The layer's output for one document's hidden states h [T, hidden]."""
    m = module
    length = h.shape[0]
    mixed, z, b, a = _projections(m, h)
    qkv = _conv(m, mixed.transpose(0, 1)).transpose(0, 1)
    q, k, v = torch.split(qkv, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
    q, k = q.reshape(length, -1, m.head_k_dim), k.reshape(length, -1, m.head_k_dim)
    v = v.reshape(length, -1, m.head_v_dim)
    if m.num_v_heads != m.num_k_heads:  # each query/key head serves consecutive value heads
        rep = m.num_v_heads // m.num_k_heads
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    beta = b.sigmoid()
    g = -m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias)
    core = chunk_gated_delta(q, k, v, g, beta).to(h.dtype)
    core = m.norm(core.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim)).reshape(length, -1)
    return m.out_proj(core)


def _bounds(kwargs: dict[str, Any], total: int) -> list[tuple[int, int]] | None:
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None and kwargs.get("seq_idx") is not None:
        flat = kwargs["seq_idx"].reshape(-1)
        change = (torch.nonzero(flat[1:] != flat[:-1]).flatten() + 1).tolist()
        cu = [0, *change, flat.numel()]
    if cu is None:
        return None
    cu = [int(x) for x in (cu.tolist() if isinstance(cu, torch.Tensor) else cu)]
    if cu[-1] != total:
        raise ValueError(f"document boundaries end at {cu[-1]}, expected the packed length {total}")
    return [(a, b) for a, b in zip(cu[:-1], cu[1:]) if b > a]


def install_own_path(module: torch.nn.Module) -> None:
    """Route this layer's packed calls (cu_seq_lens_q / seq_idx given, no cache) through the per-document forward;
    other calls (generation with a cache, one sequence) keep the layer's own forward."""
    original = module.forward

    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        cache = kwargs.get("cache", kwargs.get("cache_params"))
        batch, length, hidden = hidden_states.shape
        bounds = None if cache is not None or args else _bounds(kwargs, batch * length)
        if bounds is None:
            return original(hidden_states, *args, **kwargs)
        flat = hidden_states.reshape(batch * length, hidden)
        return torch.cat([_document(self, flat[a:b]) for a, b in bounds]).reshape(batch, length, -1)

    module.forward = types.MethodType(forward, module)
    module._sft_own_gated_delta = True
