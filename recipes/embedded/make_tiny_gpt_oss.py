"""Generates the GPT-OSS-architecture assets: a tiny random-init model and a config-only reduced gpt-oss-120b.

Run from anywhere with ``python recipes/embedded/make_tiny_gpt_oss.py``. Both directories carry a copy of the
embedded tokenizer (512 tokens, ChatML with ``{% generation %}`` markers), so they run offline.

- ``gpt-oss-tiny/``: hidden 64, 2 layers (one sliding-window, one full attention, as GPT-OSS alternates them),
  4 experts top-2, vocab 512, float32 weights from ``torch.manual_seed(0)``; about 0.8 MB. Re-running gives
  byte-identical files with the same library versions.
- ``gpt-oss-reduced/``: gpt-oss-120b's widths (hidden 2880, 64 query heads, 8 KV heads, head_dim 64, expert width
  2880, vocab 201,088) with 8 of its 36 layers and 32 of its 128 experts (top-4). Only ``config.json`` is written:
  the weights (7.8B parameters) are initialised at load time from the run's seed, because no checkpoint this
  size belongs in the repository. The embedded tokenizer uses ids below 512 only; the full vocabulary still
  costs what it costs in the embedding and the LM head.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER_DIR = HERE / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=128)
REDUCED = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=8,
               num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
               num_experts_per_tok=4, sliding_window=128)


def gpt_oss_config(sizes: dict, tokenizer_dir: Path = TOKENIZER_DIR):
    """A GptOssConfig with these sizes and the embedded tokenizer's special tokens (ChatML: no BOS)."""
    from transformers import AutoTokenizer, GptOssConfig

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return GptOssConfig(**sizes, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                        tie_word_embeddings=False, dtype="float32")


def copy_tokenizer(out_dir: Path, tokenizer_dir: Path = TOKENIZER_DIR) -> None:
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out_dir / name)


def make_tiny(out_dir: Path, seed: int = 0, sizes: dict | None = None) -> Path:
    """Write a random-init GPT-OSS model (safetensors) plus the tokenizer to out_dir; returns out_dir."""
    import torch
    from transformers import GptOssForCausalLM

    shutil.rmtree(out_dir, ignore_errors=True)  # stale files would break byte-reproducibility
    out_dir.mkdir(parents=True)
    config = gpt_oss_config(sizes or TINY)
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config)
    model.generation_config.bos_token_id = None
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_tokenizer(out_dir)
    return out_dir


def make_config_only(out_dir: Path, sizes: dict | None = None) -> Path:
    """Write config.json (no weights) plus the tokenizer: a model that is initialised from the run's seed."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    config = gpt_oss_config(sizes or REDUCED)
    config.dtype = "bfloat16"
    data = config.to_dict()
    data["architectures"] = ["GptOssForCausalLM"]
    (out_dir / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    copy_tokenizer(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE,
                        help="folder that receives gpt-oss-tiny/ and gpt-oss-reduced/")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    make_tiny(args.out / "gpt-oss-tiny")
    make_config_only(args.out / "gpt-oss-reduced")
    for sub in ("gpt-oss-tiny", "gpt-oss-reduced"):
        for path in sorted((args.out / sub).rglob("*")):
            print(f"{path.stat().st_size:>9,d}  {path.relative_to(args.out)}")


if __name__ == "__main__":
    main()
