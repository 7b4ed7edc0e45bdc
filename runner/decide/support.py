"""What a run's decisions read from the machine and the model's code before launch: the attention kernels
installed here (`available_kernels`), the paths a model class supports on packed blocks (`supported_attention`, read
from its source by `packed_mask_route`), and the attention path they give (`attention_here`). Probed once, where the
run is decided; torch and transformers are imported only inside the probes."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from runner.decide.loader import model_class
from runner.decide.rules import AttentionChoice, Kernels, attention_refusal, choose_attention
from runner.engines import tokens_per_forward
from runner.facts.families import VARLEN

MASK_BUILDERS = frozenset({"create_causal_mask", "create_sliding_window_causal_mask", "create_chunked_causal_mask"})

# ---------------------------------------------------------------------------------------------
# Kernels installed here


def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def flash_attn_available() -> bool:
    # The flash-attn package's compiled FA2 extension: flash-attn-4 installs `flash_attn.cute` alone, which
    # transformers' flash_attention_2 cannot use.
    return importlib.util.find_spec("flash_attn_2_cuda") is not None


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def varlen_takes_window() -> bool:
    """Whether torch's varlen_attn takes window_size (sliding-window layers need it)."""
    from torch.nn.attention.varlen import varlen_attn

    try:
        return "window_size" in inspect.signature(varlen_attn).parameters
    except (TypeError, ValueError):
        return False


def available_kernels(device: str) -> Kernels:
    """The attention kernels this process can use on `device` (what runner.decide.rules.choose_attention is given):
    probed once, where a run is decided."""
    cuda = device == "cuda"
    varlen = cuda and varlen_available()
    return Kernels(varlen=varlen, flash_attn=cuda and flash_attn_available(), flex=flex_available(),
                   varlen_window=not varlen or varlen_takes_window(), fa4=cuda and fa4_available(),
                   liger=cuda and importlib.util.find_spec("liger_kernel") is not None)

@functools.cache
def fa4_available() -> bool:
    """flash-attn-4 is installed with the CuTe DSL it compiles with, and this process's GPU is one its kernels are
    built for (SM 9.x or 10.x). Without the DSL's `cutlass.cute` flash-attn-4 imports, then every kernel fails at its
    first call: the DSL's own .pth file puts `cutlass` on the path (a copy of the wheels on PYTHONPATH does not run
    it), and since 4.8 its Python sources come in a wheel of their own (nvidia-cutlass-dsl-libs-core), without which
    `cutlass` is an empty namespace."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        if importlib.util.find_spec("flash_attn.cute") is None or not has_cute(importlib.util.find_spec("cutlass")):
            return False
    except (ImportError, ValueError):
        return False
    return torch.cuda.get_device_capability()[0] in (9, 10)


def has_cute(spec: Any) -> bool:
    """The `cutlass` package found (an import spec, or None) holds `cute`; read from its folders, not imported (the
    DSL's import takes seconds)."""
    return spec is not None and any((Path(p) / "cute" / "__init__.py").is_file()
                                    for p in (spec.submodule_search_locations or []))


# ---------------------------------------------------------------------------------------------
# What a model class supports


def supported_attention(model_cls: Any, packed: bool = True) -> set[str] | None:
    """The attention paths a model class supports on packed blocks (None when unknown, e.g. remote code).

    From the class's `_supports_*` flags, less the mask-based paths (flex, sdpa, eager) when its forward neither
    builds its masks from position_ids nor takes the per-layer-type masks `install_packed_mask` gives it: with
    those, packed documents would see each other (`packed=False`: one document per block, no such concern).
    """
    if model_cls is None:
        return None
    flags = {"flash_attention_2": "_supports_flash_attn", "flex_attention": "_supports_flex_attn",
             "sdpa": "_supports_sdpa"}
    out = {"eager", VARLEN}  # varlen is registered as a custom function: any model that calls the interface
    out |= {impl for impl, flag in flags.items() if getattr(model_cls, flag, False)}
    if packed and packed_mask_route(model_cls) == "none":
        out -= {"flex_attention", "sdpa", "eager"}
    return out


def concrete_model_class(auto_cls: Any, config: Any) -> Any:
    """The class an Auto* class would build for this config (None for remote code or unknown configs)."""
    try:
        return auto_cls._model_mapping[type(config)]
    except Exception:  # noqa: BLE001 - remote-code configs are not in the mapping
        return None


def attention_here(spec: Any, config: Any, device: str,
                   kernels: Kernels | None = None) -> tuple[AttentionChoice, tuple[str, str] | None]:
    """The attention path a run of `spec` takes on `device`: runner.decide.rules.choose_attention with the model
    class's declared support and `kernels` (None = the ones installed here), and (why, fix) when that path cannot
    train it."""
    t = spec.train
    supported = supported_attention(concrete_model_class(model_class(spec, config), config), t.packing)
    kernels = kernels or available_kernels(device)
    choice = choose_attention(spec.model.attn_implementation, device, tokens_per_forward(t), supported, config,
                              kernels, t.packing, spec.model.varlen_kernel).with_kernel(spec.model.varlen_kernel,
                                                                                        kernels, config)
    return choice, attention_refusal(choice.impl, device, config, supported, kernels, t.packing)


def _mask_calls(forward: ast.FunctionDef) -> tuple[list[bool], bool]:
    """([whether each mask-builder call in this forward is given position_ids], whether the forward takes a dict of
    prepared masks as its attention_mask)."""
    dict_keys: dict[str, set[str]] = {}
    aliases = set(MASK_BUILDERS)
    takes_dict = False
    for node in ast.walk(forward):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
            if isinstance(value, ast.Dict):
                dict_keys[target] = {k.value for k in value.keys if isinstance(k, ast.Constant)}
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "copy" \
                    and isinstance(value.func.value, ast.Name):  # sliding_kwargs = mask_kwargs.copy()
                dict_keys[target] = set(dict_keys.get(value.func.value.id, set()))
            names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
            if names & MASK_BUILDERS and not isinstance(value, ast.Call):
                aliases.add(target)  # mask_function = create_causal_mask if ... else create_sliding_...
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            if getattr(node.args[1], "id", None) == "dict" and "attention_mask" in ast.unparse(node.args[0]):
                takes_dict = True
    given: list[bool] = []
    for node in ast.walk(forward):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in aliases:
            keys = {k.arg for k in node.keywords if k.arg}
            for k in node.keywords:
                if k.arg is None and isinstance(k.value, ast.Name):
                    keys |= dict_keys.get(k.value.id, set())
            given.append("position_ids" in keys)
    return given, takes_dict


@functools.lru_cache(maxsize=128)
def _route_of_class(module_name: str, class_name: str) -> str | None:
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            forward = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
            if forward is None:
                return None
            given, takes_dict = _mask_calls(forward)
            if not given:
                return None
            if all(given):
                return "position_ids"
            return "hook" if takes_dict else "none"
    return None


def _backbone_class(model_cls: type) -> type | None:
    """The decoder-stack class under a causal-LM class: the base model of its module with the same config class."""
    module = sys.modules.get(model_cls.__module__)
    config_cls = getattr(model_cls, "config_class", None)
    for obj in vars(module).values() if module else ():
        if isinstance(obj, type) and obj.__module__ == model_cls.__module__ and "For" not in obj.__name__ \
                and not obj.__name__.endswith("PreTrainedModel") and obj.__name__.endswith("Model") \
                and getattr(obj, "config_class", None) is config_cls:
            return obj
    return None


def packed_mask_route(model_cls: Any) -> str | None:
    """How a model gets document masks on packed rows under flex / sdpa / eager, read from its decoder stack's
    forward (`model_cls` is the causal-LM class or the decoder-stack class itself):

    "position_ids": the forward gives position_ids to transformers' mask builders, which find the documents;
    "hook": it builds masks without them but takes a dict of per-layer-type masks (`install_packed_mask`);
    "none": neither, so only kernels that read cu_seqlens keep its documents apart; None: unknown (no source, or
    the stack builds no mask itself).
    """
    name = getattr(model_cls, "__module__", None) or ""
    if not name.startswith("transformers."):
        return None
    body = model_cls if "For" not in model_cls.__name__ else _backbone_class(model_cls)
    if body is None:
        return None
    try:
        return _route_of_class(name, body.__name__)
    except ImportError:
        return None
