"""A shrunk copy of a model's config for the packing check: the same model type and classes, a few layers (one of
each layer type the model has), small widths, and windows that put the check's documents in the regime the run
meets (longer than the window only when the run's blocks can hold such documents).

Works on the config's dict (`to_dict`) by the names transformers' configs use, so a family no list here names
still shrinks as far as its names are the usual ones; the packing check builds the result and falls back to
fewer changes when a family's own constraints refuse it. No torch here.
"""

from __future__ import annotations

import copy
from typing import Any

from runner.decide.rules import head_dim

SMALL_WINDOW = 16
"""A window shorter than the check's long documents: their tokens past it see only part of their own document."""
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
WINDOW_KEYS = ("sliding_window", "attention_chunk_size", "keep_window_size", "sliding_window_size")
"""Config fields that limit how far back a token attends: shrunk only when the run's documents can exceed them."""
POSITION_SCALE_KEYS = ("floor_scale",)
"""Config fields past which a layer computes a token by its position in the whole row: Llama 4's no-rope layers
scale queries by log(floor((position + 1) / floor_scale)), with positions counted from the row's start, not the
document's, so a packed document past that position is computed unlike the same document alone. Shrunk when the
run's blocks reach them, so the check's block crosses one as the run's do; left alone when they cannot."""
POSITION_SLOPES = {"attn_scale": 1.0}
"""How steeply a crossed position scale grows (Llama 4: 0.1 per log-unit of position), set ten times steeper as
INIT_STD sharpens attention: at 0.1 the shrunk copy's documents moved by 0.14 nats in bf16, under the check's bf16
tolerance (runner.gate.packcheck); at 1.0 by 0.45 (0.017 with the scale not crossed)."""
WIDTHS = {
    "hidden_size": 64, "n_embd": 64, "d_model": 64,
    "intermediate_size": 128, "intermediate_size_mlp": 128, "ffn_hidden_size": 128, "n_inner": 128,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "expert_intermediate_size": 64,
    "head_dim": 16, "kv_channels": 16,
    "kv_lora_rank": 32, "q_lora_rank": 64, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "vocab_size": 512,
}
"""Widths every family shrinks to (where its config has the field): 4 heads of 16, an MLP twice the width."""
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
KV_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOKEN_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id")
INIT_STD = 0.2
"""Weights drawn ten times wider than the usual 0.02: attention gets sharp, so a token that sees another document
moves its loss by far more than rounding does (runner.gate.packcheck argues the tolerances)."""


def crossed(key: str, value: int, seq_len: int) -> bool:
    """Whether the run's blocks of `seq_len` tokens reach past this window or position scale."""
    return seq_len >= value if key in POSITION_SCALE_KEYS else seq_len > value


def _layers(d: dict[str, Any]) -> int | None:
    return next((int(d[k]) for k in LAYER_KEYS if isinstance(d.get(k), int)), None)


def kept_layers(d: dict[str, Any]) -> list[int]:
    """Indices of the layers the shrunk copy keeps: the first of each layer type (and of the first MoE layer after
    dense ones), at least two."""
    n = _layers(d) or 2
    types = d.get("layer_types") or []
    keep = {types.index(t) for t in dict.fromkeys(types)} if len(types) == n else set()
    dense = d.get("first_k_dense_replace")
    if isinstance(dense, int) and 0 < dense < n:
        keep |= {0, dense}
    i = 0
    while len(keep) < min(2, n):
        keep.add(i)
        i += 1
    return sorted(keep)[:4]


def _scaled_sections(sections: list[int], total: int) -> list[int]:
    """mrope sections (pairs of rotary dims per position row) rescaled to sum to `total`, each at least 1."""
    whole = sum(sections) or 1
    out = [max(1, round(s * total / whole)) for s in sections]
    out[-1] += total - sum(out)
    return out


DEFAULT_MROPE = [16, 24, 24]
"""The t/h/w split of rotary dims Qwen2-VL-style models fall back to when the config names none (their modeling
code's default is for head_dim 128): rescaled, so the shrunk copy's split fits its small heads."""


def _shrink_rope(rope: Any, head_dim: int, multimodal: bool = False) -> Any:
    if not isinstance(rope, dict):
        return rope
    rope = dict(rope)
    partial = float(rope.get("partial_rotary_factor") or 1.0)
    half = max(1, int(head_dim * partial) // 2)
    if multimodal and "mrope_section" not in rope:
        rope["mrope_section"] = DEFAULT_MROPE
    if isinstance(rope.get("mrope_section"), list):
        rope["mrope_section"] = _scaled_sections(rope["mrope_section"], half)
    for k in ("short_factor", "long_factor"):
        if isinstance(rope.get(k), list):
            rope[k] = rope[k][:half] + [rope[k][-1]] * max(0, half - len(rope[k]))
    return rope


def _shrink_layers(d: dict[str, Any]) -> None:
    n = _layers(d)
    if n is None:
        return
    keep = kept_layers(d)
    for k, v in list(d.items()):
        if isinstance(v, list) and len(v) == n and n > len(keep) and k not in ("mrope_section",):
            d[k] = [v[i] for i in keep]
    for k in ("mlp_only_layers", "moe_layers_indices"):
        if isinstance(d.get(k), list):
            d[k] = [keep.index(i) for i in d[k] if i in keep]
    if isinstance(d.get("first_k_dense_replace"), int):
        d["first_k_dense_replace"] = sum(i < d["first_k_dense_replace"] for i in keep)
    for k in LAYER_KEYS:
        if isinstance(d.get(k), int):
            d[k] = len(keep)
    for k in ("max_window_layers",):
        if isinstance(d.get(k), int):
            d[k] = min(d[k], len(keep))


def _shrink_widths(d: dict[str, Any], multimodal: bool = False, run_head_dim: int | None = None) -> None:
    heads_key = next((k for k in HEAD_KEYS if isinstance(d.get(k), int)), None)
    kv_key = next((k for k in KV_KEYS if isinstance(d.get(k), int)), None)
    if heads_key:
        heads, kv = d[heads_key], d.get(kv_key) if kv_key else None
        d[heads_key] = 4
        if kv_key and kv:
            d[kv_key] = 4 if kv >= heads else 1 if kv == 1 else 2
    for k, v in WIDTHS.items():
        if isinstance(d.get(k), int) and d[k] > v:
            d[k] = v
    for k in EXPERT_KEYS:
        if isinstance(d.get(k), int) and d[k] > 4:
            d[k] = 4
    if "num_experts_per_tok" in d and any(isinstance(d.get(k), int) for k in EXPERT_KEYS):
        d["num_experts_per_tok"] = min(d["num_experts_per_tok"] or 2, 2)  # None in some default configs
    for k in ("n_group", "topk_group"):  # expert groups: one group of the 4 experts (None breaks some defaults)
        if k in d:
            d[k] = 1
    if run_head_dim and heads_key:
        _keep_head_layout(d, heads_key, kv_key, heads, kv, run_head_dim)
    size = d["head_dim"] if isinstance(d.get("head_dim"), int) else run_head_dim or 16  # (else hidden / 4 heads)
    for k in ("rope_parameters", "rope_scaling"):
        if k in d:
            d[k] = _shrink_rope(d[k], size, multimodal)
    if isinstance(d.get("vocab_size"), int):
        _shrink_tokens(d)


def _shrink_windows(d: dict[str, Any], seq_len: int, long_doc: int) -> None:
    for k in WINDOW_KEYS:
        w = d.get(k)
        if isinstance(w, int) and w > 0:
            # Documents longer than the window only when the run's blocks can hold them; else a window wider than
            # every document of the check, as every document of the run is within it.
            d[k] = SMALL_WINDOW if crossed(k, w, seq_len) else max(long_doc + 1, SMALL_WINDOW)
    for k in POSITION_SCALE_KEYS:
        w = d.get(k)
        if isinstance(w, int) and w > 0 and crossed(k, w, seq_len):
            d[k] = SMALL_WINDOW
            d.update({slope: v for slope, v in POSITION_SLOPES.items() if isinstance(d.get(slope), float)})


def _keep_head_layout(d: dict[str, Any], heads_key: str, kv_key: str | None, heads: int, kv: int | None,
                      size: int) -> None:
    """The attention kernel's own head size and query heads per key head (flash-attn-4 compiles a kernel for each,
    and keeps them on disk for the run): 2 key heads, set where the config names the head size, else through the
    width it derives it from."""
    if kv_key and kv and kv < heads and heads % kv == 0:
        d[heads_key], d[kv_key] = 2 * (heads // kv), 2
    if isinstance(d.get("head_dim"), int):
        d["head_dim"] = size
    else:
        d[next((k for k in ("hidden_size", "n_embd", "d_model") if k in d), "hidden_size")] = d[heads_key] * size


def _shrink_text(d: dict[str, Any], seq_len: int, long_doc: int, multimodal: bool = False,
                 run_head_dim: int | None = None) -> None:
    _shrink_layers(d)
    _shrink_widths(d, multimodal, run_head_dim)
    _shrink_windows(d, seq_len, long_doc)
    for k in ("initializer_range", "init_std"):
        if isinstance(d.get(k), float):
            d[k] = INIT_STD
    d["use_cache"] = False


def _shrink_vision(d: dict[str, Any], text_hidden: int | None) -> None:
    # The vision tower never runs on text-only data, but it is built: one small layer.
    for k in ("depth", "num_hidden_layers", "num_layers"):
        if isinstance(d.get(k), int):
            d[k] = 1
    for k, v in (("hidden_size", 64), ("embed_dim", 64), ("intermediate_size", 128), ("num_heads", 4),
                 ("num_attention_heads", 4)):
        if isinstance(d.get(k), int) and d[k] > v:
            d[k] = v
    for k in ("fullatt_block_indexes", "deepstack_visual_indexes"):
        if isinstance(d.get(k), list):
            d[k] = [0][:len(d[k])]
    if text_hidden is not None and isinstance(d.get("out_hidden_size"), int):
        d["out_hidden_size"] = text_hidden


def shrunk_config_dict(config: Any, seq_len: int, long_doc: int, widths: bool = True,
                       keep_head_dim: bool = False) -> dict[str, Any]:
    """The config (a transformers config) as a dict of its shrunk copy. `widths=False` keeps the widths and shrinks
    only layers, vocabulary and windows (for families whose own constraints refuse the small widths);
    `keep_head_dim` keeps the attention head size (for kernels whose code depends on it)."""
    d = copy.deepcopy(config.to_dict())
    text = d.get("text_config") if isinstance(d.get("text_config"), dict) else d
    if widths:
        # A text config under a vision tower: its rotary embedding may split head dims into t/h/w sections.
        _shrink_text(text, seq_len, long_doc, multimodal=text is not d and isinstance(d.get("vision_config"), dict),
                     run_head_dim=head_dim(config) if keep_head_dim else None)
    else:
        _shrink_layers(text)
        _shrink_windows(text, seq_len, long_doc)
        if isinstance(text.get("vocab_size"), int):
            text["vocab_size"] = min(text["vocab_size"], WIDTHS["vocab_size"])
            _shrink_tokens(text)
        text["use_cache"] = False
    if text is not d:
        d["use_cache"] = False
        if isinstance(d.get("vision_config"), dict):
            _shrink_vision(d["vision_config"], text.get("hidden_size"))
    return d


def _shrink_tokens(d: dict[str, Any]) -> None:
    for k in TOKEN_KEYS:
        if isinstance(d.get(k), int) and d[k] >= d["vocab_size"]:
            d[k] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}[k]


def shrunk_config(config: Any, seq_len: int, long_doc: int, widths: bool = True, keep_head_dim: bool = False) -> Any:
    """A new config of the same class as `config`, shrunk (shrunk_config_dict)."""
    d = shrunk_config_dict(config, seq_len, long_doc, widths, keep_head_dim)
    d.pop("transformers_version", None)
    out = type(config).from_dict(d)
    for k in ("initializer_range", "init_std"):
        if hasattr(out, k) and isinstance(getattr(out, k), float):
            setattr(out, k, INIT_STD)
    return out
