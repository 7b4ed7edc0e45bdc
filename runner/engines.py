"""The training engines as data: one `Engine` record per engine, looked up by name once (`engine_for`).

Spec validation, the estimator, preflight, bench and the rank entry point read an engine's capabilities from its
record, so what an engine can do is written once, here, and nowhere else compares engine names
(`tests/unit/test_engines.py` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Lever:
    """A train.* setting that only some engines honour, and the value that switches it off."""

    field: str
    off: str
    """The value, as `--set` takes it, at which the lever does nothing."""


LEVERS = {lever.field: lever for lever in (
    Lever("train.recompute_layers", "null"),
    Lever("train.offload_activations", "false"),
    Lever("train.recompute_attention", "true"),
    Lever("train.optimizer_precision", "auto"),
)}
"""Every engine-specific lever; an engine that lacks one says what it does instead (`Engine.lacks`)."""


@dataclass(frozen=True, eq=False)  # one record per engine, compared and hashed by identity (`lacks` is a dict)
class Engine:
    """What one engine does with a spec: the facts the planner, validation and the ranks must agree on."""

    name: str
    entry: str
    """Module whose `train(spec, rt, events, run_dir, resume)` runs inside each rank."""
    description: str
    always_packs: bool
    """True: blocks are always packed whatever train.packing says; False: train.packing decides (one document per
    block when off)."""
    lacks: dict[str, str] = field(default_factory=dict)
    """Levers (keys of LEVERS) the engine does not honour, each with what the engine does instead."""
    hf_trainer: bool = False
    """Runs under transformers' Trainer and accelerate's FSDP2: their allocation pattern, casts and step overhead
    (the estimator's constants for it are fitted separately)."""
    fixed_loss: tuple[str, str] | None = None
    """(loss implementation, reason) when the engine ignores train.loss_impl; None when it honours it."""
    fixed_optimizer_precision: str | None = None
    """The master-weight precision the engine always keeps (train.optimizer_precision must be auto or this); None
    when train.optimizer_precision decides."""
    autocast: bool = False
    """Computes in bf16 under autocast over fp32 trainable weights on CUDA (rather than bf16 weights / FSDP's mixed
    precision)."""
    fsdp_one_cpu_rank: bool = True
    """Can wrap one CPU process in FSDP when train.fsdp_one_rank asks (accelerate refuses it)."""
    fsdp_one_gpu_rank_unless_bf16: bool = False
    """Wraps one GPU rank whose weights are not bf16, FSDP's mixed precision being what computes them in bf16."""
    offloads_activations: bool = False
    """Can move recomputed layers' inputs to host memory (train.offload_activations)."""
    selective_recompute: bool = False
    """Its checkpoint policy can keep varlen attention outputs (train.recompute_attention=false)."""
    checkpoint_inside_compile: bool = False
    """Compiled layers hold their checkpoint inside the compiled graph (a dense MLP's down_proj is not recomputed)."""
    exports_full_lora: bool = True
    """Can export a LoRA run's merged full model (output.save=full)."""
    checks_own_attention: bool = False
    """Its own preflight (`problems`) covers the attention path, so the generic attention check stands aside."""
    problems: str | None = None
    """'module:function' with the engine's own checks before launch: f(spec, config, device, lora=False)."""
    boundaries_from_collator: bool = False
    """Document boundaries of packed blocks reach the model through a collator whose version decides whether
    recurrent layers get them (checked before launch)."""
    data_workers: bool = True
    """Honours train.data_workers: each DataLoader worker reads and packs its own share of the rank's rows."""
    pads_ranks_to_longest: bool = False
    """Every rank is padded to the longest rank's blocks (all ranks run its steps); False: the run stops at the step
    where the first rank runs out of blocks."""

    def packs(self, packing: bool) -> bool:
        """Whether blocks are packed for a spec whose train.packing is `packing`."""
        return self.always_packs or packing

    def honours(self, lever: str) -> bool:
        return lever not in self.lacks

    def check_problems(self, spec: Any, config: Any, device: str) -> list[Any]:
        """The engine's own checks before launch (empty when it has none)."""
        if self.problems is None:
            return []
        import importlib

        module, func = self.problems.split(":")
        return list(getattr(importlib.import_module(module), func)(spec, config, device, lora=False))


NATIVE = Engine(
    name="native", entry="runner.train.native", always_packs=False,
    description="plain PyTorch FSDP2, the project's own loop",
    fsdp_one_gpu_rank_unless_bf16=True, offloads_activations=True, selective_recompute=True,
    checkpoint_inside_compile=True, exports_full_lora=False,
)
TRL = Engine(
    name="trl", entry="runner.train.trl_engine", always_packs=False,
    description="TRL SFTTrainer with accelerate's FSDP2 and peft",
    lacks={"train.recompute_layers": "the trl engine checkpoints every layer or none",
           "train.offload_activations": "the trl engine does not offload activations",
           "train.recompute_attention": "the trl engine recomputes whole layers",
           "train.optimizer_precision": "the trl engine keeps fp32 master weights"},
    hf_trainer=True, fixed_loss=("trl-fused", "TRL's fused lm head"), fixed_optimizer_precision="fp32_master",
    autocast=True, fsdp_one_cpu_rank=False, checks_own_attention=True,
    problems="runner.train.trl_engine:trl_problems", boundaries_from_collator=True, data_workers=False,
    pads_ranks_to_longest=True,
)
ENGINES: dict[str, Engine] = {e.name: e for e in (NATIVE, TRL)}


def engine_for(name: str) -> Engine:
    """The record of engine `name` (a RunSpec's `engine`, which validation has already checked)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}") from None
