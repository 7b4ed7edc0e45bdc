"""The training engines as data: one `Engine` record per engine, looked up by name once (`engine_for`); and the
speed levers, the train fields that change how fast a step runs, not what it trains (`SPEED_LEVERS`, auto by default,
picked by runner.plan.autotune within what the engine honours).

Spec validation, the estimator, preflight, bench and the rank entry point read an engine's capabilities from its
record, so what an engine can do is written once, here, and nowhere else compares engine names
(`tests/unit/test_registries.py` checks it). What a run saves at its end (`output.save`, `saved_as`) is decided here too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from runner.errors import Problem, SpecError


@dataclass(frozen=True)
class Lever:
    """A train.* setting that only some engines honour, and the value that switches it off."""

    field: str
    off: str
    """The value, as `--set` takes it, at which the lever does nothing."""
    refused: bool = False
    """Validation refuses any other value on an engine that lacks the lever (`lever_problems`); the others are
    refused by rules of their own, or run as the engine can."""


LEVERS = {lever.field: lever for lever in (
    Lever("train.recompute_layers", "null"),
    Lever("train.offload_activations", "false"),
    Lever("train.recompute_attention", "true"),
    Lever("train.optimizer_precision", "auto"),
    Lever("train.tiled_mlp", "auto"),  # auto tiles only where an engine can
    Lever("hardware.sequence_parallel", "1", refused=True),
)}
"""Every engine-specific lever; an engine that lacks one says what it does instead (`Engine.lacks`)."""


@dataclass(frozen=True, eq=False)  # one record per engine, compared and hashed by identity (`lacks` is a dict)
class Engine:
    """What one engine does with a spec: the facts the planner, validation and the ranks must agree on."""

    name: str
    entry: str
    """Module whose `train(spec, rt, events, run_dir, resume)` runs inside each rank."""
    description: str
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
    compiles_layers: bool = False
    """Honours train.compile (each decoder layer torch.compile'd on a GPU)."""
    exports_full_lora: bool = True
    """Can export a LoRA run's merged full model (output.save=full)."""
    checks_own_attention: bool = False
    """Its own preflight (`problems`) covers the attention path, so the generic attention check stands aside."""
    applies_liger: bool = False
    """Applies liger-kernel's layer kernels (RMSNorm, RoPE, SwiGLU) to the families it covers, on CUDA where it is
    installed (`Decisions.liger`)."""
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
    name="native", entry="runner.train.native",
    description="plain PyTorch FSDP2, the project's own loop",
    fsdp_one_gpu_rank_unless_bf16=True, offloads_activations=True, selective_recompute=True,
    checkpoint_inside_compile=True, compiles_layers=True, exports_full_lora=False,
)
TRL = Engine(
    name="trl", entry="runner.train.trl_engine",
    description="TRL SFTTrainer with accelerate's FSDP2 and peft",
    lacks={"train.recompute_layers": "the trl engine checkpoints every layer or none",
           "train.offload_activations": "the trl engine does not offload activations",
           "train.recompute_attention": "the trl engine recomputes whole layers",
           "train.optimizer_precision": "the trl engine keeps fp32 master weights",
           "train.tiled_mlp": "the trl engine runs the MLP untiled",
           "hardware.sequence_parallel": "the trl engine gives each rank whole blocks"},
    hf_trainer=True, fixed_loss=("trl-fused", "TRL's fused lm head"), fixed_optimizer_precision="fp32_master",
    autocast=True, fsdp_one_cpu_rank=False, checks_own_attention=True, applies_liger=True,
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


# ---------------------------------------------------------------------------------------------
# Speed levers: auto by default; the rules between them, and what a run reports of them


AUTO = "auto"

SPEED_LEVERS = ("activation_checkpointing", "recompute_layers", "recompute_attention", "offload_activations", "compile",
                "loss_impl", "fsdp_one_rank", "micro_batch", "grad_accum")
"""The train fields the planner fills when they are `auto` (train.optimizer_precision has its own rule in
runner.precision; the attention path and kernel are picked by runner.decide.rules)."""

PLAIN = {"activation_checkpointing": False, "recompute_layers": None, "recompute_attention": True,
         "offload_activations": False, "compile": False, "loss_impl": "chunked", "fsdp_one_rank": False,
         "micro_batch": 1, "grad_accum": 1}
"""Each lever's plain value, what the fields meant before `auto`: no recompute, no compile, the chunked loss, one rank
unwrapped, one micro-batch. Scripts that measure given settings (benchmarks/) fill the levers they leave auto with
it, so their rows stay comparable with the ones measured before."""

RECOMPUTE_SUB_LEVERS = ("recompute_layers", "offload_activations", "recompute_attention")
"""Levers that act only on recomputed layers: setting one needs activation checkpointing on."""


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


def _able(lever: str) -> str:
    """The engines that honour a lever, as a fix names them."""
    return " or ".join(f"engine={e.name}" for e in ENGINES.values() if e.honours(lever))


def lever_problems(spec: Any) -> list[Problem]:
    """Recompute levers against activation checkpointing and the engine; global_batch_tokens against the split."""
    out: list[Problem] = []
    t = spec.train
    engine = engine_for(spec.engine)
    for name in RECOMPUTE_SUB_LEVERS:
        if not sub_lever_set(t, name):
            continue
        off = LEVERS[f"train.{name}"].off
        if t.activation_checkpointing is False:
            out.append(Problem(f"train.{name}", "only applies with activation checkpointing",
                               f"set train.activation_checkpointing=true (or auto), or train.{name}={off}"))
        if not engine.honours(f"train.{name}"):
            out.append(Problem(f"train.{name}", engine.lacks[f"train.{name}"],
                               f"use {_able(f'train.{name}')}, or train.{name}={off}"))
    for name, why in engine.lacks.items():
        section, key = name.split(".")
        if LEVERS[name].refused and str(getattr(getattr(spec, section), key)) != LEVERS[name].off:
            out.append(Problem(name, why, f"use {_able(name)}, or {name}={LEVERS[name].off}"))
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
    return [f for f in SPEED_LEVERS if is_auto(getattr(train, f))]


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
            "recompute_layers": min(self.recompute_layers, layers)
            if on and engine_for(engine).honours("train.recompute_layers") else None}
        if not engine_for(engine).fixed_loss:
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


@dataclass(frozen=True)
class Where:
    """What a lever's candidates depend on besides the spec: the planned run (runner.plan.autotune fills it)."""

    engine: Engine
    device: str
    world: int
    layers: int
    """Text decoder layers."""
    attn: str
    """The attention path planned (runner.decide.rules.choose_attention)."""
    loss: str
    """The loss the plan resolved for the spec as it is (what an engine with a fixed loss runs)."""
    logits_transformed: bool
    """The model post-processes its logits, so only the full loss reproduces it (runner.decide.rules)."""
    splits: tuple[tuple[int, int], ...]
    """(micro_batch, grad_accum) pairs that make the spec's batch (runner.plan.autotune.batch_splits)."""

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def pick(value: Any, choices: tuple[Any, ...]) -> tuple[Any, ...]:
    """The candidates of a lever: `choices` when it is auto, else the value set."""
    return choices if is_auto(value) else (value,)


def _recompute_counts(t: Any, w: Where, chosen: dict[str, Any]) -> tuple[int, ...]:
    """Layers that recompute: none without checkpointing, all where the engine takes no count, each count from 1
    to all when auto (fewest first: the planner bisects for the first that fits)."""
    if not chosen["activation_checkpointing"]:
        return (0,)
    if not w.engine.honours("train.recompute_layers"):
        return (w.layers,)
    if is_auto(t.recompute_layers):
        return tuple(range(1, w.layers + 1))
    return (w.layers if t.recompute_layers is None else min(t.recompute_layers, w.layers),)


def _offload(t: Any, w: Where, chosen: dict[str, Any]) -> tuple[bool, ...]:
    """Recomputed layers' inputs in host memory: on a GPU where the engine can, and only with checkpointing."""
    if not chosen["activation_checkpointing"]:
        return (False,)
    tries = pick(t.offload_activations, (False, True) if w.cuda and w.engine.offloads_activations else (False,))
    # Offloaded layers keep no attention outputs (runner.decide.decisions.layer_plans): the planner never pairs them.
    return tuple(o for o in tries if not (o and not chosen["recompute_attention"] and is_auto(t.recompute_attention)))


@dataclass(frozen=True)
class Choice:
    """A speed lever as the planner fills it when it is auto: `tries(train, where, chosen)` gives the values to try
    (the value set when it is not auto), `chosen` holding the values of the rows before it in `CHOICES`."""

    fields: tuple[str, ...]
    """The `Levers` fields it sets (two for the batch split, else one)."""
    tries: Callable[[Any, Where, dict[str, Any]], tuple[Any, ...]]


CHOICES: tuple[Choice, ...] = (
    Choice(("micro_batch", "grad_accum"), lambda t, w, c: w.splits),
    # One rank only: with more there is nothing to choose (always wrapped).
    Choice(("fsdp_one_rank",), lambda t, w, c: pick(t.fsdp_one_rank, (False, True) if w.world == 1 else (False,))),
    # The fused loss's gain was measured on GPUs only (compiled chunks): a CPU run keeps the chunked loss.
    Choice(("loss_impl",), lambda t, w, c: (w.loss,) if w.engine.fixed_loss or (is_auto(t.loss_impl) and not w.cuda)
           else pick(t.loss_impl, ("full",) if w.logits_transformed else ("chunked", "fused"))),
    Choice(("compile",), lambda t, w, c: pick(t.compile, (False, True) if w.cuda and w.engine.compiles_layers
                                                 else (False,))),
    Choice(("activation_checkpointing",), lambda t, w, c: (True,) if checkpointing_required(t)
           and is_auto(t.activation_checkpointing) else pick(t.activation_checkpointing, (False, True))),
    # Kept attention outputs are varlen's (runner.decide.decisions.layer_plans).
    Choice(("recompute_attention",), lambda t, w, c: (True,) if not c["activation_checkpointing"] else pick(
        t.recompute_attention, (True, False) if w.cuda and w.engine.selective_recompute and w.attn == "varlen"
        else (True,))),
    Choice(("offload_activations",), _offload),
    # Last: the planner bisects over it (step time grows and memory falls with each recomputed layer).
    Choice(("recompute_layers",), _recompute_counts),
)
"""Every lever the planner chooses, outermost first: the order it enumerates candidates in (the last tie-break).
A new lever the planner fills when auto is one row here; runner.plan.autotune names none."""


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
    left = [f for f in unresolved(spec.train) if not (f == "loss_impl" and engine_for(spec.engine).fixed_loss)]
    if left:
        raise SpecError("the spec given to the engine still has auto speed levers", [Problem(
            f"train.{f}", "auto, but an engine runs what the launcher chose", "launch with `runner run`, or fill the "
            "spec with runner.plan.autotune.resolve_levers (`runner tune -o` writes one)") for f in left])


def levers_of(spec: Any, layers: int, loss_impl: str) -> Levers:
    """The levers of a spec whose levers are all set: what the estimate reports and what each rank says it ran
    (its `train_begin` event), by this one function."""
    require_resolved(spec)
    t = spec.train
    on = bool(t.activation_checkpointing)
    count = 0 if not on else layers if t.recompute_layers is None \
        or not engine_for(spec.engine).honours("train.recompute_layers") else \
        min(int(t.recompute_layers), layers)
    return Levers(on, count, bool(t.recompute_attention), bool(t.offload_activations), bool(t.compile), loss_impl,
                  bool(t.fsdp_one_rank), int(t.micro_batch), int(t.grad_accum))


def lever_values(spec: Any, layers: int, loss_impl: str) -> dict[str, Any]:
    """levers_of as a dict: what a rank's train_begin event reports (`levers`)."""
    levers = levers_of(spec, layers, loss_impl)
    return {f.name: getattr(levers, f.name) for f in dataclasses.fields(levers)}  # flat: no deep copy needed


# ---------------------------------------------------------------------------------------------
# What a run saves


ADAPTER_METHODS = ("lora", "qlora")
"""Method kinds that train an adapter on a frozen base: `output.save: auto` keeps their adapter."""


def saved_as(spec: Any) -> str:
    """What output.save keeps for this spec, `auto` decided: the adapter of an adapter method, else the model."""
    if spec.output.save != "auto":
        return spec.output.save
    return "adapter" if spec.method.kind in ADAPTER_METHODS else "full"


def save_problems(spec: Any) -> list[Problem]:
    """output.save kinds that need an adapter, on a run that has none (or one a merge cannot fold)."""
    out: list[Problem] = []
    save, kind = spec.output.save, spec.method.kind
    if save == "adapter" and kind not in ADAPTER_METHODS:
        out.append(Problem("output.save", "'adapter' needs method.kind=lora", "use output.save=full or method.kind=lora"))
    if save == "merged" and kind not in ADAPTER_METHODS:
        out.append(Problem("output.save", f"'merged' folds an adapter into its base; a {kind} fine-tune has none",
                           "use output.save=full or method.kind=lora"))
    if save == "merged" and spec.method.lora.target_parameters:
        out.append(Problem("output.save", "'merged' folds LoRA on linear layers only, and "
                           "method.lora.target_parameters adapts expert tensors", "use output.save=adapter"))
    return out
