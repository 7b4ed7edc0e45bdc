"""Fold a LoRA adapter into its base weights: one function over state dicts, computing what peft's merge computes.

The base state may come from anywhere (a checkpoint on disk, a training run's gathered weights, a quantized base
dequantized by a function), so the merge takes tensors, never a model: `merge_lora(base_state, adapter_state,
adapter_config)`. Adapter keys may be in peft's file form (`base_model.model.<module>.lora_A.weight`) or a live
peft model's (`...lora_A.default.weight`); base keys are the plain model's (`<module>.weight`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>A|B)(?:\.[^.]+)?\.weight$")


class MergeError(ValueError):
    """The adapter does not fit the base it is merged onto, or holds what a merge cannot fold."""


def _plain(key: str) -> str:
    return key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key


def lora_pairs(adapter_state: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{module name in the base model: (lora_A, lora_B)}; anything else in the adapter is an error."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in adapter_state.items():
        m = _LORA_KEY.match(_plain(key))
        if m is None:
            raise MergeError(f"adapter tensor {key!r} is not a LoRA A or B matrix: only plain LoRA on linear layers "
                             "can be merged (save the adapter instead)")
        parts.setdefault(m["module"], {})[m["part"]] = value
    out = {}
    for module, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise MergeError(f"adapter for {module!r} has lora_{'A' if 'A' in ab else 'B'} without its pair")
        out[module] = (ab["A"], ab["B"])
    return out


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    # peft's rule (peft.utils.other.get_pattern_key): a key matches the end of the module name on a dot boundary.
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def scaling(adapter_config: dict[str, Any], module: str, rank: int) -> float:
    """lora_alpha / r (or / sqrt(r) with rsLoRA), alpha from alpha_pattern where one matches the module."""
    alpha = _pattern_value(adapter_config.get("alpha_pattern") or {}, module, adapter_config["lora_alpha"])
    return alpha / math.sqrt(rank) if adapter_config.get("use_rslora") else alpha / rank


def merge_lora(base_state: dict[str, torch.Tensor], adapter_state: dict[str, torch.Tensor],
               adapter_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The base state with W + (B @ A) * scaling on every adapted linear weight; the inputs are left unchanged.

    As in peft, a bf16/fp16 product is made in fp32 and cast to the adapter's dtype, then added in the promoted
    dtype and stored in the weight's.
    """
    if adapter_config.get("use_dora") or adapter_config.get("lora_bias"):
        raise MergeError("DoRA and LoRA biases are not merged here: save the adapter instead")
    fan_in_fan_out = bool(adapter_config.get("fan_in_fan_out"))
    merged = dict(base_state)
    for module, (a, b) in lora_pairs(adapter_state).items():
        key = f"{module}.weight"
        if key not in base_state:
            raise MergeError(f"the adapter adapts {module!r} but the base has no {key!r} (an adapter on expert "
                             "tensors, method.lora.target_parameters, is not merged: save the adapter)")
        weight = base_state[key]
        rank = a.shape[0]
        compute = torch.float32 if b.dtype in (torch.bfloat16, torch.float16) else b.dtype
        delta = b.to(compute) @ a.to(compute)
        delta = (delta.T if fan_in_fan_out else delta) * scaling(adapter_config, module, rank)
        if delta.shape != weight.shape:
            raise MergeError(f"adapter for {module!r} makes a {tuple(delta.shape)} update for a "
                             f"{tuple(weight.shape)} weight: it was trained on another base")
        # peft adds in place: the sum is made in the promoted dtype, then stored in the weight's.
        merged[key] = (weight + delta.to(b.dtype)).to(weight.dtype)
    return merged


def split_peft_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A live peft model's full state dict as (the base model's state, the adapter's tensors)."""
    base: dict[str, torch.Tensor] = {}
    adapter: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if _LORA_KEY.match(_plain(key)):
            adapter[key] = value
        else:
            base[_plain(key).replace(".base_layer.", ".")] = value
    return base, adapter
