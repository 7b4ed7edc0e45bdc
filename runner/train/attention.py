"""Attention that keeps packed documents apart: backend choice, varlen attention for HF models, linear-layer resets.

A packed block holds several documents. Nothing may flow from one document to the next:

* full-attention layers need a block-diagonal causal mask. `varlen` (PyTorch's `varlen_attn`) and
  `flash_attention_2` read the document boundaries (`cu_seq_lens_q/k`, `max_length_q/k`) directly; `flex_attention`,
  `sdpa` and `eager` get a document mask that transformers builds itself from position_ids that restart at 0 in
  every document (`masking_utils.find_packed_sequence_indices`, used when attention_mask is None and no cache);
* recurrent layers (the gated-delta "linear_attention" layers of qwen3_next / qwen3_5) carry a state along the
  sequence and a short causal convolution; they must restart at every document. flash-linear-attention and
  causal-conv1d do that from `cu_seqlens` / `seq_idx`; transformers' PyTorch fallback cannot (5.17 ignores the
  arguments, 5.24 raises), so `install_document_reset` wraps that fallback to run document by document (exact, slower).

`packing_support(config)` says whether a model can be trained on packed blocks here; preflight refuses the run
otherwise. Masks for forwards that build them without position_ids are runner.train.masks'; which paths a family
may use and which one a run takes are runner.facts.families' and runner.decide.rules'.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from runner.decide.rules import AttentionChoice, attention_refusal
from runner.decide.rules import choose_attention as choose_attention  # benchmarks call it through this module
from runner.facts.families import GATED_DELTA, VARLEN, family_of
from runner.facts.families import recurrent_layer_types as recurrent_layer_types  # noqa: F401 - used by the engines
from runner.train.head_groups import attend_in_groups
from runner.decide.support import (  # noqa: F401 - the probes the engines and benchmarks call through here
    attention_here,
    available_kernels,
    concrete_model_class,
    flash_attn_available,
    flex_available,
    supported_attention,
    varlen_available,
)
from runner.train.masks import (  # noqa: F401
    PACKED_MASK_HOOK,
    TEXT_POSITION_ROW,
    install_packed_mask,
    install_text_positions,
    packed_mask_route,
)

# ---------------------------------------------------------------------------------------------
# Kernels and what a model class supports


def attention_for(spec: Any, config: Any, device: str) -> tuple[AttentionChoice, tuple[str, str] | None]:
    """The attention path a run of `spec` would take on `device` with the kernels installed here, and (why, fix)
    when that path cannot train it (runner.decide.support.attention_here; preflight and the TRL engine's checks)."""
    return attention_here(spec, config, device)


def attention_problem(impl: str, device: str) -> str | None:
    """Why `impl` cannot run here (None when it can)."""
    why = attention_refusal(impl, device, kernels=available_kernels(device))
    return why[0] if why else None


# ---------------------------------------------------------------------------------------------
# varlen attention as an HF attention function


def _torch_varlen_kernel() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def reference_varlen_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                          max_q: int, max_k: int, *, scale: float | None = None,
                          window_size: tuple[int, int] = (-1, -1), enable_gqa: bool = False) -> torch.Tensor:
    """varlen_attn's contract computed document by document with sdpa: runs anywhere (tests, CPU).

    window_size (left, right) as flash-attn counts it: query i sees keys i - left .. i + right (-1 = unbounded).
    """
    left, right = (int(x) for x in window_size)
    out = q.new_empty(*q.shape[:2], v.shape[-1])
    for a, b in zip(cu_q.tolist()[:-1], cu_q.tolist()[1:]):
        qs, ks, vs = (x[a:b].transpose(0, 1)[None] for x in (q, k, v))
        if enable_gqa and ks.shape[1] != qs.shape[1]:
            rep = qs.shape[1] // ks.shape[1]
            ks, vs = ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1)
        i = torch.arange(b - a)
        dist = i[:, None] - i[None, :]  # query minus key position
        allowed = torch.ones_like(dist, dtype=torch.bool)
        if left >= 0:
            allowed &= dist <= left
        if right >= 0:
            allowed &= dist >= -right
        out[a:b] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed.to(q.device), scale=scale)[0] \
            .transpose(0, 1)
    return out


_varlen: tuple[Callable[..., torch.Tensor], frozenset[str]] | None = None
"""The kernel varlen attention calls and its parameter names, resolved before any layer is compiled: the
signature is read once here rather than inside the traced attention function."""


def _kernel_params(kernel: Callable[..., Any]) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(kernel).parameters)
    except (TypeError, ValueError):
        return frozenset()


def set_varlen_kernel(kernel: Callable[..., torch.Tensor] | None) -> None:
    """Use another kernel with varlen_attn's signature (tests use `reference_varlen_attn`); None = torch's."""
    global _varlen
    _varlen = None if kernel is None else (kernel, _kernel_params(kernel))


def _varlen_choice() -> tuple[Callable[..., torch.Tensor], frozenset[str]]:
    global _varlen
    if _varlen is None:
        kernel = _torch_varlen_kernel()
        _varlen = (kernel, _kernel_params(kernel))
    return _varlen


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Document boundaries from restarting position_ids (a host sync: the engine passes cu_seqlens instead)."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    cu = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF attention function: causal attention within each document of a packed row, via varlen_attn.

    query is [batch, heads, tokens, head_dim] as transformers hands it over; documents are given by the
    `cu_seq_lens_q/k` and `max_length_q/k` keyword arguments the model was called with (flattened over the
    batch, as flash-attn expects), else derived from position_ids; with neither and no padding mask, each row is one
    sequence (a model called without packing inputs whose layers do not pass position_ids on, as Llama 4's).
    """
    if dropout:
        raise ValueError(f"varlen attention has no dropout, got attention dropout {dropout}")
    cu_q = kwargs.get("cu_seq_lens_q")
    max_q = kwargs.get("max_length_q")
    if cu_q is None:
        position_ids = kwargs.get("position_ids")
        if position_ids is not None:
            cu_q, max_q = cu_seqlens_from_position_ids(position_ids)
        elif attention_mask is None:
            rows, length = query.shape[0], query.shape[2]
            cu_q = torch.arange(0, (rows + 1) * length, length, dtype=torch.int32, device=query.device)
            max_q = length
        else:
            raise ValueError("varlen attention needs cu_seq_lens_q/max_length_q, position_ids, or rows without "
                             "padding")
    cu_k = kwargs.get("cu_seq_lens_k")
    cu_k = cu_q if cu_k is None else cu_k
    max_k = kwargs.get("max_length_k")
    max_k = max_q if max_k is None else max_k
    if query.dtype not in (torch.float16, torch.bfloat16) and query.is_cuda:
        # The flash kernels take half precision only. Under autocast over fp32 weights (TRL's one-GPU setup) RoPE's
        # elementwise math with fp32 cos/sin lifts q and k back to fp32: run at the autocast dtype, as transformers'
        # own flash path does.
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    batch, heads_q, length, head_dim = query.shape
    heads_kv = key.shape[1]
    q = query.transpose(1, 2).reshape(batch * length, heads_q, head_dim)
    k = key.transpose(1, 2).reshape(batch * length, heads_kv, head_dim)
    v = value.transpose(1, 2).reshape(batch * length, heads_kv, value.shape[-1])
    v_dim = v.shape[-1]
    if v_dim != head_dim:  # latent attention (deepseek): flash-style kernels want one head dim, as transformers pads
        v = F.pad(v, (0, head_dim - v_dim))
    kernel, params = _varlen_choice()
    extra: dict[str, Any] = {"scale": scaling}
    # Mistral, Mixtral and Phi3 give the window only as an argument; Qwen2, Gemma and GPT-OSS also on the module.
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    left = int(window) - 1 if window else -1
    if "window_size" in params:
        extra["window_size"] = (left, 0)
    else:
        if window:
            raise ValueError("this PyTorch's varlen_attn has no window_size: sliding-window layers need flex")
        extra["is_causal"] = True
    if heads_kv != heads_q:
        if "enable_gqa" in params:
            extra["enable_gqa"] = True
        else:
            rep = heads_q // heads_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    max_q, max_k = _length(max_q), _length(max_k)
    # A tiled layer's long block: the backward one KV-head group at a time (runner.train.apply.set_head_groups).
    groups = getattr(module, "head_groups", 1)
    if groups > 1:
        out = attend_in_groups(lambda q, k, v: kernel(q, k, v, cu_q, cu_k, max_q, max_k, **extra), groups,
                               q, k, v)
    else:
        out = kernel(q, k, v, cu_q, cu_k, max_q, max_k, **extra)
    return out[..., :v_dim].reshape(batch, length, heads_q, v_dim), None


def uses_varlen(model: torch.nn.Module) -> bool:
    """The model (under peft or FSDP2, which keep its config reachable) attends through varlen_attention_forward."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == VARLEN


def _length(value: Any) -> Any:
    """A document length given as an int or as an empty tensor's first size (packing_kwargs): in a compiled layer
    the size is symbolic, and the kernel's custom op takes it as such."""
    return value.shape[0] if isinstance(value, torch.Tensor) else int(value)


def register_varlen(kernel: str | None = None) -> None:
    """Make attn_implementation="varlen" loadable by transformers (idempotent), its kernel resolved now: "torch"
    (varlen_attn), "flash-attn-4" (runner.decide.rules `varlen_kernel` chooses), None = keep the current one."""
    from transformers import AttentionInterface

    from runner.decide.rules import FA4_KERNEL, TORCH_KERNEL

    if kernel == FA4_KERNEL:
        from runner.train import fa4

        set_varlen_kernel(fa4.varlen_attn)
    elif kernel == TORCH_KERNEL:
        set_varlen_kernel(None)
    if varlen_available():
        _varlen_choice()
    AttentionInterface.register(VARLEN, varlen_attention_forward)


# ---------------------------------------------------------------------------------------------
# Recurrent (linear-attention) layers


@dataclass(frozen=True)
class PackingSupport:
    """Whether packed documents stay apart in this model with what is installed, and how."""

    safe: bool
    mechanism: str
    reason: str = ""
    fix: str = ""


def _importable(module: str, name: str) -> bool:
    try:
        return getattr(importlib.import_module(module), name, None) is not None
    except Exception:  # noqa: BLE001 - a broken optional kernel package counts as absent
        return False


def gated_delta_kernels() -> dict[str, bool]:
    """Which of the kernels that honour document boundaries are importable (as transformers resolves them)."""
    return {"flash-linear-attention": _importable("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
            "causal-conv1d": _importable("causal_conv1d", "causal_conv1d_fn")}


def _gated_delta_module(config: Any) -> Any | None:
    name = family_of(config).transformers_module
    if not name:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _gated_delta_classes(module: Any) -> list[type]:
    return [obj for name, obj in vars(module).items() if isinstance(obj, type) and name.endswith("GatedDeltaNet")]


def _patch_targets(module: Any) -> tuple[str, str] | None:
    """(conv name, chunk-rule name): the module-level functions the gated-delta forward calls, if recognisable."""
    for cls in _gated_delta_classes(module):
        names = set(inspect.unwrap(cls.forward).__code__.co_names)
        conv = "causal_conv1d_fn" if "causal_conv1d_fn" in names else None
        chunk = next((n for n in ("torch_chunk_gated_delta_rule", "chunk_gated_delta_rule") if n in names), None)
        if conv and chunk and callable(getattr(module, conv, None)) and callable(getattr(module, chunk, None)):
            return conv, chunk
    return None


def _own_layout(module: Any) -> bool:
    """Whether the module's gated-delta layers have a layout runner.train.gated_delta computes itself."""
    from runner.train.gated_delta import layout_of

    for cls in _gated_delta_classes(module):
        try:
            # The class's own text: a hub-kernels install (the `kernels` package) wraps __init__ at import.
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if layout_of(lambda part: f"self.{part} =" in source) is not None:
            return True
    return False


def packing_support(config: Any) -> PackingSupport:
    """Can a model with this config train on packed blocks here without documents leaking into each other?"""
    recurrent = recurrent_layer_types(config)
    fam = family_of(config)
    if not recurrent:
        if not fam.attention_paths:
            return PackingSupport(False, "none", f"no attention path keeps packed documents apart in {fam.model_type}",
                                  "set train.packing=false (one document per block)")
        return PackingSupport(True, "attention only: document mask / cu_seqlens")
    model_type = fam.model_type
    kinds = ", ".join(sorted(recurrent))
    if recurrent <= {"linear_attention"} and fam.recurrent == GATED_DELTA:
        kernels = gated_delta_kernels()
        module = _gated_delta_module(config)
        if all(kernels.values()):
            return PackingSupport(True, "flash-linear-attention + causal-conv1d kernels fed cu_seqlens/seq_idx")
        if module is not None and _own_layout(module):
            return PackingSupport(True, f"this project's per-document gated-delta path for the {kinds} layers "
                                        "(runner.train.gated_delta; exact, slower than the kernels)")
        if module is not None and _patch_targets(module) is not None:
            missing = " and ".join(k for k, ok in kernels.items() if not ok)
            return PackingSupport(True, f"per-document PyTorch path for the {kinds} layers ({missing} not installed:"
                                        " exact but slower)")
        return PackingSupport(False, "none", f"{model_type} {kinds} layers carry a recurrent state across packed "
                                             "documents, and this transformers' PyTorch path for them cannot restart "
                                             "it per document",
                              "install flash-linear-attention and causal-conv1d, or set train.packing=false "
                              "(one document per block)")
    return PackingSupport(False, "none", f"{model_type} has recurrent layers ({kinds}) whose state would run from "
                                         "one packed document into the next, and no kernel here restarts it per "
                                         "document", "set train.packing=false (one document per block)")


def _bounds(cu_seqlens: torch.Tensor | None, seq_idx: torch.Tensor | None, length: int) -> list[tuple[int, int]] | None:
    if cu_seqlens is not None:
        cu = [int(x) for x in cu_seqlens.tolist()]
    elif seq_idx is not None:
        flat = seq_idx.reshape(-1)
        change = torch.nonzero(flat[1:] != flat[:-1]).flatten() + 1
        cu = [0, *change.tolist(), flat.numel()]
    else:
        return None
    if cu[-1] != length:
        raise ValueError(f"document boundaries end at {cu[-1]}, expected the packed length {length}")
    return [(a, b) for a, b in zip(cu[:-1], cu[1:]) if b > a]


def _per_document_conv(original: Callable[..., torch.Tensor], kernel: bool) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def conv(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             activation: str | None = None, **kwargs: Any) -> torch.Tensor:
        seq_idx = kwargs.pop("seq_idx", None)
        cu = kwargs.get("cu_seq_lens_q")
        if kernel:
            return original(hidden_states, weight, bias, activation=activation, seq_idx=seq_idx, **kwargs)
        # [batch, channels, tokens]: a packed row is flattened over the batch, as cu_seqlens counts it.
        batch, channels, length = hidden_states.shape
        bounds = _bounds(cu, seq_idx, batch * length)
        if bounds is None:
            return original(hidden_states, weight, bias, activation=activation, **kwargs)
        flat = hidden_states.transpose(0, 1).reshape(1, channels, batch * length)
        out = torch.cat([original(flat[:, :, a:b], weight, bias, activation=activation) for a, b in bounds], dim=-1)
        return out.reshape(channels, batch, length).transpose(0, 1)

    conv._sft_per_document = True  # type: ignore[attr-defined]
    return conv


def _per_document_chunk_rule(original: Callable[..., Any], kernel: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def chunk_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   *args: Any, cu_seqlens: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        seq_idx = kwargs.pop("seq_idx", None)
        if kernel:
            return original(query, key, value, g, beta, *args, cu_seqlens=cu_seqlens, **kwargs)
        for name in ("cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids"):
            kwargs.pop(name, None)
        batch, length = query.shape[:2]
        bounds = _bounds(cu_seqlens, seq_idx, batch * length)
        if bounds is None:
            return original(query, key, value, g, beta, *args, **kwargs)
        initial = kwargs.pop("initial_state", None)
        if initial is not None:
            raise ValueError("packed documents start from a zero state; got an initial_state")
        want_state = kwargs.get("output_final_state", False)
        # [batch, tokens, heads, dim] → one row: cu_seqlens count tokens over the flattened batch.
        q, k, v, gg, bb = (x.reshape(1, batch * length, *x.shape[2:]) for x in (query, key, value, g, beta))
        outs, states = [], []
        for a, b in bounds:
            o, s = original(q[:, a:b], k[:, a:b], v[:, a:b], gg[:, a:b], bb[:, a:b], *args, **kwargs)
            outs.append(o)
            states.append(s)
        out = torch.cat(outs, dim=1).reshape(batch, length, *outs[0].shape[2:])
        return out, (torch.cat(states) if want_state else None)

    chunk_rule._sft_per_document = True  # type: ignore[attr-defined]
    return chunk_rule


def install_document_reset(model: torch.nn.Module) -> str | None:
    """Make the model's gated-delta layers restart at document boundaries given cu_seqlens / seq_idx.

    Returns the mechanism used (None for models without such layers). With both kernels installed the
    calls pass straight through; otherwise transformers' PyTorch functions are wrapped to run once per
    document. The wrap replaces module-level functions of the model's transformers module, and only changes
    calls that carry cu_seqlens / seq_idx (which that fallback would otherwise ignore or refuse).
    """
    config = getattr(model, "config", None)
    if config is None or not recurrent_layer_types(config):
        return None
    support = packing_support(config)
    if not support.safe:
        raise ValueError(f"{support.reason} (fix: {support.fix})")
    from runner.train.gated_delta import has_own_path, install_own_path

    kernels = gated_delta_kernels()
    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    if not all(kernels.values()):
        for m in layers:
            if has_own_path(m) and not getattr(m, "_sft_own_gated_delta", False):
                install_own_path(m)
    modules = {type(m).__module__ for m in layers if not getattr(m, "_sft_own_gated_delta", False)}
    for name in modules:
        module = sys.modules[name]
        targets = _patch_targets(module)
        if targets is None:
            if all(kernels.values()):
                continue
            raise ValueError(f"{name}: cannot find the gated-delta functions to wrap per document")
        conv_name, chunk_name = targets
        conv, chunk = getattr(module, conv_name), getattr(module, chunk_name)
        if not getattr(conv, "_sft_per_document", False):
            setattr(module, conv_name, _per_document_conv(conv, kernels["causal-conv1d"]))
        if not getattr(chunk, "_sft_per_document", False):
            setattr(module, chunk_name, _per_document_chunk_rule(chunk, kernels["flash-linear-attention"]))
    return support.mechanism


def packing_kwargs(batch: dict[str, Any], lengths_as_shapes: bool = False) -> dict[str, Any]:
    """The keyword arguments that carry document boundaries into an HF model's forward.

    `lengths_as_shapes` (the varlen path, whose layers the native engine compiles on a GPU): blocks have one
    length, but each brings its own number of documents (cu_seq_lens' length) and longest document (an int), and a
    compiled layer specialises on both until each has changed once; when they first change in different steps,
    late in a run, each layer structure compiles again mid-training. So cu_seq_lens' length is marked dynamic from
    the first step, and the longest document travels as the first size of an empty tensor marked the same way
    (`_length` reads it): the layers compile once, for every block."""
    out: dict[str, Any] = {"position_ids": batch["position_ids"]}
    if "cu_seqlens" in batch:
        cu, max_len = batch["cu_seqlens"], int(batch["max_len"])
        if lengths_as_shapes:
            torch._dynamo.maybe_mark_dynamic(cu, 0)
            max_len = torch.empty(max_len, 0, device=cu.device)
            torch._dynamo.maybe_mark_dynamic(max_len, 0)
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_len, max_length_k=max_len)
    if "seq_idx" in batch:
        out["seq_idx"] = batch["seq_idx"]
    return out


def keep_documents_apart(model: torch.nn.Module, packing: bool, dtype: torch.dtype) -> str | None:
    """Install what keeps packed documents apart in this model (both engines call it before LoRA and sharding):
    the per-document reset of gated-delta layers, or per-layer-type masks for a forward that builds its masks
    without position_ids. Returns the mechanism installed (None when the model needs none, or without packing)."""
    if not packing:
        return None
    positions = TEXT_POSITION_ROW if install_text_positions(model) else None
    if recurrent_layer_types(model.config):
        return install_document_reset(model)
    if install_packed_mask(model, dtype):
        return PACKED_MASK_HOOK
    return positions

