"""`decide(spec, arch, machine) -> Decisions`: every choice an engine makes about a run, made once before launch from
the rules in runner.decide.rules, written beside the spec (`runs/<id>/decisions.json`), obeyed by every rank, kept in
the record and pinned whole by replay. The estimator prices the same object."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from runner.decide.rules import (
    AttentionChoice,
    Kernels,
    Precision,
    choose_loss,
    fsdp_wrapped,
    loss_chunk_tokens,
    precision,
    sequence_parallel_attention,
)
from runner.engines import engine_for, lever_values
from runner.facts.catalog import LAYER_LINEAR
from runner.facts.families import family_of
from runner.facts.gpus import ON_GPU, layer_input_places, offloaded_layers, regenerated_layers
from runner.facts.tiling import attention_head_groups, tiled_mlp_choice

FORMAT = "sft-tui.decisions/1"
"""The decisions file's format: a reader refuses another."""
KEPT = "kept"
"""A layer that does not recompute: its activations stay from forward to backward (`LayerPlan.input`)."""


@dataclass(frozen=True)
class Machine:
    """What a run's decisions depend on besides the spec and the model: where it runs, resolved once."""

    device: str
    """cuda | cpu."""
    nproc: int
    """Ranks per node."""
    world: int
    """Ranks in all."""
    gpu_bytes: float = 0.0
    """One GPU's memory (0 on CPU)."""
    host_bytes: float | None = None
    """The node's host memory, which offloaded layer inputs must fit in; None where it is unknown."""
    kernels: Kernels | None = None
    """The attention kernels on the node (probed there at launch; assumed when planned elsewhere)."""


def _attention_out_bytes(arch: Any, i: int, cb: float) -> float:
    # The varlen kernel's output (compute dtype) and its log-sum-exp (fp32 per head); a gated-delta layer keeps none.
    return 0.0 if arch.layer_type(i) == LAYER_LINEAR else cb * arch.q_dim + 4 * arch.heads


# What a recomputed layer can hold on the GPU from its forward until its backward, in bytes per token of layer i
# (cb: the compute dtype's bytes). The estimator prices a plan's `LayerPlan.kept` with these and knows no lever by
# name: a lever that keeps something new says what it weighs here, beside its decision.
KEPT_BYTES_PER_TOKEN: dict[str, Callable[[Any, int, float], float]] = {
    "input": lambda arch, i, cb: cb * arch.hidden,
    "attention_out": _attention_out_bytes,
}


@dataclass(frozen=True)
class LayerPlan:
    """What one decoder layer does with its activations between forward and backward."""

    recompute: bool
    """Its forward runs again in backward (activation checkpointing)."""
    keep_attention: bool
    """Recomputed, but the attention kernel's outputs are kept from forward (selective recompute)."""
    input: str
    """Where its input waits: gpu | host (page-locked host memory) | source (host, and read again to regenerate the
    next layer's) | regenerated (computed again from the layer before's) | kept (a layer that does not recompute)."""

    @functools.cached_property
    def kept(self) -> tuple[str, ...]:
        """What a recomputed layer holds on the GPU from forward to backward (`KEPT_BYTES_PER_TOKEN` names); empty
        for a layer that does not recompute, which keeps every activation."""
        if not self.recompute:
            return ()
        return (("input",) if self.input == ON_GPU else ()) + (("attention_out",) if self.keep_attention else ())

    @property
    def reruns_attention(self) -> bool:
        """Its backward runs its attention again (a recomputed layer that did not keep the kernel's outputs)."""
        return self.recompute and not self.keep_attention


@dataclass(frozen=True)
class Decisions:
    """Every choice an engine makes about a run; ranks obey it and never choose."""

    engine: str
    device: str
    world: int
    attn: str
    attn_reason: str
    attn_kernel: str
    loss_impl: str
    loss_reason: str
    loss_chunk_tokens: int | None
    precision: dict[str, Any]
    """compute dtype, master (trainable weights') dtype, autocast (`runner.decide.rules.Precision`)."""
    fsdp: bool
    """The model is wrapped in FSDP2 (always with more than one rank)."""
    compile: bool
    """Each decoder layer is torch.compile'd."""
    levers: dict[str, Any]
    """The speed levers as resolved (`runner.engines.Levers`)."""
    tiled_mlp: bool
    mlp_tile_tokens: int | None
    """Tokens per MLP tile when tiled_mlp, else None."""
    tiled_mlp_reason: str
    head_groups: int
    """KV-head groups a tiled layer's varlen attention backward runs in (1 = the kernel's own backward)."""
    sequence_parallel: int
    layers: tuple[LayerPlan, ...] = field(default_factory=tuple)
    """One plan per text decoder layer, first to last."""
    liger: bool = False
    """liger-kernel's layer kernels on the model (an engine that applies them, a family they cover, CUDA, installed
    on the node where the run was decided). False in decisions written before it was one."""
    format: str = FORMAT

    @property
    def attention(self) -> AttentionChoice:
        return AttentionChoice(self.attn, self.attn_reason, self.attn_kernel)

    @property
    def precision_of(self) -> Precision:
        return Precision(**self.precision)

    @property
    def recomputed(self) -> int:
        return sum(1 for layer in self.layers if layer.recompute)

    @property
    def offloaded_layers(self) -> int | None:
        """Recomputed layers whose input waits in host memory (None where nothing offloads)."""
        places = [layer.input for layer in self.layers]
        return None if not self.offloads else sum(1 for p in places if p in ("host", "source"))

    @property
    def regenerated_layers(self) -> int | None:
        return None if not self.offloads else sum(1 for layer in self.layers if layer.input == "regenerated")

    @property
    def offloads(self) -> bool:
        return bool(self.levers.get("offload_activations")) and self.device == "cuda" and self.recomputed > 0

    def to_dict(self) -> dict[str, Any]:
        """As JSON holds it (the file, the train_begin event, the record): lists, not tuples."""
        return {**dataclasses.asdict(self), "layers": [dataclasses.asdict(layer) for layer in self.layers]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decisions:
        if data.get("format") != FORMAT:
            raise ValueError(f"decisions of format {data.get('format')!r}; this runner reads {FORMAT}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"decisions with unknown keys {sorted(unknown)}: written by another runner version")
        layers = tuple(LayerPlan(**layer) for layer in data.get("layers", ()))
        return cls(**{**data, "layers": layers})

    def write(self, path: Path) -> None:
        """Atomically (on a shared filesystem every node may write the same file)."""
        import os
        import tempfile

        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, indent=1, sort_keys=True)
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> Decisions:
        return cls.from_dict(json.loads(Path(path).read_text()))


def layer_plans(spec: Any, attn: str, machine: Machine, layers: int, hidden: int, tokens: int) -> tuple[LayerPlan, ...]:
    """Each text decoder layer's plan: the first train.recompute_layers recompute (all when null); on a GPU with
    train.offload_activations their inputs go to host memory as far as the node's holds (runner.facts.gpus), the
    others keep theirs on the GPU or (eager layers) regenerate them; with train.recompute_attention=false recomputed
    layers keep varlen attention's outputs (the native engine's selective policy)."""
    t, engine, cuda = spec.train, engine_for(spec.engine), machine.device == "cuda"
    kept = LayerPlan(False, False, KEPT)  # immutable: layers with the same plan share one (the planner makes many)
    if not t.activation_checkpointing:
        return (kept,) * layers
    k = layers if t.recompute_layers is None or not engine.honours("train.recompute_layers") \
        else min(int(t.recompute_layers), layers)
    offload = bool(t.offload_activations) and engine.offloads_activations and cuda
    hosted = offloaded_layers(k, 2 * hidden * tokens, machine.nproc, machine.host_bytes) if offload else 0
    regenerated = regenerated_layers(k, hosted, eager=not t.compile) if offload else 0
    places = layer_input_places(k, hosted, regenerated) if offload else [ON_GPU] * k
    keep = not t.recompute_attention and engine.selective_recompute and attn == "varlen" and cuda and not offload
    recomputed = {place: LayerPlan(True, keep, place) for place in set(places)}
    return tuple(recomputed[place] for place in places) + (kept,) * (layers - k)


def decide(spec: Any, arch: Any, machine: Machine, config: Any = None, supported: Any = None) -> Decisions:
    """Every engine choice for `spec` (levers resolved) on `machine`, for the model of `arch` (runner.facts.catalog
    Arch). `config`: the model's config (transformers object or config.json dict) for the rules that read it;
    `supported`: the attention paths the model class declares (runner.decide.support; None = the family's)."""
    from runner.decide.rules import choose_attention
    from runner.engines import tokens_per_forward
    from runner.precision import weights_dtype

    t, hw, device = spec.train, spec.hardware, machine.device
    e = engine_for(spec.engine)
    kernels = machine.kernels or Kernels.assumed(device)
    fam = family_of(config) if config is not None else None
    attn = choose_attention(spec.model.attn_implementation, device, tokens_per_forward(t), supported, config,
                            kernels, t.packing, spec.model.varlen_kernel, fam).with_kernel(spec.model.varlen_kernel,
                                                                                           kernels, config)
    attn = sequence_parallel_attention(attn, hw.sequence_parallel if e.honours("hardware.sequence_parallel") else 1)
    loss, loss_reason = choose_loss(spec.engine, t.loss_impl, config if config is not None else {})
    dtype = weights_dtype(spec, device)
    wrapped = fsdp_wrapped(spec.engine, machine.world, device, bool(t.fsdp_one_rank),
                           weights_bf16=dtype == "bfloat16" or not e.fsdp_one_gpu_rank_unless_bf16)
    tokens = t.seq_len * int(t.micro_batch) // hw.sequence_parallel
    tiling = tiled_mlp_choice(t.tiled_mlp, spec.engine, device, arch, tokens, machine.gpu_bytes, bool(t.compile))
    groups = attention_head_groups(arch, tiling.on, attn.impl, device, tokens, machine.gpu_bytes)
    return Decisions(
        engine=spec.engine, device=device, world=machine.world, attn=attn.impl, attn_reason=attn.reason,
        attn_kernel=attn.kernel, loss_impl=loss, loss_reason=loss_reason,
        loss_chunk_tokens=loss_chunk_tokens(loss, arch.vocab),
        precision=dataclasses.asdict(precision(spec.engine, device, dtype, wrapped)), fsdp=wrapped,
        compile=bool(t.compile) and device == "cuda" and e.compiles_layers,
        levers=lever_values(spec, arch.layers, loss), tiled_mlp=tiling.on,
        mlp_tile_tokens=tiling.tile_tokens if tiling.on else None, tiled_mlp_reason=tiling.reason,
        head_groups=groups, sequence_parallel=hw.sequence_parallel,
        layers=layer_plans(spec, attn.impl, machine, arch.layers, arch.hidden, tokens),
        liger=e.applies_liger and device == "cuda" and kernels.liger and fam is not None and fam.liger)
