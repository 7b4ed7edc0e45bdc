"""Which transformers Auto class loads a spec's model, and whether a model folder holds weights (no torch import:
the attention choice and the wizard ask)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.imports import from_transformers
from runner.spec import model_source

if TYPE_CHECKING:
    from runner.spec import RunSpec


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def has_weights(path: Path) -> bool:
    return any((path / name).is_file() for name in WEIGHT_FILES) or any(path.glob("*.safetensors"))


def is_vlm_config(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None


def model_class(spec: RunSpec, config: Any) -> Any:
    """AutoModelForImageTextToText for VLM-style checkpoints (loader image_text_to_text, or auto with a vision
    tower in the config), else AutoModelForCausalLM."""
    AutoModelForCausalLM, AutoModelForImageTextToText = from_transformers("AutoModelForCausalLM",
                                                                          "AutoModelForImageTextToText")

    loader = spec.model.loader
    if loader == "image_text_to_text" or (loader == "auto" and is_vlm_config(config)):
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def load_config(spec: RunSpec) -> Any:
    AutoConfig = from_transformers("AutoConfig")

    src, rev = model_source(spec)
    return AutoConfig.from_pretrained(src, revision=rev, trust_remote_code=spec.model.trust_remote_code)
