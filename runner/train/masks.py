"""Document masks for the mask-based attention paths (flex, sdpa, eager) on packed rows.

transformers builds a block-diagonal causal mask itself when the decoder's forward hands position_ids to its mask
builders (`masking_utils.find_packed_sequence_indices`). Some forwards do not (GPT-OSS in 5.x) but take a dict of
prepared per-layer-type masks: `install_packed_mask` gives them one. Which is which is read from the model's own
source (`packed_mask_route`), so a new transformers release is judged as it is, not as a list says.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from runner.decide.support import packed_mask_route
from runner.facts.families import BOUNDARY_PATHS

BOUNDARY_KERNELS = tuple(sorted(BOUNDARY_PATHS))
"""Kernels that read cu_seqlens keep documents apart without any mask."""
PACKED_MASK_HOOK = "document masks built from position_ids"


def backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack under a causal LM (and under a peft wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, getattr(base, "base_model_prefix", "model"), base)


def _mask_arguments(build: Any, config: Any, stub: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
    """Keyword arguments for a transformers mask builder, whose names changed across 5.x releases (no cache here)."""
    params = inspect.signature(build).parameters
    out: dict[str, Any] = {"config": config, "attention_mask": None, "position_ids": position_ids,
                           ("inputs_embeds" if "inputs_embeds" in params else "input_embeds"): stub}
    for name in ("cache", "past_key_values"):
        if name in params:
            out[name] = None
    if "cache_position" in params:
        out["cache_position"] = torch.arange(stub.shape[1], device=stub.device)
    return out


def install_packed_mask(model: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Keep packed documents apart in models whose forward ignores position_ids when it builds attention masks.

    A forward pre-hook on the decoder: when a packed row arrives (position_ids restart inside it) with no attention
    mask, it builds the mask of every layer type from the position_ids with transformers' own builders (a
    block-diagonal causal mask for eager/sdpa, a document BlockMask for flex, sliding windows included). Kernels
    that read cu_seqlens need no mask, so nothing is installed for them. Returns whether the hook was installed.
    """
    from transformers import masking_utils as mu

    body = backbone(model)
    config = getattr(body, "config", None)
    if config is None or getattr(config, "_attn_implementation", "") in BOUNDARY_KERNELS:
        return False
    # A forward that builds its masks from position_ids needs nothing, and one that does not take a dict of masks
    # would fail on it ('dict' object has no attribute 'ndim'): supported_attention keeps such models on kernels
    # that read cu_seqlens.
    if packed_mask_route(type(body)) != "hook":
        return False
    builders = {"full_attention": mu.create_causal_mask,
                "sliding_attention": getattr(mu, "create_sliding_window_causal_mask", mu.create_causal_mask)}
    layer_types = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]))

    def hook(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
        if kwargs.get("attention_mask") is not None:
            return None
        pos = kwargs.get("position_ids")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if pos is None or ids is None or mu.find_packed_sequence_indices(pos) is None:
            return None
        stub = torch.empty((ids.shape[0], ids.shape[1], 0), dtype=dtype, device=ids.device)  # shape, dtype, device
        kwargs["attention_mask"] = {}
        for lt in layer_types:
            build = builders.get(lt, mu.create_causal_mask)
            kwargs["attention_mask"][lt] = build(**_mask_arguments(build, config, stub, pos))
        return args, kwargs

    body.register_forward_pre_hook(hook, with_kwargs=True)
    return True


TEXT_POSITION_ROW = "4-row [text; t; h; w] position ids"


@functools.lru_cache(maxsize=128)
def _reads_text_position_row(cls: type) -> bool:
    """Whether this class's forward takes a 4-row position_ids `[text; t; h; w]` and builds its document mask from
    the text row alone (Qwen2-VL-style multimodal rotary embeddings, transformers 5.x)."""
    try:
        source = inspect.getsource(inspect.unwrap(cls.forward))
    except (OSError, TypeError):
        return False
    return "position_ids.shape[0] == 4" in source and "text_position_ids" in source


def install_text_positions(model: torch.nn.Module) -> bool:
    """Give a multimodal-rotary text model its packed positions as 4 rows, all the restarting text positions.

    Qwen2-VL, Qwen2.5-VL and GLM-4V expand 2-row position ids to the 3 rotary rows and then build plain causal
    masks, so packed documents would see each other; with a text row they build the per-document mask from it
    (Qwen3-VL and Qwen3.5 expand to 4 rows themselves: for them this changes nothing). For text-only data the
    three rotary rows equal the text positions, as the model's own position computation makes them. Returns
    whether a hook was installed.
    """
    installed = False
    for module in model.modules():
        if not hasattr(module, "layers") or not _reads_text_position_row(type(module)):
            continue

        def hook(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
            pos = kwargs.get("position_ids")
            if pos is None or pos.ndim != 2:
                return None
            kwargs["position_ids"] = pos[None].expand(4, -1, -1)
            return args, kwargs

        module.register_forward_pre_hook(hook, with_kwargs=True)
        installed = True
    return installed
