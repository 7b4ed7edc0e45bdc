"""QLoRA's 4-bit base: the frozen Linear weights stored as torchao's NF4 tensors and dequantized for compute."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch
from torch import nn

NF4_BLOCK = 64
"""Weights per NF4 block, each with its own absmax scale (QLoRA's and torchao's default)."""
SCALER_BLOCK = 256
"""Block scales per double-quantization block (torchao's default): each block of scales is stored as int8 with one
factor of its own. A tensor whose shard holds fewer takes the largest power of two that divides it."""
NF4_MODULES = ("torchao.dtypes.nf4tensor", "torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
"""Where torchao keeps its NF4 tensor: the first up to 0.17, the second from 0.18 on."""


def nf4_library() -> Any:
    """torchao's NF4 module; ImportError naming the fix when torchao is missing."""
    # torchao tries to load its CUDA kernels at import and logs a warning for each it cannot (every CPU machine).
    logging.getLogger("torchao").setLevel(logging.ERROR)
    for name in NF4_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("method.kind=qlora needs torchao's NF4 tensor: pip install torchao (see pyproject.toml)")


def torchao_version() -> str | None:
    from runner.versions import package_versions

    return package_versions(("torchao",)).get("torchao")


def is_nf4(t: Any) -> bool:
    inner = getattr(t, "_local_tensor", t)  # a DTensor shard under FSDP2
    return type(inner).__name__ == "NF4Tensor"


def scaler_block_size(shape: tuple[int, ...], shards: int) -> int | None:
    """The double-quantization block for a weight of `shape` split in `shards` along its rows (FSDP2's dim-0
    shards), or None when NF4 cannot hold it: each shard must hold whole NF4 blocks and whole scale blocks, as
    torchao's split and all-gather take them."""
    if len(shape) != 2 or shape[0] % shards:
        return None
    numel = shape[0] * shape[1]
    if numel % (NF4_BLOCK * shards):
        return None
    blocks = numel // NF4_BLOCK
    size = SCALER_BLOCK
    while size > 1 and blocks % (size * shards):
        size //= 2
    return size if blocks % (size * shards) == 0 else None


def frozen_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The Linear layers whose weight stays frozen: every base projection under the adapters (peft's base_layer)
    and those LoRA leaves alone, but not the output head (kept in its own dtype, as the input embedding)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and m is not head and not m.weight.requires_grad]


def quantize_base(model: nn.Module, shards: int, compute_dtype: str = "bfloat16", device: str | None = None
                  ) -> dict[str, Any]:
    """Replace each frozen Linear weight by its NF4 form (in place, before FSDP2 shards the model over `shards`
    ranks); returns what was done, for the record: type, block sizes, library version, counts, and what stayed in
    its own dtype and why.

    The weight is quantized from bf16 (QLoRA's storage dtype); its forward dequantizes it to the input's dtype
    (torchao's F.linear override): bf16 on GPU; a CPU run still computes in fp32 (`compute_dtype`) and stays exact
    on replay. With `device` each weight is quantized there, by that device's kernels, and stays there.
    """
    lib = nf4_library()
    quantized, weights, scaler_sizes, kept = 0, 0, set(), []
    for name, module in frozen_linears(model):
        w = module.weight
        size = scaler_block_size(tuple(w.shape), shards)
        if size is None:
            kept.append(f"{name} {tuple(w.shape)}: not whole NF4 blocks per shard")
            continue
        nf4 = lib.to_nf4(w.detach().to(device=device or w.device, dtype=torch.bfloat16).contiguous(), NF4_BLOCK,
                         size)
        module.weight = nn.Parameter(nf4, requires_grad=False)
        quantized += 1
        weights += w.numel()
        scaler_sizes.add(size)
    # 3-D expert stacks (fused MoE experts) are held by their module, not by a Linear: torchao's NF4 takes 2-D only.
    for name, p in model.named_parameters():
        if p.dim() == 3 and not p.requires_grad:
            kept.append(f"{name} {tuple(p.shape)}: a 3-D expert stack (torchao's NF4 takes 2-D weights only)")
    kept_params = sum(p.numel() for p in model.parameters() if not is_nf4(p) and not p.requires_grad)
    return {"type": "nf4", "block_size": NF4_BLOCK, "scaler_block_sizes": sorted(scaler_sizes),
            "double_quantized": True, "library": f"torchao {torchao_version()}", "compute_dtype": compute_dtype,
            "quantized_layers": quantized, "quantized_params": weights, "frozen_params_not_quantized": kept_params,
            "not_quantized": kept}


def with_adapters(model: nn.Module, spec: Any, shards: int, device: str
                  ) -> tuple[nn.Module, list[str], dict[str, Any] | None]:
    """The native engine's method on the loaded model, before FSDP2 shards it over `shards` ranks: peft's adapters
    for lora and qlora and, for qlora, the NF4 base; with what they leave out (said at launch) and the quantization
    for the record (None unless qlora)."""
    if not spec.method.adapters:
        return model, [], None
    from runner.train.lora import apply_lora, base_dtype, lora_notes

    notes = lora_notes(model, spec)
    model = apply_lora(model, spec)
    if spec.method.kind != "qlora":
        return model, notes, None
    # A CPU run computes in its weights' dtype (fp32: exact replays); a GPU run in bf16.
    compute = "bfloat16" if device == "cuda" else str(base_dtype(model)).removeprefix("torch.")
    quantization = quantize_base(model, shards, compute, device if device == "cuda" else None)
    return model, notes + not_quantized_notes(quantization), quantization


def not_quantized_notes(info: dict[str, Any], limit: int = 3) -> list[str]:
    """One line on the frozen weights that stayed in their own dtype (said at launch)."""
    kept = info.get("not_quantized") or []
    if not kept:
        return []
    more = f", … ({len(kept) - limit} more)" if len(kept) > limit else ""
    return [f"qlora: {len(kept)} frozen weights stay unquantized, {info['frozen_params_not_quantized']:,} params "
            f"with the embeddings and norms ({'; '.join(kept[:limit])}{more})"]


def dequantized(t: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A weight as the forward sees it: an NF4 tensor dequantized by torchao, anything else cast."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    if is_nf4(t):
        return t.get_original_weight().to(dtype)
    return t.detach().to(dtype)


def dequantized_state_dict(state: dict[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16
                           ) -> dict[str, torch.Tensor]:
    """The base in `dtype` (bf16) from a QLoRA model's full state dict: NF4 weights dequantized, the rest cast;
    the adapters' own tensors (lora_A/lora_B) are left out. What a merged export adds the adapters to."""
    return {k: dequantized(v, dtype) for k, v in state.items() if ".lora_" not in k}


def base_state_dict(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Collective under FSDP2 (every rank calls it): the dequantized bf16 base of a QLoRA model, whole, on the
    host, under the model's own key names (peft's `base_layer` kept)."""
    state: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if ".lora_" in name:
            continue
        state[name] = dequantized(t, dtype).cpu()
    return state
