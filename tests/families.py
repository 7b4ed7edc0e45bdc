"""The family matrix: one small config per decoder family, built from transformers' own config classes (no hub).

Shared by the CPU tests (tiny width) and benchmarks/families_gpu.py (a width that exercises the real kernels):
`family_config(name, width)` gives the transformers config; `write_model_folder` writes it with the embedded
ChatML tokenizer as a config-only model folder that `runner run` trains from random init.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "recipes" / "embedded" / "tokenizer"
VOCAB = 512  # the embedded tokenizer's vocabulary


@dataclass(frozen=True)
class Width:
    """The sizes a family config is drawn at: tiny for CPU tests, real head dims for the GPU matrix."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    experts: int = 4
    vocab: int = VOCAB
    window: int = 16
    """Sliding window of the families that have one: shorter than most test documents."""


TINY = Width()
GPU = Width(hidden=1024, layers=4, heads=8, kv_heads=4, head_dim=128, intermediate=2048, experts=8, window=2048)


def _dense(w: Width) -> dict[str, Any]:
    return dict(vocab_size=w.vocab, hidden_size=w.hidden, intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                num_attention_heads=w.heads, num_key_value_heads=w.kv_heads, head_dim=w.head_dim,
                max_position_embeddings=65_536, pad_token_id=0, eos_token_id=2, bos_token_id=1,
                tie_word_embeddings=False)


def _moe(w: Width, **extra: Any) -> dict[str, Any]:
    return dict(_dense(w), moe_intermediate_size=w.intermediate // 2, **extra)


def _alternate(w: Width, a: str, b: str) -> list[str]:
    return [a if i % 2 == 0 else b for i in range(w.layers)]


def _configs(w: Width) -> dict[str, tuple[str, dict[str, Any]]]:
    dense = _dense(w)
    no_head_dim = {k: v for k, v in dense.items() if k != "head_dim"}
    hd = {"hidden_size": w.heads * w.head_dim}
    return {
        "llama": ("LlamaConfig", dense),
        "mistral": ("MistralConfig", dict(dense, sliding_window=None)),
        "mixtral": ("MixtralConfig", dict(dense, num_local_experts=w.experts, num_experts_per_tok=2,
                                          sliding_window=None)),
        "qwen2": ("Qwen2Config", dict(no_head_dim, **hd)),
        "qwen3": ("Qwen3Config", dense),
        "qwen3_moe": ("Qwen3MoeConfig", _moe(w, num_experts=w.experts, num_experts_per_tok=2)),
        "gemma2": ("Gemma2Config", dict(dense, sliding_window=w.window, layer_types=_alternate(
            w, "sliding_attention", "full_attention"), tie_word_embeddings=True)),
        "gemma3_text": ("Gemma3TextConfig", dict(dense, sliding_window=w.window, layer_types=_alternate(
            w, "sliding_attention", "full_attention"), tie_word_embeddings=True)),
        # Phi-3.5-mini's layout: a sliding window on every layer (2,047 there) and long-context RoPE factors.
        "phi3": ("Phi3Config", dict(no_head_dim, **hd, sliding_window=w.window, original_max_position_embeddings=4096,
                                    rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * (w.head_dim // 2),
                                                  "long_factor": [1.0 + i / w.head_dim
                                                                  for i in range(w.head_dim // 2)]})),
        "olmo2": ("Olmo2Config", dict(no_head_dim, **hd)),
        "granite": ("GraniteConfig", dict(no_head_dim, **hd, embedding_multiplier=12.0, logits_scaling=8.0,
                                          residual_multiplier=0.22, attention_multiplier=1.0 / w.head_dim)),
        "gpt_oss": ("GptOssConfig", dict(dense, num_local_experts=w.experts, num_experts_per_tok=2,
                                         sliding_window=w.window, layer_types=_alternate(
                                             w, "sliding_attention", "full_attention"))),
        "qwen3_next": ("Qwen3NextConfig", _moe(w, num_experts=w.experts, num_experts_per_tok=2,
                                               shared_expert_intermediate_size=w.intermediate // 2,
                                               linear_num_key_heads=w.kv_heads, linear_num_value_heads=w.heads,
                                               linear_key_head_dim=w.head_dim, linear_value_head_dim=w.head_dim,
                                               layer_types=_alternate(w, "linear_attention", "full_attention"))),
        "deepseek_v3": ("DeepseekV3Config", dict(
            {k: v for k, v in _moe(w).items() if k != "head_dim"}, n_routed_experts=w.experts, num_experts_per_tok=2,
            n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=w.head_dim * 2,
            q_lora_rank=w.head_dim * 4, qk_rope_head_dim=w.head_dim // 2, qk_nope_head_dim=w.head_dim,
            v_head_dim=w.head_dim, num_key_value_heads=w.heads)),
    }


FAMILIES = tuple(_configs(TINY))
"""The families of the matrix, by transformers model_type."""


def family_config(name: str, width: Width = TINY) -> Any:
    """The transformers config of family `name` at `width`, in float32 with eager-compatible defaults."""
    import transformers

    cls_name, kwargs = _configs(width)[name]
    config = getattr(transformers, cls_name)(**kwargs)
    config.use_cache = False
    return config


def write_model_folder(name: str, out: Path, width: Width = TINY) -> Path:
    """A config-only model folder (config.json + the embedded ChatML tokenizer) for `runner run` with random init."""
    out.mkdir(parents=True, exist_ok=True)
    family_config(name, width).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (out / f).write_bytes((TOKENIZER / f).read_bytes())
    return out
