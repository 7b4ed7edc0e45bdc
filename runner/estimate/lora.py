"""LoRA: the trainable adapter parameters a spec adds, and the expert stacks they wrap."""

from __future__ import annotations

from typing import Any

from runner.catalog import Arch


def _matches(name: str, targets: str | list[str]) -> bool:
    if targets == "all-linear":
        return True
    if isinstance(targets, str):
        targets = [targets]
    return any(name == t or name.endswith("." + t) or name.split(".")[-1] == t for t in targets)


def _rank_for(name: str, default: int, pattern: dict[str, int]) -> int:
    for key, r in pattern.items():
        if name == key or name.endswith(key) or key.endswith(name):
            return int(r)
    return default


def lora_params(arch: Arch, lora: Any) -> tuple[int, int, list[str]]:
    """(trainable adapter params, largest adapted expert stack of one layer in params, notes).

    A linear (in → out) gets r·(in + out); an expert tensor (E × in × out) via target_parameters gets
    r·E·(in + out) (peft ParamWrapper: lora_A = Linear(in, r·E), lora_B = Linear(r·E, out)).
    """
    total = 0
    max_expert_stack = 0
    notes: list[str] = []
    for i in range(arch.layers):
        for lin in arch.linears(i):
            if _matches(lin.name, lora.target_modules):
                total += _rank_for(lin.name, lora.r, lora.rank_pattern) * (lin.in_features + lin.out_features)
        stack = 0
        for t in arch.expert_tensors(i):
            if any(t.name == p or t.name.endswith(p) or p.endswith(t.name) for p in lora.target_parameters):
                total += _rank_for(t.name, lora.r, lora.rank_pattern) * t.experts * (t.in_features + t.out_features)
                stack += t.experts * t.in_features * t.out_features
        max_expert_stack = max(max_expert_stack, stack)
    if arch.vision_linears and lora.target_modules == "all-linear":
        total += sum(lora.r * (x.in_features + x.out_features) for x in arch.vision_linears)
        notes.append("all-linear also adapts the vision tower's linears (counted)")
    if lora.target_parameters and max_expert_stack == 0:
        notes.append(f"target_parameters {lora.target_parameters} match no expert tensor of this model")
    return total, max_expert_stack, notes

