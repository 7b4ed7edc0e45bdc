"""QLoRA on the TRL engine: the base loaded through bitsandbytes' 4-bit layers, checked before launch and recorded."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from runner.errors import Problem
from runner.spec import RunSpec


def bnb_4bit_problems(spec: RunSpec, device: str) -> list[Problem]:
    """QLoRA here loads the base through bitsandbytes' 4-bit layers: refused before launch where they cannot run
    (its NF4 kernels need a CUDA GPU), or where quantizing needs a checkpoint that a random init does not have."""
    fix = "use --set engine=native (torchao's NF4, which runs on CPU too)"
    if spec.output.save == "full":
        return [Problem("output.save", "a full export of a qlora run would merge the adapters into a 4-bit base",
                        "use output.save=adapter")]
    if device != "cuda":
        return [Problem("method.kind", f"qlora on the trl engine needs bitsandbytes' 4-bit kernels, which need a "
                                       f"CUDA GPU (this run is on {device})", fix)]
    if importlib.util.find_spec("bitsandbytes") is None:
        return [Problem("method.kind", "qlora on the trl engine needs bitsandbytes, which is not installed",
                        "pip install bitsandbytes, or " + fix)]
    if spec.model.init == "random":
        return [Problem("model.init", "qlora on the trl engine quantizes the checkpoint as it loads; "
                                      "model.init=random has none", fix)]
    return []


def bnb_4bit_record(spec: RunSpec) -> dict[str, Any] | None:
    """What the record pins of the bitsandbytes quantization (None unless qlora)."""
    from runner.versions import package_versions

    if spec.method.kind != "qlora":
        return None
    return {"type": "nf4", "block_size": 64, "double_quantized": True, "compute_dtype": "bfloat16",
            "storage_dtype": "bfloat16", "library": f"bitsandbytes {package_versions(('bitsandbytes',))['bitsandbytes']}"}


def bnb_4bit_config() -> Any:
    """QLoRA through bitsandbytes as TRL documents it for FSDP: NF4 with double quantization, computing in bf16, the
    4-bit codes stored in bf16 tensors so that FSDP2 shards them with the rest."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
