"""LoRA: the trainable adapter parameters a spec adds, and the expert stacks they wrap."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from runner.facts.catalog import Arch
from runner.decide.rules import ALL_LINEAR, lora_module_targeted, lora_parameter_targeted, lora_rank


def _layer_name(i: int, name: str) -> str:
    """The full dotted name peft sees for a decoder layer's module or tensor (a text model's layout)."""
    return f"model.layers.{i}.{name}"


def lora_params(arch: Arch, lora: Any) -> tuple[int, int, list[str]]:
    """(trainable adapter params, largest adapted expert stack of one layer in params, notes).

    Targets and ranks are matched as peft matches them (runner.decide.rules). A linear (in → out) gets r·(in + out); an expert tensor (E × in × out) via target_parameters gets
    r·E·(in + out) (peft ParamWrapper: lora_A = Linear(in, r·E), lora_B = Linear(r·E, out)).
    """
    modules = lora.target_modules if isinstance(lora.target_modules, str) else tuple(lora.target_modules)
    total, stack, notes = _lora_params(arch, int(lora.r), modules, tuple(lora.target_parameters),
                                       tuple(lora.rank_pattern.items()))
    return total, stack, list(notes)


@functools.lru_cache(maxsize=256)  # the planner prices hundreds of candidates of one model and one adapter setting
def _lora_params(arch: Arch, r: int, target_modules: str | tuple[str, ...], target_parameters: tuple[str, ...],
                 rank_items: tuple[tuple[str, int], ...]) -> tuple[int, int, tuple[str, ...]]:
    lora = SimpleNamespace(r=r, target_modules=target_modules, target_parameters=list(target_parameters),
                           rank_pattern=dict(rank_items))
    total = 0
    max_expert_stack = 0
    notes: list[str] = []
    for i in range(arch.layers):
        for lin in arch.linears(i):
            name = _layer_name(i, lin.name)
            if lora_module_targeted(name, lora.target_modules):
                total += lora_rank(name, lora.r, lora.rank_pattern) * (lin.in_features + lin.out_features)
        stack = 0
        for t in arch.expert_tensors(i):
            name = _layer_name(i, t.name)
            if lora_parameter_targeted(name, lora.target_parameters):
                total += lora_rank(name, lora.r, lora.rank_pattern) * t.experts * (t.in_features + t.out_features)
                stack += t.experts * t.in_features * t.out_features
        max_expert_stack = max(max_expert_stack, stack)
    if arch.vision_linears and lora.target_modules == ALL_LINEAR:
        total += sum(lora.r * (x.in_features + x.out_features) for x in arch.vision_linears)
        notes.append("all-linear also adapts the vision tower's linears (counted)")
    if lora.target_parameters and max_expert_stack == 0:
        notes.append(f"target_parameters {lora.target_parameters} match no expert tensor of this model")
    return total, max_expert_stack, tuple(notes)

