"""LoRA through peft, including LoRA on MoE expert tensors (peft `target_parameters`), and its preflight checks."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runner.facts.catalog import in_vision_part
from runner.decide.rules import ALL_LINEAR, lora_module_targeted, lora_parameter_targeted, lora_rank_key
from runner.errors import Problem, SpecError
from runner.imports import from_transformers
from runner.spec import RunSpec

# A numbered block in a module path ("model.layers.11.mlp"): stripped when listing names a user can target.
_LAYER_INDEX = re.compile(r"^(?:.*\.)?\d+\.")


def build_lora_config(spec: RunSpec, model: nn.Module | None = None) -> Any:
    """The peft LoraConfig for spec.method.lora (bias none, causal LM). With the model, 'all-linear' becomes the
    exact list of modules `all_linear_modules` picks (peft's own reading would adapt routers and vision towers)."""
    from peft import LoraConfig

    lo = spec.method.lora
    targets: Any = lo.target_modules if isinstance(lo.target_modules, str) else list(lo.target_modules)
    if model is not None and targets == ALL_LINEAR:
        targets = all_linear_modules(model)[0]
    return LoraConfig(
        r=lo.r,
        lora_alpha=lo.alpha,
        lora_dropout=lo.dropout,
        target_modules=targets,
        target_parameters=list(lo.target_parameters) or None,
        rank_pattern=dict(lo.rank_pattern),
        bias="none",
        task_type="CAUSAL_LM",
    )


def base_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the frozen weights (the input embedding's, else the first floating parameter's)."""
    emb = getattr(model, "get_input_embeddings", lambda: None)()
    weight = getattr(emb, "weight", None)
    if weight is not None and weight.is_floating_point():
        return weight.dtype
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def apply_lora(model: nn.Module, spec: RunSpec) -> nn.Module:
    """Wrap the model with peft adapters from the spec; call before FSDP sharding.

    peft creates adapters in float32; they are cast to the base weights' dtype so that every FSDP parameter group
    holds one dtype (the 120B notebook does the same with `model.to(bfloat16)`).
    """
    from peft import get_peft_model

    problems = lora_problems(model, spec)
    if problems:
        raise SpecError("LoRA settings do not fit this model", problems)
    dtype = base_dtype(model)
    with warnings.catch_warnings():
        # peft checks rank_pattern keys against adapted modules only, not adapted tensors, and warns that keys
        # such as mlp.experts.down_proj match nothing while it applies them; lora_problems checked both above.
        warnings.filterwarnings("ignore", message="The following rank_pattern keys did not match",
                                category=RuntimeWarning)
        peft_model = get_peft_model(model, build_lora_config(spec, model))
    for p in peft_model.parameters():
        if p.requires_grad and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return peft_model


def trainable_params(model: nn.Module) -> int:
    """Parameters that receive gradients (global counts: a DTensor's numel is its full size)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------------
# Checks that need only the module tree: they run on the meta device, before any weight is read


def _linear_types() -> tuple[type, ...]:
    types: list[type] = [nn.Linear]
    try:
        from transformers.pytorch_utils import Conv1D

        types.append(Conv1D)
    except ImportError:
        pass
    return tuple(types)


def _adaptable_module_types() -> tuple[type, ...]:
    # What peft's LoRA dispatcher can wrap when a module is named in target_modules.
    return (*_linear_types(), nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)


def _short(name: str) -> str:
    return _LAYER_INDEX.sub("", name)


def _output_embedding_names(model: nn.Module) -> set[str]:
    out = getattr(model, "get_output_embeddings", lambda: None)()
    return {n for n, m in model.named_modules() if out is not None and m is out}


def linear_module_names(model: nn.Module) -> list[str]:
    """Modules that `all-linear` adapts: every Linear except the output head (peft's rule)."""
    skip = _output_embedding_names(model)
    return [n for n, m in model.named_modules() if isinstance(m, _linear_types()) and n not in skip]


ROUTER_NAMES = ("gate", "router", "wg", "gating", "router.layer")
"""Last parts of a router's module name (Qwen/Mixtral `mlp.gate`, Llama 4 `router`, DBRX `router.layer`): with
the expert count as its output width, such a Linear routes tokens (its output picks experts; Llama 4's returns a
tuple that LoRA's wrapper cannot pass on)."""


def _expert_count(model: nn.Module) -> int | None:
    from runner.facts.families import text_config

    text = text_config(getattr(model, "config", None))
    for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        n = getattr(text, k, None)
        if isinstance(n, int) and n > 1:
            return n
    return None


def is_router(name: str, module: nn.Module, experts: int | None) -> bool:
    """A Linear that scores experts: named like a router, with one output per expert."""
    tail = name.rsplit(".", 1)[-1]
    named = tail in ROUTER_NAMES or name.endswith(".router.layer") or "router" in tail
    return named and experts is not None and getattr(module, "out_features", None) == experts


def all_linear_modules(model: nn.Module) -> tuple[list[str], list[str]]:
    """(the modules 'all-linear' adapts here, a note on each kind it leaves out).

    peft's 'all-linear' is every Linear but the output head. Here, for text-only training, the routers of MoE
    layers are left out (name one in target_modules to adapt it) and so are vision towers and projectors; the
    attention, dense MLP and shared-expert projections stay, in every family, listed or not.
    """
    experts = _expert_count(model)
    modules = dict(model.named_modules())
    out, routers, vision = [], [], []
    for name in linear_module_names(model):
        if in_vision_part(name):
            vision.append(name)
        elif is_router(name, modules[name], experts):
            routers.append(name)
        else:
            out.append(name)
    notes = []
    if routers:
        notes.append(f"routers not adapted ({_listing(routers, 3)}): name them in method.lora.target_modules to "
                     "adapt them")
    if vision:
        notes.append(f"vision tower and projector not adapted ({len(vision)} Linear layers): text-only data never "
                     "runs through them")
    return out, notes


def expert_notes(model: nn.Module, spec: RunSpec) -> list[str]:
    """Expert weights LoRA leaves alone with these settings (said at launch, so a run does not train its attention
    only by surprise)."""
    lo = spec.method.lora
    # Experts kept as 3-D stacks (transformers 5.x fused experts, granitemoe's ParallelExperts): no Linear to wrap.
    experts = [n for n, p in model.named_parameters() if p.dim() == 3
               and not lora_parameter_targeted(n, list(lo.target_parameters))]
    if not experts:
        return []
    return [f"expert weights not adapted ({_listing(experts, 3)}): add them to method.lora.target_parameters to "
            "adapt them"]


def lora_notes(model: nn.Module, spec: RunSpec) -> list[str]:
    """What the LoRA settings leave out of this model, one line each (empty for a full fine-tune)."""
    if not spec.method.adapters:
        return []
    lo = spec.method.lora
    notes = all_linear_modules(model)[1] if lo.target_modules == ALL_LINEAR else []
    return notes + expert_notes(model, spec)


def tensor_parameter_names(model: nn.Module) -> list[str]:
    """Weights `target_parameters` can adapt: 2-D or 3-D tensors held directly by a module LoRA cannot wrap
    (MoE expert stacks, routers). Biases are left out: a low-rank update of a bias vector stack means nothing."""
    out = []
    for mod_name, module in model.named_modules():
        if isinstance(module, _adaptable_module_types()):
            continue
        for p_name, p in module.named_parameters(recurse=False):
            if p.dim() in (2, 3) and not p_name.endswith("bias"):
                out.append(f"{mod_name}.{p_name}" if mod_name else p_name)
    return out


def _listing(names: list[str], limit: int = 12) -> str:
    uniq = sorted(dict.fromkeys(_short(n) for n in names))
    more = f", … ({len(uniq) - limit} more)" if len(uniq) > limit else ""
    return ", ".join(uniq[:limit]) + more if uniq else "none"


def lora_problems(model: nn.Module, spec: RunSpec) -> list[Problem]:
    """Every way the LoRA settings fail to fit this model's module tree, each naming its field and a fix.

    Works on a model built on the meta device. Checks: target modules that match no module (or match one peft
    cannot wrap), target parameters naming tensors that do not exist, rank_pattern keys that match no target,
    and lora_dropout with tensor targets (peft's ParamWrapper cannot apply dropout).
    """
    if not spec.method.adapters:
        return []
    lo = spec.method.lora
    problems: list[Problem] = []
    modules = dict(model.named_modules())
    linear = linear_module_names(model)
    tensors = tensor_parameter_names(model)
    targeted: list[str] = []

    if isinstance(lo.target_modules, str) and lo.target_modules == ALL_LINEAR:
        linear = all_linear_modules(model)[0]
        if not linear:
            problems.append(Problem("method.lora.target_modules",
                                    f"'all-linear' matches no Linear layer in {type(model).__name__}",
                                    "list module names, or adapt tensors through method.lora.target_parameters"))
        targeted += linear
    else:
        entries = [lo.target_modules] if isinstance(lo.target_modules, str) else list(lo.target_modules)
        regex = isinstance(lo.target_modules, str)  # peft reads a single string as a regex over full names
        for target in entries:
            try:
                hits = [n for n in modules if n and lora_module_targeted(n, target if regex else [target])]
            except re.error as e:
                problems.append(Problem("method.lora.target_modules", f"'{target}' is not a valid regex: {e}",
                                        "give a list of module names, or 'all-linear'"))
                continue
            if not hits:
                problems.append(Problem("method.lora.target_modules",
                                        f"'{target}' matches no module of {type(model).__name__}",
                                        f"Linear layers here: {_listing(linear)} (or 'all-linear')"))
                continue
            wrappable = [n for n in hits if isinstance(modules[n], _adaptable_module_types())]
            other = [n for n in hits if n not in wrappable]
            if other:
                inside = [t for t in tensors if t.startswith(other[0] + ".")]
                fix = (f"adapt its tensors through method.lora.target_parameters: {_listing(inside)}" if inside
                       else f"Linear layers here: {_listing(linear)}")
                problems.append(Problem("method.lora.target_modules",
                                        f"'{target}' matches {type(modules[other[0]]).__name__} modules "
                                        f"({_short(other[0])}), which LoRA cannot wrap", fix))
            targeted += wrappable

    for target in lo.target_parameters:
        hits = [n for n in tensors if lora_parameter_targeted(n, [target])]
        if not hits:
            problems.append(Problem("method.lora.target_parameters",
                                    f"'{target}' names no 2-D/3-D weight tensor of {type(model).__name__}",
                                    f"tensors that can be adapted here: {_listing(tensors)}"))
        targeted += hits
    if lo.target_parameters and lo.dropout:
        problems.append(Problem("method.lora.dropout",
                                f"must be 0 when method.lora.target_parameters is set, got {lo.dropout} "
                                "(peft cannot apply dropout to adapted tensors)", "set method.lora.dropout=0"))

    for key in lo.rank_pattern:
        try:
            matched = any(lora_rank_key(n, {key: 0}) for n in targeted)
        except re.error as e:
            problems.append(Problem("method.lora.rank_pattern", f"key '{key}' is not a valid regex: {e}",
                                    "use a module or tensor name suffix"))
            continue
        if not matched:
            problems.append(Problem("method.lora.rank_pattern",
                                    f"key '{key}' matches no adapted module or tensor",
                                    f"use a suffix of an adapted name, e.g. {_listing(targeted, 6)}"))
    return problems


def meta_model(config: Any, spec: RunSpec | None = None) -> nn.Module:
    """The model's module tree on the meta device: shapes and names without reading or allocating weights.

    `config` is a transformers config, a config dict, or a model directory holding config.json.
    """
    AutoConfig, AutoModelForCausalLM = from_transformers("AutoConfig", "AutoModelForCausalLM")

    trust = bool(spec and spec.model.trust_remote_code)
    if isinstance(config, (str, Path)):
        config = AutoConfig.from_pretrained(str(config), trust_remote_code=trust)
    elif isinstance(config, dict):
        data = dict(config)
        model_type = data.pop("model_type")
        config = AutoConfig.for_model(model_type, **data)
    auto: Any = AutoModelForCausalLM
    if spec is not None:
        from runner.train.model import model_class

        auto = model_class(spec, config)  # the loader's choice: a VLM-style checkpoint builds its whole tree
    # from_config never applies a quantization_config, so an MXFP4 checkpoint's tree is its dequantized one.
    with torch.device("meta"):
        return auto.from_config(config, trust_remote_code=trust)


def lora_problems_from_config(config: Any, spec: RunSpec) -> list[Problem]:
    """lora_problems on a meta-device model built from the config alone (for preflight: no weights, no memory)."""
    if not spec.method.adapters:
        return []
    return lora_problems(meta_model(config, spec), spec)
