"""Which transformers Auto class loads a spec's model (no torch import: the attention choice asks it too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.imports import from_transformers

if TYPE_CHECKING:
    from runner.spec import RunSpec


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
