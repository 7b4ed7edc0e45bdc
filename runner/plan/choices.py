"""The planning context: a spec with its `auto` fields filled for planning (no GPU needed), and the engines'
decisions the estimator plans with."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

from runner.facts.catalog import Arch, LoadedArch, load_arch
from runner.decide.rules import (
    AttentionChoice,
    Precision,
    choose_loss,
    fsdp_wrapped,
    loss_chunk_tokens,
    plan_attention,
    precision,
)
from runner.decide.rules import fused_chunk_tokens_for as fused_chunk_tokens  # noqa: F401 (re-exported)
from runner.decide.decisions import Decisions, LayerPlan, layer_plans
from runner.decide.decisions import Machine as DecideMachine
from runner.errors import Problem, UserError
from runner.engines import engine_for
from runner.facts.gpus import GpuType
from runner.facts.tiling import TiledMlp, attention_head_groups, mlp_tile_tokens, tiled_mlp_choice
from runner.spec import RunSpec, weights_dtype


@dataclass(frozen=True)
class Plan:
    spec: RunSpec
    device: str
    gpu: GpuType | None
    nproc: int
    world: int
    dtype: str
    attn: str
    loss_impl: str
    loaded: LoadedArch
    reasons: tuple[str, ...]
    gdn_torch: bool = False
    """Gated-delta layers run transformers' PyTorch path (flash-linear-attention is not installed here)."""
    attn_reason: str = ""
    loss_reason: str = ""
    attn_kernel: str = ""
    """The kernel behind varlen attention (runner.decide.rules.varlen_kernel); empty for other paths."""
    host_bytes: float | None = None
    """The node's host memory, which offloaded layer inputs must fit in (runner.facts.gpus.host_capacity); None on
    CPU and where it is unknown (planned off the node without hardware.host_memory_gib)."""
    decisions: Decisions | None = None
    """The run's decisions (runner.decide), once the spec's levers are resolved; what a launch of it writes."""

    @property
    def arch(self) -> Arch:
        return self.loaded.arch

    @property
    def data_ranks(self) -> int:
        """Ranks that read blocks of their own: hardware.sequence_parallel ranks share each block."""
        return self.world // self.spec.hardware.sequence_parallel

    @property
    def tokens_per_rank(self) -> int:
        """Tokens of one forward on one rank: a micro-batch of blocks, or its slice under sequence parallelism."""
        t = self.spec.train
        return t.seq_len * t.micro_batch // self.spec.hardware.sequence_parallel

    @property
    def sharded(self) -> bool:
        """Whether the model is wrapped in FSDP2, as both engines decide (runner.decide.rules.fsdp_wrapped)."""
        if self.decisions is not None:
            return self.decisions.fsdp
        return fsdp_wrapped(self.spec.engine, self.world, self.device, self.spec.train.fsdp_one_rank,
                            weights_bf16=self.dtype == "bfloat16")

    @property
    def loss_chunk_tokens(self) -> int | None:
        """Tokens per chunk of the native engine's chunked or fused loss (None for the others)."""
        return loss_chunk_tokens(self.loss_impl, self.arch.vocab)

    @property
    def gpu_bytes(self) -> float:
        return self.gpu.memory_gib * 2**30 if self.gpu else 0.0

    @property
    def tiled_mlp(self) -> TiledMlp:
        """Whether the MLP runs in tiles and how long they are, as the native engine decides (runner.facts.tiling)."""
        t = self.spec.train
        if self.decisions is not None:
            d = self.decisions
            return TiledMlp(d.tiled_mlp, d.mlp_tile_tokens or mlp_tile_tokens(self.arch, self.tokens_per_rank),
                            d.tiled_mlp_reason)
        return tiled_mlp_choice(t.tiled_mlp, self.spec.engine, self.device, self.arch, self.tokens_per_rank,
                                self.gpu_bytes, t.compile)

    @property
    def head_groups(self) -> int:
        """KV-head groups a tiled layer's attention backward runs in, as the native engine decides
        (runner.facts.tiling.attention_head_groups)."""
        if self.decisions is not None:
            return self.decisions.head_groups
        return attention_head_groups(self.arch, self.tiled_mlp.on, self.attn, self.device, self.tokens_per_rank,
                                     self.gpu_bytes)

    def priced_with(self, spec: RunSpec) -> Plan:
        """This plan for a candidate `spec` of the same model on the same hardware (its levers resolved): the
        decisions made again for it, as a launch of it would be decided."""
        from runner.decide import Hardware, decide_run

        hardware = Hardware(self.device, self.gpu, self.nproc, self.world, self.host_bytes, self.reasons)
        decisions = decide_run(spec, self.loaded, hardware)
        return dataclasses.replace(self, spec=spec, decisions=decisions, attn=decisions.attn,
                                   attn_reason=decisions.attn_reason, attn_kernel=decisions.attn_kernel,
                                   loss_impl=decisions.loss_impl, loss_reason=decisions.loss_reason)

    @property
    def layers(self) -> tuple[LayerPlan, ...]:
        """Each decoder layer's plan (recompute, kept attention, where its input waits): the decisions', or for a
        spec whose levers are still auto the plan runner.decide would make of them."""
        if self.decisions is not None:
            return self.decisions.layers
        machine = DecideMachine(self.device, self.nproc, self.world, self.gpu_bytes, self.host_bytes)
        return layer_plans(self.spec, self.attn, machine, self.arch.layers, self.arch.hidden, self.tokens_per_rank)

    @property
    def recomputed(self) -> int:
        """Decoder layers that recompute their forward in backward (the first ones)."""
        return sum(1 for layer in self.layers if layer.recompute)

    @property
    def offloads(self) -> bool:
        """Recomputed layers' inputs go to host memory as far as it holds them (the native engine on a GPU with
        train.offload_activations; `Decisions.offloads`)."""
        t = self.spec.train
        return t.offload_activations is True and engine_for(self.spec.engine).offloads_activations \
            and self.device == "cuda" and self.recomputed > 0

    @property
    def precision(self) -> Precision:
        """Compute dtype, the trainable weights' dtype and autocast, as the engine decides (runner.decide.rules)."""
        if self.decisions is not None:
            return self.decisions.precision_of
        return precision(self.spec.engine, self.device, self.dtype, self.sharded)


def planned_attention(spec: RunSpec, device: str, config: Any = None) -> AttentionChoice:
    """The attention path the engine will pick, from config.json alone (runner.decide.rules.plan_attention): the kernels
    a plan assumes on CUDA are torch's varlen and flex, no flash-attn (which costs the same memory as varlen here)."""
    return plan_attention(spec, config or None, device)


def planned_loss(spec: RunSpec, config: Any = None) -> tuple[str, str]:
    """(full | chunked | fused | trl-fused, reason), as the engine decides (runner.decide.rules.choose_loss)."""
    try:
        return choose_loss(spec.engine, spec.train.loss_impl, config or {})
    except ValueError as e:
        raise UserError("invalid spec", [Problem("train.loss_impl", str(e), "use train.loss_impl=full")]) from None


def make_plan(spec: RunSpec) -> Plan:
    """The plan of `spec`: its hardware resolved once (runner.decide.resolve_hardware) and, once its levers are
    resolved, the run's decisions (runner.decide.decide_run), which the estimator prices."""
    from runner.decide import decide_run, resolve_hardware
    from runner.engines import unresolved

    hardware = resolve_hardware(spec)
    device = hardware.device
    dtype = weights_dtype(spec, device)
    loaded = _load_arch_cached(spec.model.id, spec.model.revision, spec.model.path)
    left = [f for f in unresolved(spec.train) if not (f == "loss_impl" and engine_for(spec.engine).fixed_loss)]
    decisions = None
    if not left:
        planned_loss(spec, loaded.config)  # a loss the model cannot take is the spec's error, said as such
        decisions = decide_run(spec, loaded, hardware)
        attn = decisions.attention
        loss, loss_reason = decisions.loss_impl, decisions.loss_reason
    else:
        attn = planned_attention(spec, device, loaded.config)
        loss, loss_reason = planned_loss(spec, loaded.config)
    return Plan(spec, device, hardware.gpu, hardware.nproc, hardware.world, dtype, attn.impl, loss, loaded,
                hardware.reasons, gdn_torch=not gdn_kernels_installed(), attn_reason=attn.reason,
                loss_reason=loss_reason, attn_kernel=attn.kernel, host_bytes=hardware.host_bytes,
                decisions=decisions)


@functools.lru_cache(maxsize=64)
def _load_arch_cached(model_id: str, revision: str | None, path: str | None) -> LoadedArch:
    from types import SimpleNamespace

    return load_arch(SimpleNamespace(model=SimpleNamespace(id=model_id, revision=revision, path=path)))


def gdn_kernels_installed() -> bool:
    """flash-linear-attention importable (the gated-delta kernels); checked without importing it."""
    return importlib.util.find_spec("fla") is not None
