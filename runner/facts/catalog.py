"""Model architectures: config.json parsed into the sizes the estimator counts, and a built-in catalog for offline
planning. GPU types live in runner/facts/gpus.py, the hub's config.json requests in runner/facts/hub_config.py."""

from __future__ import annotations

import difflib
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.facts.catalog_configs import (  # noqa: F401 (CATALOG, PUBLISHED_PARAMS: re-exported for their readers)
    CATALOG,
    CATALOG_NOTES,
    PUBLISHED_PARAMS,
    catalog_config,
)
from runner.errors import Problem, UserError
from runner.facts.families import FAMILIES, Family, family_of
from runner.facts.gpus import (  # noqa: F401 (re-exported for importers of the catalog's GPU names)
    GPUS,
    GpuType,
    detect_gpu,
    gpu_names,
    gpu_type,
    match_gpu_name,
)
from runner.facts.hub_config import config_from_cache as _from_cache
from runner.facts.hub_config import config_from_hub as _from_hub

# ---------------------------------------------------------------------------------------------
# Architectures


VISION_PARTS = frozenset({"visual", "vision_tower", "vision_model", "vision", "multi_modal_projector",
                          "mm_projector", "vision_embed_tokens", "image_newline", "audio_tower"})
"""Module-name parts of vision towers and projectors: text-only data never runs through them."""


def in_vision_part(name: str) -> bool:
    """A parameter or module name inside a vision tower or projector (VISION_PARTS)."""
    return bool(VISION_PARTS & set(name.split(".")))


@functools.lru_cache(maxsize=None)
def _fused_qkvz(model_type: str) -> bool:
    """A gated-delta layer of this model type projects q, k, v and z in one Linear (and b, a in another). Cached: the
    planner lists a layer's Linears for every candidate it prices (tens of thousands for a hybrid)."""
    return "in_proj_qkvz" in family_of({"model_type": model_type}).recurrent_proj


@dataclass(frozen=True)
class Linear:
    """One nn.Linear of a decoder layer: the unit LoRA adapts."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class ExpertTensor:
    """A 3-D MoE expert weight (experts × in × out), adapted by LoRA through peft's target_parameters."""

    name: str
    experts: int
    in_features: int
    out_features: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.experts * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


LAYER_FULL = "full_attention"
LAYER_SLIDING = "sliding_attention"
LAYER_LINEAR = "linear_attention"

# Family traits come from runner.facts.families: which model_types this module counts exactly (checked against
# transformers' own modules), which have q/k norms, and which gate the attention output through q_proj.
EXACT_TYPES = frozenset(f.model_type for f in FAMILIES.values() if f.counted_exactly)
QK_NORM_TYPES = frozenset(f.model_type for f in FAMILIES.values() if f.qk_norm and f.counted_exactly)
GATED_ATTN_TYPES = frozenset(f.model_type for f in FAMILIES.values() if f.attn_output_gate)


@dataclass(frozen=True)
class Arch:
    """A decoder-only language model (the language tower of a VLM), enough to count parameters and activations."""

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied_embeddings: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    attn_output_gate: bool = False
    attention_sinks: bool = False
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    expert_bias: bool = False
    router_bias: bool = False
    shared_expert_intermediate: int = 0
    dense_layers: tuple[int, ...] = ()
    """Layers with a dense MLP in an otherwise MoE model (qwen3_moe mlp_only_layers / decoder_sparse_step)."""
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    vision_params: int = 0
    """Parameters of a vision tower (VLM): loaded and sharded, unused by text-only training."""
    vision_linears: tuple[Linear, ...] = ()
    approximate_reasons: tuple[str, ...] = ()
    name: str = ""

    # -- structure -------------------------------------------------------------------------

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else LAYER_FULL

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i not in self.dense_layers

    @functools.cached_property
    def layer_kinds(self) -> tuple[tuple[str, bool], ...]:
        """Per layer (its type, MoE or not): what its parameters and activations depend on."""
        return tuple((self.layer_type(i), self.is_moe_layer(i)) for i in range(self.layers))

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def linear_key_dim(self) -> int:
        return self.linear_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_value_heads * self.linear_value_head_dim

    def linears(self, i: int) -> list[Linear]:
        """The nn.Linear modules of decoder layer i, named as in transformers (what LoRA's target_modules match)."""
        h = self.hidden
        out: list[Linear] = []
        if self.layer_type(i) == LAYER_LINEAR:
            kd, vd, vh = self.linear_key_dim, self.linear_value_dim, self.linear_value_heads
            if _fused_qkvz(self.model_type):
                out += [Linear("linear_attn.in_proj_qkvz", h, 2 * kd + 2 * vd),
                        Linear("linear_attn.in_proj_ba", h, 2 * vh)]
            else:
                out += [Linear("linear_attn.in_proj_qkv", h, 2 * kd + vd), Linear("linear_attn.in_proj_z", h, vd),
                        Linear("linear_attn.in_proj_b", h, vh), Linear("linear_attn.in_proj_a", h, vh)]
            out.append(Linear("linear_attn.out_proj", vd, h))
        else:
            q_out = self.q_dim * (2 if self.attn_output_gate else 1)
            b = self.attention_bias
            out += [Linear("self_attn.q_proj", h, q_out, b), Linear("self_attn.k_proj", h, self.kv_dim, b),
                    Linear("self_attn.v_proj", h, self.kv_dim, b),
                    Linear("self_attn.o_proj", self.q_dim, h, self.o_proj_bias)]
        if self.is_moe_layer(i):
            if self.shared_expert_intermediate:
                s = self.shared_expert_intermediate
                out += [Linear("mlp.shared_expert.gate_proj", h, s), Linear("mlp.shared_expert.up_proj", h, s),
                        Linear("mlp.shared_expert.down_proj", s, h), Linear("mlp.shared_expert_gate", h, 1)]
        else:
            im, mb = self.intermediate, self.mlp_bias
            out += [Linear("mlp.gate_proj", h, im, mb), Linear("mlp.up_proj", h, im, mb),
                    Linear("mlp.down_proj", im, h, mb)]
        return out

    def expert_tensors(self, i: int) -> list[ExpertTensor]:
        if not self.is_moe_layer(i):
            return []
        e, h, im, b = self.num_experts, self.hidden, self.expert_intermediate, self.expert_bias
        return [ExpertTensor("mlp.experts.gate_up_proj", e, h, 2 * im, b),
                ExpertTensor("mlp.experts.down_proj", e, im, h, b)]

    def other_layer_params(self, i: int) -> int:
        """Norms, convolution, gates and other non-Linear parameters of layer i."""
        h = self.hidden
        n = 2 * h  # input and post-attention RMSNorm
        if self.layer_type(i) == LAYER_LINEAR:
            conv_dim = 2 * self.linear_key_dim + self.linear_value_dim
            n += conv_dim * self.linear_conv_kernel  # depthwise conv1d, no bias
            n += 2 * self.linear_value_heads  # dt_bias, A_log
            n += self.linear_value_head_dim  # gated RMSNorm over each value head
        else:
            if self.qk_norm:
                n += 2 * self.head_dim
            if self.attention_sinks:
                n += self.heads
        if self.is_moe_layer(i):
            n += self.num_experts * h + (self.num_experts if self.router_bias else 0)  # router (an nn.Parameter)
        return n

    def layer_params(self, i: int) -> int:
        return (sum(x.params for x in self.linears(i)) + sum(x.params for x in self.expert_tensors(i))
                + self.other_layer_params(i))

    def layer_active_params(self, i: int) -> int:
        """Parameters one token touches in layer i: top-k of the experts."""
        total = self.layer_params(i)
        if not self.is_moe_layer(i):
            return total
        experts = sum(x.params for x in self.expert_tensors(i))
        return total - experts + experts * self.experts_per_token // self.num_experts

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """What FSDP's root unit holds: embeddings, lm_head and the final norm."""
        return self.embed_params + self.lm_head_params + self.hidden

    @functools.cached_property
    def text_params(self) -> int:
        return self.root_params + sum(self.layer_params(i) for i in range(self.layers))

    @property
    def params_total(self) -> int:
        """Every parameter the loaded model holds (a tied embedding counted once), vision tower included."""
        return self.text_params + self.vision_params

    @functools.cached_property
    def params_active(self) -> int:
        """Parameters used per text token (MoE: the routed top-k experts only); the vision tower is not."""
        return self.root_params + sum(self.layer_active_params(i) for i in range(self.layers))

    @property
    def params_flops(self) -> int:
        """Parameters in matmuls per token: active ones less the input embedding lookup (the lm_head stays)."""
        lookup = 0 if self.tied_embeddings else self.embed_params
        return self.params_active - lookup - self.hidden

    @functools.cached_property
    def dense_down_proj_params(self) -> tuple[int, ...]:
        """Per layer, its dense MLP's output projection's parameters (0 for a MoE layer)."""
        return tuple(0 if self.is_moe_layer(i) else sum(x.params for x in self.linears(i) if x.name == "mlp.down_proj")
                     for i in range(self.layers))

    @functools.cached_property
    def max_layer_params(self) -> int:
        return max(self.layer_params(i) for i in range(self.layers))

    @property
    def approximate(self) -> bool:
        return bool(self.approximate_reasons)

    def summary(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "params_total": self.params_total, "params_active": self.params_active,
                "layers": self.layers, "vocab": self.vocab, "hidden": self.hidden,
                "layer_types": _count_types(self.layer_types or (LAYER_FULL,) * self.layers)}


def _count_types(types: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in types:
        out[t] = out.get(t, 0) + 1
    return out


# ---------------------------------------------------------------------------------------------
# Parsing HF config.json


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _text_config(config: dict[str, Any]) -> tuple[dict[str, Any], bool, str]:
    """(the language model's config, whether it came from a VLM's text_config, the model_type to plan with)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    cfg = dict(text) if text is not None else dict(config)
    for k in ("tie_word_embeddings",):
        if k not in cfg and k in config:
            cfg[k] = config[k]
    # A VLM is named by its top-level type (qwen3_5), a plain LM by its own.
    model_type = str((config.get("model_type") if text is not None else None) or cfg.get("model_type") or "unknown")
    return cfg, text is not None, model_type


def _dimensions(cfg: dict[str, Any], name: str, in_text_config: bool, reasons: list[str]
                ) -> tuple[int, int, int, int, int, int, int]:
    """(hidden, layers, heads, kv_heads, head_dim, vocab, intermediate); missing optional ones assumed, in `reasons`."""
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model", "dim")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    missing = [f for f, v in (("hidden_size", hidden), ("num_hidden_layers", layers)) if v is None]
    if missing:
        where = "text_config" if in_text_config else "config.json"
        raise UserError(f"cannot model {name or 'this model'}: its {where} has no {' or '.join(missing)}",
                        [Problem("model", f"config fields missing: {', '.join(missing)}",
                                 "give model.path a directory whose config.json has hidden_size and "
                                 "num_hidden_layers")])
    hidden, layers = int(hidden), int(layers)
    heads = int(_first(cfg, "num_attention_heads", "n_head", default=max(1, hidden // 128)))
    if "num_attention_heads" not in cfg and "n_head" not in cfg:
        reasons.append("num_attention_heads missing: assumed hidden/128")
    kv_heads = int(_first(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    vocab = _first(cfg, "vocab_size")
    if vocab is None:
        vocab = 32000
        reasons.append("vocab_size missing: assumed 32,000")
    intermediate = _first(cfg, "intermediate_size", "ffn_dim", "n_inner")
    if intermediate is None:
        intermediate = 4 * hidden
        if not _first(cfg, "num_experts", "num_local_experts", "n_routed_experts"):
            reasons.append("intermediate_size missing: assumed 4 × hidden")
    return hidden, layers, heads, kv_heads, head_dim, int(vocab), int(intermediate)


def _layer_types(cfg: dict[str, Any], layers: int, fam: Family, reasons: list[str]
                 ) -> tuple[tuple[str, ...], int | None]:
    """(each layer's type, or () when all are full attention; the sliding window)."""
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        layer_types = tuple(str(t) for t in layer_types)
        if len(layer_types) != layers:
            reasons.append(f"layer_types has {len(layer_types)} entries for {layers} layers: the pattern is repeated")
            layer_types = tuple(layer_types[i % len(layer_types)] for i in range(layers)) if layer_types else ()
    elif cfg.get("full_attention_interval") and cfg.get("linear_num_value_heads"):
        k = int(cfg["full_attention_interval"])
        layer_types = tuple(LAYER_FULL if (i + 1) % k == 0 else LAYER_LINEAR for i in range(layers))
    else:
        layer_types = ()
    known = {LAYER_FULL, LAYER_SLIDING, LAYER_LINEAR}
    odd = sorted({t for t in layer_types if t not in known})
    if odd:
        reasons.append(f"layer types {', '.join(odd)} not modelled: counted as full attention")
        layer_types = tuple(t if t in known else LAYER_FULL for t in layer_types)
    sliding = cfg.get("sliding_window")
    if not cfg.get("use_sliding_window", True):
        sliding = None
    if sliding and not layer_types and fam.window_on_every_layer:
        layer_types = (LAYER_SLIDING,) * layers
    return layer_types, int(sliding) if sliding else None


def _experts(cfg: dict[str, Any], layers: int, intermediate: int, reasons: list[str]
             ) -> tuple[int, int, int, int, tuple[int, ...]]:
    """(experts, experts per token, expert width, shared expert width, the layers with a dense MLP)."""
    num_experts = int(_first(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0) or 0)
    top_k = int(_first(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) or 0)
    expert_im = int(_first(cfg, "moe_intermediate_size", default=0) or 0)
    if num_experts and not expert_im:
        expert_im = intermediate
    shared_im = int(_first(cfg, "shared_expert_intermediate_size", default=0) or 0)
    dense_layers: tuple[int, ...] = ()
    if num_experts:
        mlp_only = [int(x) for x in (cfg.get("mlp_only_layers") or [])]
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense_layers = tuple(i for i in range(layers) if i in mlp_only or (i + 1) % step != 0)
        if num_experts and not top_k:
            top_k = 2
            reasons.append("num_experts_per_tok missing: assumed top-2")
    return num_experts, top_k, expert_im, shared_im, dense_layers


def parse_arch(config: dict[str, Any], name: str = "") -> Arch:
    """An Arch from an HF config.json dict; VLM-style configs contribute their `text_config` and count `vision_config`.

    Raises UserError naming the missing fields when the config has no hidden size or layer count.
    """
    top = config
    cfg, in_text_config, model_type = _text_config(config)
    reasons: list[str] = []
    hidden, layers, heads, kv_heads, head_dim, vocab, intermediate = _dimensions(cfg, name, in_text_config, reasons)
    tied = bool(cfg.get("tie_word_embeddings", False))
    fam = family_of(config)
    layer_types, sliding = _layer_types(cfg, layers, fam, reasons)
    num_experts, top_k, expert_im, shared_im, dense_layers = _experts(cfg, layers, intermediate, reasons)

    if model_type not in EXACT_TYPES:
        reasons.append(f"model_type '{model_type}' is not modelled exactly: counted as a llama-style decoder")
    if any(k in cfg for k in ("n_shared_experts", "kv_lora_rank", "q_lora_rank")):
        reasons.append("shared-expert / latent-attention fields are not modelled")

    attention_bias = bool(cfg.get("attention_bias", fam.qkv_bias))
    o_bias = bool(cfg.get("attention_bias", False)) and not fam.qkv_bias
    arch = Arch(
        model_type=model_type, vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=intermediate, tied_embeddings=tied,
        attention_bias=attention_bias, o_proj_bias=o_bias, mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type in QK_NORM_TYPES,
        # transformers builds these q_proj with the output gate whatever the config says
        attn_output_gate=model_type in GATED_ATTN_TYPES,
        attention_sinks=fam.attention_sinks,
        layer_types=layer_types, sliding_window=sliding,
        num_experts=num_experts, experts_per_token=top_k, expert_intermediate=expert_im,
        expert_bias=fam.expert_bias, router_bias=fam.expert_bias,
        shared_expert_intermediate=shared_im, dense_layers=dense_layers,
        linear_key_heads=int(cfg.get("linear_num_key_heads") or 0),
        linear_value_heads=int(cfg.get("linear_num_value_heads") or 0),
        linear_key_head_dim=int(cfg.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(cfg.get("linear_value_head_dim") or 0),
        linear_conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 0),
        approximate_reasons=tuple(reasons), name=name,
    )
    if LAYER_LINEAR in layer_types and not (arch.linear_value_heads and arch.linear_key_head_dim):
        raise UserError(f"cannot model {name or 'this model'}: linear-attention layers without their head sizes",
                        [Problem("model", "config fields missing: linear_num_value_heads, linear_key_head_dim, ...",
                                 "give a config.json with the linear-attention fields")])
    vision = top.get("vision_config") if in_text_config else None
    if isinstance(vision, dict) and vision:
        vparams, vlinears, vreason = _vision_params(vision)
        reasons2 = list(arch.approximate_reasons) + ([vreason] if vreason else [])
        arch = _replace(arch, vision_params=vparams, vision_linears=tuple(vlinears),
                        approximate_reasons=tuple(reasons2))
    return arch


def _replace(arch: Arch, **kw: Any) -> Arch:
    from dataclasses import replace

    return replace(arch, **kw)


def _vision_params(v: dict[str, Any]) -> tuple[int, list[Linear], str | None]:
    """Parameters of a Qwen-VL-style vision tower (exact for qwen3_vl / qwen3_5 towers), else a ViT estimate."""
    h = int(_first(v, "hidden_size", "embed_dim", default=0) or 0)
    depth = int(_first(v, "depth", "num_hidden_layers", default=0) or 0)
    im = int(_first(v, "intermediate_size", default=4 * h) or 4 * h)
    if not h or not depth:
        return 0, [], "vision_config without hidden_size/depth: vision tower not counted"
    block_linears = [Linear("attn.qkv", h, 3 * h, True), Linear("attn.proj", h, h, True),
                     Linear("mlp.linear_fc1", h, im, True), Linear("mlp.linear_fc2", im, h, True)]
    block = sum(x.params for x in block_linears) + 2 * 2 * h  # two LayerNorms with bias
    linears = [Linear(f"visual.blocks.{i}.{x.name}", x.in_features, x.out_features, x.bias)
               for i in range(depth) for x in block_linears]
    total = depth * block
    if "out_hidden_size" in v:
        c, p, t = int(v.get("in_channels", 3)), int(v.get("patch_size", 14)), int(v.get("temporal_patch_size", 2))
        total += c * t * p * p * h + h  # Conv3d patch embedding with bias
        total += int(v.get("num_position_embeddings", 0) or 0) * h
        m = h * int(v.get("spatial_merge_size", 2)) ** 2
        out = int(v["out_hidden_size"])
        merger = 2 * h + (m * m + m) + (m * out + out)
        total += merger * (1 + len(v.get("deepstack_visual_indexes") or []))
        # deepstack mergers normalise the merged width, not h
        total += 2 * (m - h) * len(v.get("deepstack_visual_indexes") or [])
        linears += [Linear("visual.merger.linear_fc1", m, m, True), Linear("visual.merger.linear_fc2", m, out, True)]
        return total, linears, None
    return total, linears, "vision tower is not Qwen-VL-style: its parameters are a ViT estimate"


# ---------------------------------------------------------------------------------------------
# Built-in configs: runner/facts/catalog_configs.py


def catalog_arch(model_id: str) -> Arch:
    cfg = catalog_config(model_id)
    if cfg is None:
        raise UserError(f"'{model_id}' is not in the built-in catalog")
    return parse_arch(cfg, name=model_id)


# ---------------------------------------------------------------------------------------------
# Loading a spec's architecture

@dataclass(frozen=True)
class LoadedArch:
    arch: Arch
    source: str
    """Where config.json came from: path, cache, hub or catalog."""
    config_dir: Path | None = None
    """The local directory holding config.json (and maybe tokenizer.json), when there is one."""
    note: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    """config.json itself, for the engines' decisions (runner.decide.rules) the estimator plans with."""


def load_arch(spec: Any) -> LoadedArch:
    """The model's architecture: config.json from model.path, else the HF cache, else the hub (when online), else the
    built-in catalog."""
    m = spec.model
    if m.path:
        from runner.naming import resolve_embedded

        directory = resolve_embedded(m.path)
        path = directory / "config.json" if directory.is_dir() else directory
        if not path.is_file():
            raise UserError(f"no config.json under model.path {m.path}",
                            [Problem("model.path", f"{path} does not exist", "point model.path at a model directory")])
        cfg = _read_json(path)
        return LoadedArch(parse_arch(cfg, name=m.id), "path", path.parent, config=cfg)
    cached = _from_cache(m.id, m.revision)
    if cached is not None:
        cfg = _read_json(cached)
        return LoadedArch(parse_arch(cfg, name=m.id), "cache", cached.parent, config=cfg)
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in {"1", "true", "yes", "on"}:
        cfg = _from_hub(m.id, m.revision or "main")
        if cfg is not None:
            return LoadedArch(parse_arch(cfg, name=m.id), "hub", config=cfg)
    cfg = catalog_config(m.id)
    if cfg is not None:
        return LoadedArch(parse_arch(cfg, name=m.id), "catalog", note=CATALOG_NOTES.get(m.id, ""), config=cfg)
    close = difflib.get_close_matches(m.id, list(CATALOG), n=1, cutoff=0.5)
    fix = f"did you mean '{close[0]}'?" if close else "set model.path to a local model directory, or go online once"
    raise UserError(f"cannot find config.json for '{m.id}': not under model.path, not in the HF cache, "
                    "not reachable on the hub and not in the built-in catalog",
                    [Problem("model.id", f"'{m.id}' is unknown offline", fix)])


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a JSON object")
    return data
