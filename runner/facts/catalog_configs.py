"""Built-in model configs for offline planning: HF config.json subsets of the models the recipes and tests name
(sources in benchmarks/estimator-notes.md), with the published parameter totals they are checked against."""

from __future__ import annotations

import copy
from typing import Any

def _qwen3(hidden: int, layers: int, heads: int, inter: int, tied: bool, kv: int = 8) -> dict[str, Any]:
    return {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 128, "intermediate_size": inter,
            "tie_word_embeddings": tied, "attention_bias": False, "max_position_embeddings": 40960}


def _llama(hidden: int, layers: int, heads: int, inter: int, vocab: int = 128256) -> dict[str, Any]:
    return {"model_type": "llama", "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": 8, "head_dim": hidden // heads,
            "intermediate_size": inter, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}


_QWEN35_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "num_hidden_layers": 64,
        "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
        "attn_output_gate": True, "attention_bias": False, "full_attention_interval": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 48, "linear_value_head_dim": 128, "tie_word_embeddings": False,
        "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
    },
    "vision_config": {
        "model_type": "qwen3_5", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
        "in_channels": 3, "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
        "num_position_embeddings": 2304, "out_hidden_size": 5120, "deepstack_visual_indexes": [],
    },
}


def _gpt_oss(layers: int, experts: int) -> dict[str, Any]:
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
            "hidden_size": 2880, "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 64, "intermediate_size": 2880, "num_local_experts": experts, "num_experts_per_tok": 4,
            "attention_bias": True, "sliding_window": 128, "tie_word_embeddings": False,
            "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
            "max_position_embeddings": 131072}


CATALOG: dict[str, dict[str, Any]] = {
    # The 27B notebook's model: the Qwen3.5-27B architecture (hybrid gated-delta + gated full attention, 3:1).
    "Qwen/Qwen3.8-27B": _QWEN35_27B,
    "Qwen/Qwen3.5-27B": _QWEN35_27B,
    "openai/gpt-oss-120b": _gpt_oss(36, 128),
    "openai/gpt-oss-20b": _gpt_oss(24, 32),
    "Qwen/Qwen3-0.6B": _qwen3(1024, 28, 16, 3072, True),
    "Qwen/Qwen3-1.7B": _qwen3(2048, 28, 16, 6144, True),
    "Qwen/Qwen3-4B": _qwen3(2560, 36, 32, 9728, True),
    "Qwen/Qwen3-8B": _qwen3(4096, 36, 32, 12288, False),
    "Qwen/Qwen3-14B": _qwen3(5120, 40, 40, 17408, False),
    "Qwen/Qwen3-32B": _qwen3(5120, 64, 64, 25600, False),
    "Qwen/Qwen3-30B-A3B": {**_qwen3(2048, 48, 32, 6144, False, kv=4), "model_type": "qwen3_moe", "num_experts": 128,
                           "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                           "mlp_only_layers": []},
    "meta-llama/Llama-3.1-8B": _llama(4096, 32, 32, 14336),
    "meta-llama/Llama-3.1-70B": _llama(8192, 80, 64, 28672),
    "mistralai/Mistral-7B-v0.3": {**_llama(4096, 32, 32, 14336, vocab=32768), "model_type": "mistral",
                                  "sliding_window": None},
}
# Said with every estimate that uses the entry.
CATALOG_NOTES = {
    "Qwen/Qwen3.8-27B": "built-in config is Qwen3.5-27B's (the same architecture family); the pinned revision's own "
                        "config.json wins when it is cached or the hub is reachable",
}
# Instruct / base variants share the architecture.
_ALIASES = {"meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
            "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Llama-3.1-70B",
            "mistralai/Mistral-7B-Instruct-v0.3": "mistralai/Mistral-7B-v0.3",
            "Qwen/Qwen3-30B-A3B-Instruct-2507": "Qwen/Qwen3-30B-A3B",
            "Qwen/Qwen3-4B-Instruct-2507": "Qwen/Qwen3-4B"}

# Published totals the catalog is checked against (tests): model card figures.
PUBLISHED_PARAMS = {
    "Qwen/Qwen3-8B": 8.19e9, "Qwen/Qwen3-1.7B": 1.72e9, "Qwen/Qwen3-14B": 14.8e9, "Qwen/Qwen3-32B": 32.8e9,
    "Qwen/Qwen3-30B-A3B": 30.5e9, "openai/gpt-oss-120b": 116.83e9, "openai/gpt-oss-20b": 20.91e9,
    "meta-llama/Llama-3.1-8B": 8.03e9, "meta-llama/Llama-3.1-70B": 70.6e9, "mistralai/Mistral-7B-v0.3": 7.25e9,
}


def catalog_config(model_id: str) -> dict[str, Any] | None:
    key = _ALIASES.get(model_id, model_id)
    if key not in CATALOG:
        lowered = {k.lower(): k for k in CATALOG}
        key = lowered.get(key.lower(), key)
    cfg = CATALOG.get(key)
    return copy.deepcopy(cfg) if cfg is not None else None
