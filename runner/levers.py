"""The speed levers: train fields that change how fast a step runs and how much memory it takes, not what it trains.

Each is `auto` by default and runner.plan.autotune picks it (the fastest setting predicted to fit); a lever the user
sets is kept. This module holds their names and the rules between them, for the spec's validation and the planner.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from runner.errors import Problem

AUTO = "auto"

LEVERS = ("activation_checkpointing", "recompute_layers", "recompute_attention", "offload_activations", "compile",
          "loss_impl", "fsdp_one_rank", "micro_batch", "grad_accum")
"""The train fields the planner fills when they are `auto` (train.optimizer_precision has its own rule in
runner.precision; the attention path and kernel are picked by runner.facts.decisions)."""

PLAIN = {"activation_checkpointing": False, "recompute_layers": None, "recompute_attention": True,
         "offload_activations": False, "compile": False, "loss_impl": "chunked", "fsdp_one_rank": False,
         "micro_batch": 1, "grad_accum": 1}
"""Each lever's plain value, what the fields meant before `auto`: no recompute, no compile, the chunked loss, one rank
unwrapped, one micro-batch. Scripts that measure given settings (benchmarks/) fill the levers they leave auto with
it, so their rows stay comparable with the ones measured before."""

NATIVE_ONLY = ("recompute_layers", "recompute_attention", "offload_activations", "compile")
"""Levers only the native engine honours: the TRL engine checkpoints every layer or none and compiles nothing."""

RECOMPUTE_SUB_LEVERS = {
    # field: (the value that switches it off, what the TRL engine does instead)
    "recompute_layers": ("null", "the trl engine checkpoints every layer or none"),
    "offload_activations": ("false", "the trl engine does not offload activations"),
    "recompute_attention": ("true", "the trl engine recomputes whole layers"),
}


def is_auto(value: Any) -> bool:
    return value == AUTO


def sub_lever_set(train: Any, field: str) -> bool:
    """Whether a recompute lever is set to the value that needs activation checkpointing (auto is not set)."""
    value = getattr(train, field)
    if is_auto(value):
        return False
    if field == "recompute_layers":
        return value is not None
    if field == "recompute_attention":
        return value is False
    return value is True


def checkpointing_required(train: Any) -> bool:
    """A recompute lever the user set needs activation checkpointing on: auto then picks it on."""
    return any(sub_lever_set(train, f) for f in RECOMPUTE_SUB_LEVERS)


def lever_problems(spec: Any) -> list[Problem]:
    """Recompute levers against activation checkpointing and the engine; global_batch_tokens against the split."""
    out: list[Problem] = []
    t = spec.train
    for field, (off, trl_says) in RECOMPUTE_SUB_LEVERS.items():
        if not sub_lever_set(t, field):
            continue
        if t.activation_checkpointing is False:
            out.append(Problem(f"train.{field}", "only applies with activation checkpointing",
                               f"set train.activation_checkpointing=true (or auto), or train.{field}={off}"))
        if spec.engine != "native":
            out.append(Problem(f"train.{field}", trl_says, f"use engine=native, or train.{field}={off}"))
    g = t.global_batch_tokens
    if g is not None and not is_auto(t.micro_batch) and not is_auto(t.grad_accum):
        out.append(Problem("train.global_batch_tokens", "micro_batch and grad_accum are both set: there is no "
                           "split left to choose", "set train.micro_batch=auto or train.grad_accum=auto, or unset "
                           "train.global_batch_tokens"))
    if g is not None and g % t.seq_len:
        out.append(Problem("train.global_batch_tokens", f"must be a multiple of train.seq_len={t.seq_len}, got {g}",
                           f"use {max(1, g // t.seq_len) * t.seq_len}"))
    return out


def tokens_per_forward(train: Any) -> int:
    """Tokens one forward takes (seq_len × micro_batch), for the choices made before the planner's (the attention
    path): a micro_batch still auto counts as 1."""
    return train.seq_len * (1 if is_auto(train.micro_batch) else int(train.micro_batch))


def unresolved(train: Any) -> list[str]:
    """The levers still `auto` in a train section."""
    return [f for f in LEVERS if is_auto(getattr(train, f))]


@dataclass(frozen=True)
class Levers:
    """Every lever's value, resolved: what the engine runs with."""

    activation_checkpointing: bool
    recompute_layers: int
    """Decoder layers that recompute (0 without checkpointing, all of them for the TRL engine's checkpointing)."""
    recompute_attention: bool
    offload_activations: bool
    compile: bool
    loss_impl: str
    fsdp_one_rank: bool
    micro_batch: int
    grad_accum: int

    def train_fields(self, engine: str, layers: int) -> dict[str, Any]:
        """The spec's train fields for these levers (the TRL engine takes no recompute count and no loss choice)."""
        on = self.activation_checkpointing
        out: dict[str, Any] = {
            "activation_checkpointing": on, "recompute_attention": self.recompute_attention,
            "offload_activations": self.offload_activations, "compile": self.compile,
            "fsdp_one_rank": self.fsdp_one_rank, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "recompute_layers": min(self.recompute_layers, layers) if on and engine == "native" else None}
        if engine == "native":
            out["loss_impl"] = self.loss_impl
        return out

    def describe(self, layers: int) -> str:
        if not self.activation_checkpointing:
            parts = ["no recompute"]
        else:
            parts = [f"recompute {self.recompute_layers} of {layers} layers"]
            if self.offload_activations:
                parts.append("their inputs offloaded")
            elif not self.recompute_attention:
                parts.append("attention outputs kept")
        parts.append(f"{self.loss_impl} loss")
        if self.compile:
            parts.append("compiled layers")
        if self.fsdp_one_rank:
            parts.append("FSDP2 on one rank")
        if self.micro_batch > 1 or self.grad_accum > 1:
            parts.append(f"{self.micro_batch} × {self.grad_accum} micro-batches")
        return ", ".join(parts)


def plain_levers(train: dict[str, Any]) -> dict[str, Any]:
    """A spec's train section (a dict) with every lever still auto at its PLAIN value."""
    return {**train, **{f: v for f, v in PLAIN.items() if is_auto(train.get(f))}}


def with_plain_levers(spec: Any) -> Any:
    """A RunSpec with every lever still auto at its PLAIN value."""
    data = spec.to_dict()
    data["train"] = plain_levers(data["train"])
    return spec.model_validate(data)


def require_resolved(spec: Any) -> None:
    """A run's levers are the launcher's choice (runner.plan.autotune.resolve_levers): an engine never chooses, so
    every rank and the record run the same. A spec that still has an `auto` lever is refused, naming each."""
    left = [f for f in unresolved(spec.train) if not (f == "loss_impl" and spec.engine != "native")]
    if left:
        from runner.errors import SpecError

        raise SpecError("the spec given to the engine still has auto speed levers", [Problem(
            f"train.{f}", "auto, but an engine runs what the launcher chose", "launch with `runner run`, or fill the "
            "spec with runner.plan.autotune.resolve_levers (`runner tune -o` writes one)") for f in left])


def levers_of(spec: Any, layers: int, loss_impl: str) -> Levers:
    """The levers of a spec whose levers are all set: what the estimate reports and what each rank says it ran
    (its `train_begin` event), by this one function."""
    require_resolved(spec)
    t = spec.train
    on = bool(t.activation_checkpointing)
    count = 0 if not on else layers if t.recompute_layers is None or spec.engine != "native" else \
        min(int(t.recompute_layers), layers)
    return Levers(on, count, bool(t.recompute_attention), bool(t.offload_activations), bool(t.compile), loss_impl,
                  bool(t.fsdp_one_rank), int(t.micro_batch), int(t.grad_accum))


def lever_values(spec: Any, layers: int, loss_impl: str) -> dict[str, Any]:
    """levers_of as a dict: what a rank's train_begin event reports (`levers`)."""
    return dataclasses.asdict(levers_of(spec, layers, loss_impl))
