"""The decoder families this project knows, by transformers `model_type`: what keeps packed documents apart in each,
its decoder layer, its traits (MoE, recurrent layers, sliding windows, softcapping, attention sinks, latent attention)
and how its LoRA targets are named.

This is the one place family names are listed: the engines, preflight, the catalog and the estimator ask
`family_of(config)` (or `family(model_type)`). A model_type not listed gets conservative traits read from its config
(`layer_types`, `sliding_window`, softcapping fields, expert counts, `kv_lora_rank`), and `known=False`.

No torch here: the estimator and preflight read it without loading a model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# Attention paths (the `attn_implementation` values this project loads models with).
VARLEN = "varlen"
FLASH = "flash_attention_2"
FLEX = "flex_attention"
SDPA = "sdpa"
EAGER = "eager"
ALL_PATHS = (VARLEN, FLASH, FLEX, SDPA, EAGER)
"""Every path, fastest first. varlen / flash read document boundaries (cu_seqlens); flex, sdpa and eager get the
block-diagonal mask transformers builds from restarting position_ids."""
BOUNDARY_PATHS = frozenset({VARLEN, FLASH, "flash_attention_3", "flash_attention_4"})
"""Paths that take document boundaries from cu_seqlens and need no mask."""

# Layer types whose only token mixing is (masked) softmax attention.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention",
                                   "global_attention", "local_attention"})
GATED_DELTA = "gated_delta"
"""Recurrent kind of the gated-delta "linear_attention" layers: they restart per document given cu_seqlens/seq_idx
(flash-linear-attention + causal-conv1d, or this project's per-document wrap of transformers' PyTorch path)."""
STATE_SPACE = "state_space"
"""Recurrent kind of Mamba-style and other recurrent layers: nothing here restarts them per document."""

LLAMA_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
LLAMA_MLP = ("gate_proj", "up_proj", "down_proj")
FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
"""transformers 5.x keeps an MoE layer's experts as two 3-D tensors, adapted through LoRA `target_parameters`."""


@dataclass(frozen=True)
class Family:
    """What the project knows about one decoder family (one transformers model_type)."""

    model_type: str
    decoder_layer: str
    """Class name of its decoder layer (what FSDP wraps one by one)."""
    attention_paths: tuple[str, ...] = ALL_PATHS
    """Attention paths that keep packed documents apart and compute this family's attention exactly, and that its
    transformers class declares (`_supports_*`; tests check the two agree), before the device and the kernels
    installed are taken into account (runner.decide.rules does that)."""
    moe: bool = False
    recurrent: str | None = None
    """None for attention-only families; GATED_DELTA or STATE_SPACE for families with recurrent layers."""
    transformers_module: str = ""
    """The transformers module holding the family's model (gated-delta families: where the per-document wrap goes)."""
    sliding_window: bool = False
    """Some layers may attend within a window (set by the config: `sliding_window`, `layer_types`)."""
    logit_softcapping: bool = False
    """The attention scores or the final logits may be soft-capped (gemma2): paths that cannot cap are excluded."""
    attention_sinks: bool = False
    """Per-head sink logits join the softmax (gpt_oss): only eager and flex (on CUDA) apply them."""
    mla: bool = False
    """Multi-head latent attention (deepseek): query/key head dim differs from the value head dim."""
    attn_proj: tuple[str, ...] = LLAMA_ATTN
    """Names of the attention projections (LoRA `target_modules` entries)."""
    mlp_proj: tuple[str, ...] = LLAMA_MLP
    """Names of the dense MLP projections (and of shared experts' projections, where the family has them)."""
    expert_tensors: tuple[str, ...] = ()
    """Expert weight tensors LoRA adapts through `target_parameters` (MoE families)."""
    recurrent_proj: tuple[str, ...] = ()
    """Projections of the recurrent layers (gated-delta in/out projections)."""
    window_on_every_layer: bool = False
    """A config `sliding_window` without `layer_types` windows every layer (mistral, mixtral, phi3)."""
    qkv_bias: bool = False
    """q/k/v projections carry a bias and o_proj none, whatever `attention_bias` says (qwen2)."""
    expert_bias: bool = False
    """Expert projections and the router carry biases (gpt_oss)."""
    qk_norm: bool = False
    """RMSNorm on queries and keys (per head)."""
    attn_output_gate: bool = False
    """q_proj also produces a sigmoid gate for the attention output (twice the query width)."""
    fp32_norm_product: bool = False
    """RMSNorm multiplies by its weight in fp32 before casting back (`(x * w).to(bf16)`)."""
    liger: bool = False
    """liger-kernel has layer kernels (RMSNorm, RoPE, SwiGLU) for it that TRL applies."""
    expert_intermediates: int = 4
    """Expert-intermediate-sized tensors an MoE layer keeps per routed token for backward, in units of the expert
    width. SwiGLU experts (qwen3_moe, mixtral): the gate/up output (2), silu's output and the product. gpt-oss's
    clamped SwiGLU with bias: the gate/up output (2), the clamped gate, its sigmoid, up + 1, their product and the
    down projection's input (7). The estimator's activation count reads it."""
    counted_exactly: bool = False
    """runner.facts.catalog counts its parameters and layers exactly (checked against transformers' modules)."""
    known: bool = True
    """False for a model_type not in the registry: traits were derived from its config."""

    @property
    def lora_modules(self) -> tuple[str, ...]:
        """Every projection LoRA can wrap as a module (attention, MLP, recurrent), as `target_modules` entries."""
        return tuple(dict.fromkeys(self.attn_proj + self.mlp_proj + self.recurrent_proj))


def _f(model_type: str, layer: str, **traits: Any) -> Family:
    return Family(model_type=model_type, decoder_layer=layer, **traits)


NO_FLEX = (VARLEN, FLASH, SDPA, EAGER)
NO_SDPA = (VARLEN, FLASH, FLEX, EAGER)

_QWEN35_ATTN = dict(recurrent=GATED_DELTA, attention_paths=NO_FLEX, qk_norm=True, attn_output_gate=True,
                    fp32_norm_product=True, counted_exactly=True,
                    recurrent_proj=("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"))
_MLA = dict(mla=True, attn_proj=("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))

_REGISTRY: tuple[Family, ...] = (
    _f("llama", "LlamaDecoderLayer", liger=True, counted_exactly=True),
    _f("mistral", "MistralDecoderLayer", sliding_window=True, window_on_every_layer=True, liger=True,
       counted_exactly=True),
    _f("mixtral", "MixtralDecoderLayer", moe=True, sliding_window=True, window_on_every_layer=True, mlp_proj=(),
       expert_tensors=FUSED_EXPERTS, counted_exactly=True),
    _f("qwen2", "Qwen2DecoderLayer", sliding_window=True, qkv_bias=True, liger=True, counted_exactly=True),
    _f("qwen2_moe", "Qwen2MoeDecoderLayer", moe=True, sliding_window=True, expert_tensors=FUSED_EXPERTS,
       mlp_proj=LLAMA_MLP + ("shared_expert_gate",)),
    _f("qwen3", "Qwen3DecoderLayer", sliding_window=True, qk_norm=True, liger=True, counted_exactly=True),
    _f("qwen3_moe", "Qwen3MoeDecoderLayer", moe=True, sliding_window=True, qk_norm=True, mlp_proj=(),
       expert_tensors=FUSED_EXPERTS, liger=True, counted_exactly=True),
    # Qwen2-VL / Qwen2.5-VL take packed positions as 4 rows [text; t; h; w] (runner.train.masks
    # install_text_positions): with the 3 rotary rows alone their mask is plain causal.
    *(_f(t, layer, attention_paths=NO_FLEX, sliding_window=True, qkv_bias=True)
      for t, layer in (("qwen2_vl", "Qwen2VLDecoderLayer"), ("qwen2_vl_text", "Qwen2VLDecoderLayer"),
                       ("qwen2_5_vl", "Qwen2_5_VLDecoderLayer"), ("qwen2_5_vl_text", "Qwen2_5_VLDecoderLayer"))),
    _f("qwen3_vl", "Qwen3VLTextDecoderLayer", qk_norm=True, attention_paths=NO_FLEX, counted_exactly=True),
    _f("qwen3_vl_text", "Qwen3VLTextDecoderLayer", qk_norm=True, attention_paths=NO_FLEX, counted_exactly=True),
    _f("qwen3_next", "Qwen3NextDecoderLayer", moe=True, expert_tensors=FUSED_EXPERTS,
       transformers_module="transformers.models.qwen3_next.modeling_qwen3_next",
       mlp_proj=LLAMA_MLP + ("shared_expert_gate",),
       **{**_QWEN35_ATTN, "recurrent_proj": ("in_proj_qkvz", "in_proj_ba", "out_proj")}),
    _f("qwen3_5", "Qwen3_5DecoderLayer", transformers_module="transformers.models.qwen3_5.modeling_qwen3_5",
       **_QWEN35_ATTN),
    _f("qwen3_5_text", "Qwen3_5DecoderLayer", transformers_module="transformers.models.qwen3_5.modeling_qwen3_5",
       **_QWEN35_ATTN),
    _f("qwen3_5_moe", "Qwen3_5MoeDecoderLayer", moe=True, expert_tensors=FUSED_EXPERTS,
       transformers_module="transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
       mlp_proj=LLAMA_MLP + ("shared_expert_gate",), **_QWEN35_ATTN),
    _f("qwen3_5_moe_text", "Qwen3_5MoeDecoderLayer", moe=True, expert_tensors=FUSED_EXPERTS,
       transformers_module="transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
       mlp_proj=LLAMA_MLP + ("shared_expert_gate",), **_QWEN35_ATTN),
    _f("gemma2", "Gemma2DecoderLayer", sliding_window=True, logit_softcapping=True, attention_paths=NO_SDPA),
    _f("gemma3_text", "Gemma3DecoderLayer", sliding_window=True, logit_softcapping=True, qk_norm=True),
    _f("gemma3", "Gemma3DecoderLayer", sliding_window=True, logit_softcapping=True, qk_norm=True,
       attention_paths=(VARLEN, FLEX, SDPA, EAGER)),
    _f("phi3", "Phi3DecoderLayer", sliding_window=True, window_on_every_layer=True, attn_proj=("qkv_proj", "o_proj"),
       mlp_proj=("gate_up_proj", "down_proj")),
    _f("olmo2", "Olmo2DecoderLayer", qk_norm=True),
    _f("olmo3", "Olmo3DecoderLayer", qk_norm=True, sliding_window=True),
    _f("granite", "GraniteDecoderLayer"),
    _f("smollm3", "SmolLM3DecoderLayer", sliding_window=True),
    _f("glm4", "Glm4DecoderLayer"),
    _f("gpt_oss", "GptOssDecoderLayer", moe=True, sliding_window=True, attention_sinks=True,
       attention_paths=(FLEX, EAGER), mlp_proj=(), expert_tensors=FUSED_EXPERTS, expert_bias=True,
       fp32_norm_product=True, expert_intermediates=7, counted_exactly=True),
    _f("deepseek_v3", "DeepseekV3DecoderLayer", moe=True, expert_tensors=FUSED_EXPERTS, **_MLA),
    _f("deepseek_v2", "DeepseekV2DecoderLayer", moe=True, expert_tensors=FUSED_EXPERTS, **_MLA),
    *(_f(t, "", recurrent=STATE_SPACE, attention_paths=())
      for t in ("mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "zamba", "zamba2", "nemotron_h",
                "granitemoehybrid", "falcon_h1", "lfm2", "lfm2_moe", "rwkv", "recurrent_gemma", "xlstm", "minimax",
                "kimi_linear")),
)
FAMILIES: dict[str, Family] = {f.model_type: f for f in _REGISTRY}
"""The registry: model_type → Family."""

MATRIX = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3", "olmo2",
          "granite", "gpt_oss", "qwen3_next", "deepseek_v3")
"""The families tested on CPU (tests/families.py) and measured on the GPU (benchmarks/families_gpu.py)."""


# ---------------------------------------------------------------------------------------------
# Lookups


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def text_config(config: Any) -> Any:
    """The language model's config: `text_config` of a VLM-style config (object or dict), else the config itself."""
    if not isinstance(config, dict):
        getter = getattr(config, "get_text_config", None)
        if callable(getter):
            return getter()
    text = _get(config, "text_config")
    return text if text is not None else config


def model_type_of(config: Any) -> str:
    """The text model's model_type (qwen3_5_text for a qwen3_5 VLM), else the top-level one."""
    return str(_get(text_config(config), "model_type") or _get(config, "model_type") or "")


def family(model_type: str) -> Family | None:
    """The registry entry for `model_type` (None when the project does not list it)."""
    return FAMILIES.get(model_type)


def layer_types(config: Any) -> tuple[str, ...]:
    """The per-layer types the config declares (empty when it declares none)."""
    return tuple(str(t) for t in (_get(text_config(config), "layer_types") or ()))


def recurrent_layer_types(config: Any, declared: tuple[str, ...] | None = None) -> set[str]:
    """Layer types that mix tokens through a recurrent state (empty for attention-only models). `declared`: the
    config's `layer_types`, where the caller has read them already."""
    types = set(layer_types(config) if declared is None else declared)
    recurrent = {t for t in types if t not in ATTENTION_LAYER_TYPES}
    if not types:
        for mt in (model_type_of(config), str(_get(config, "model_type") or "")):
            fam = FAMILIES.get(mt)
            if fam is not None and fam.recurrent:
                return {mt}
    return recurrent


def _softcapped(text: Any) -> bool:
    return any(_get(text, k) not in (None, 0, 0.0) for k in ("attn_logit_softcapping", "final_logit_softcapping"))


def _attn_softcapped(text: Any) -> bool:
    return _get(text, "attn_logit_softcapping") not in (None, 0, 0.0)


def family_of(config: Any) -> Family:
    """The family of this config: the registry entry with the config's own traits applied, or conservative traits
    read from the config for a model_type the registry does not list (`known=False`).

    Config-derived: a sliding window that is set, attention softcapping that is set (then only paths that apply it:
    flash-attn, flex, eager), latent attention (`kv_lora_rank`), experts, recurrent layer types.
    """
    text = text_config(config)
    mt = model_type_of(config)
    base = FAMILIES.get(mt) or FAMILIES.get(str(_get(config, "model_type") or ""))
    declared = layer_types(config)
    recurrent = recurrent_layer_types(config, declared)
    if base is None:
        experts = any(_get(text, k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
        kind = None
        if recurrent:
            kind = GATED_DELTA if recurrent <= {"linear_attention"} else STATE_SPACE
        base = Family(model_type=mt or "unknown", decoder_layer="", moe=bool(experts), recurrent=kind,
                      attention_paths=() if kind == STATE_SPACE else ALL_PATHS,
                      mla=_get(text, "kv_lora_rank") is not None, known=False)
        if kind == GATED_DELTA:  # the per-document wrap needs a known transformers module
            base = dataclasses.replace(base, recurrent=STATE_SPACE, attention_paths=())
    window = _get(text, "sliding_window")
    if _get(text, "use_sliding_window") is False:
        window = None
    sliding = bool(window) or "sliding_attention" in declared
    paths = base.attention_paths
    if _attn_softcapped(text):
        paths = tuple(p for p in paths if p in (FLASH, FLEX, EAGER))
    return dataclasses.replace(base, sliding_window=sliding, logit_softcapping=_softcapped(text),
                               attention_paths=paths)


def lora_targets(config: Any, scope: str = "attention") -> list[str]:
    """Default LoRA `target_modules` for this config: "attention" (the attention projections), "mlp", or "all"
    (attention, MLP and recurrent projections). Expert tensors are `Family.expert_tensors` (target_parameters)."""
    fam = family_of(config)
    if scope == "attention":
        names = fam.attn_proj
    elif scope == "mlp":
        names = fam.mlp_proj
    elif scope == "all":
        names = fam.lora_modules
    else:
        raise ValueError(f"scope must be attention, mlp or all, got {scope!r}")
    if fam.mla:  # a query LoRA rank replaces q_proj with q_a_proj/q_b_proj
        text = text_config(config)
        drop = {"q_proj"} if _get(text, "q_lora_rank") else {"q_a_proj", "q_b_proj"}
        names = tuple(n for n in names if n not in drop)
    return list(names)
