"""Memory: bytes per GPU (or per CPU rank) at each phase of a step."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from runner.facts.catalog import LAYER_LINEAR
from runner.decide.rules import ULYSSES
from runner.decide.decisions import KEPT_BYTES_PER_TOKEN
from runner.facts.gpus import HOST_RANK_BYTES, HOST_RESERVE_BYTES, HOSTED, REGENERATED, SOURCE
from runner.engines import engine_for
from runner.plan.activations import (
    _norm_bytes, backward_transient_bytes, flash_backward_workspace_bytes, layer_activation_bytes, tile_bytes)
from runner.plan.constants import (
    ADAM_STATES_PER_PARAM,
    CPU_PROCESS_GIB,
    CUDA_CONTEXT_GIB,
    FRAGMENTATION_FRACTION,
    GIB,
    NCCL_GIB,
    TRL_FRAGMENTATION_FRACTION,
    CHUNKED_LOSS_BYTES_PER_ELEM,
    CHUNKED_LOSS_FORWARD_BYTES_PER_ELEM,
    COMPILED_ACTIVATION_FACTOR,
    DTYPE_BYTES,
    EAGER_SCORE_COPIES_TRANSIENT,
    FUSED_LOSS_BYTES_PER_ELEM,
    FUSED_LOSS_COMPILED_BYTES_PER_ELEM,
    LOGITS_BYTES_PER_ELEM,
    NATIVE_REDUCE_BYTES,
    NF4_BYTES_PER_PARAM,
    NF4_SCALE_BYTES_PER_PARAM,
    PARAMWRAPPER_MERGED_COPIES,
    SDPA_MASK_BYTES_PER_ELEM,
    SDPA_CPU_MASK_COPIES_PER_LAYER,
    SDPA_MASK_BYTES_PER_ELEM_CPU,
    TRL_FUSED_LOSS_BYTES_PER_TOKEN_EXTRA,
    TRL_REDUCE_BYTES,
    gib,
)
from runner.plan.lora import lora_params
from runner.plan.quant import dequant_bytes, gathered_layer_bytes, quantized_params
from runner.plan.choices import Plan
from runner.spec import RunSpec


@dataclass
class Phase:
    """Bytes of each part alive at one moment of a step (per GPU, or per CPU rank)."""

    params: float = 0.0
    optimizer: float = 0.0
    grads: float = 0.0
    fsdp_buffers: float = 0.0
    activations: float = 0.0
    logits_loss: float = 0.0
    lora: float = 0.0
    quantized: float = 0.0
    quant_scales: float = 0.0
    dequant: float = 0.0

    @property
    def total(self) -> float:
        return (self.params + self.optimizer + self.grads + self.fsdp_buffers + self.activations + self.logits_loss
                + self.lora + self.quantized + self.quant_scales + self.dequant)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # floats: asdict's deep copy is for nothing


@dataclass
class Memory:
    phases: dict[str, Phase]
    peak_phase: str
    allocated: float
    breakdown: dict[str, float]
    trainable: int
    reasons: list[str]
    expert_stack: int = 0
    reduce_pool: float = 0.0
    """Bytes the reduce-scatter stream's pool holds at its largest: the sharded gradients and the root's reduce
    output are allocated there, and the caching allocator does not hand that stream's free blocks to the default
    stream."""
    default_pool: float = 0.0
    """The default stream's largest live set over the phases (the allocated peak minus what the reduce-scatter
    stream holds at that moment, at the phase where that is largest)."""
    host_offload: float = 0.0
    """Bytes of pinned host memory the offloaded layer inputs take at the end of forward (train.offload_activations)."""
    host_short: float = 0.0
    """Bytes of layer inputs that stay on the GPU (counted in the phases) because the node's host memory cannot
    hold them beside the offloaded ones (runner.facts.gpus.offloaded_layers)."""
    state_holes: float = 0.0
    """Reserved, not allocated: the first step's working set that one unwrapped TRL process reserves again in its
    second step, after the AdamW states (created at the first optimizer step) took the blocks it had freed."""
    regenerated: int = 0
    """Recomputed layers whose input is regenerated in backward (runner.facts.gpus.regenerated_layers): each runs
    the layer before's forward once more, from that layer's input brought back from host memory once more."""
    layer_input: float = 0.0
    """Bytes of one layer's input (its hidden states for the block)."""


@dataclass(frozen=True)
class Step:
    """The sizes every part is built from."""

    plan: Plan
    b: int
    """Bytes per weight as loaded."""
    cb: int
    """Bytes per element in the compute dtype (FSDP's param_dtype): bf16 on GPU."""
    tb: int
    """Bytes per trainable parameter as FSDP (or one unwrapped TRL process) holds it: the master weights' dtype."""
    reduce_bytes: int
    tokens: int
    lora: bool
    """Adapters train on a frozen base (lora and qlora)."""
    trl: bool
    quant: bool = False
    """The frozen Linear weights are stored in NF4 (qlora)."""

    @property
    def spec(self) -> RunSpec:
        return self.plan.spec

    @property
    def cuda(self) -> bool:
        return self.plan.device == "cuda"


def step_sizes(plan: Plan) -> Step:
    spec = plan.spec
    trl = engine_for(spec.engine).hf_trainer  # accelerate's FSDP2 and the Trainer's casts
    b = DTYPE_BYTES[plan.dtype]
    cuda = plan.device == "cuda"
    prec = plan.precision  # compute dtype and the trainable weights' dtype, as the engine decides
    reduce_bytes = (TRL_REDUCE_BYTES if trl else NATIVE_REDUCE_BYTES) if cuda else b
    return Step(plan, b, DTYPE_BYTES[prec.compute], DTYPE_BYTES[prec.master], reduce_bytes, plan.tokens_per_rank,
                spec.method.adapters, trl, spec.method.kind == "qlora")


@dataclass(frozen=True)
class ModelStates:
    """Sharded parameters, gradients and AdamW states per rank, and the adapters' (bytes)."""

    params: float
    grads: float
    optimizer: float
    lora: float
    """Adapter weights and gradients (their AdamW states are `optimizer`)."""
    lora_no_grads: float
    grads_accumulated: float
    """Gradients kept from one micro-batch to the next (train.grad_accum > 1)."""
    lora_kept: float
    trainable: int
    expert_stack: int
    notes: tuple[str, ...]
    quantized: float = 0.0
    """qlora: the frozen Linear weights' NF4 codes."""
    quant_scales: float = 0.0
    """qlora: their double-quantized scales."""


def model_states(s: Step) -> ModelStates:
    arch, n, b, tb = s.plan.arch, s.plan.world, s.b, s.tb
    text, vision = arch.text_params, arch.vision_params
    lora_n, expert_stack, notes = lora_params(arch, s.spec.method.lora) if s.lora else (0, 0, [])
    quantized = quantized_params(arch) if s.quant else 0
    if s.lora:
        trainable = lora_n
        params_b, grads_b = (text + vision - quantized) * b / n, 0.0
        opt_b = trainable * tb * ADAM_STATES_PER_PARAM / n
        lora_b, lora_no_grads = trainable * tb * 2 / n, trainable * tb / n
    else:
        trainable = text
        # The vision tower gets no gradient in text-only training: no grads, no optimizer state (AdamW skips it).
        params_b = (text + vision) * tb / n
        grads_b = text * tb / n
        opt_b = text * tb * ADAM_STATES_PER_PARAM / n
        lora_b = lora_no_grads = 0.0
    accumulating = s.spec.train.grad_accum > 1
    if quantized:
        notes.append(f"qlora: {quantized / 1e9:.2f}B Linear weights in NF4 ({NF4_BYTES_PER_PARAM} B each and "
                     f"{NF4_SCALE_BYTES_PER_PARAM:.3f} B of scales), the other {(text + vision - quantized) / 1e9:.2f}B"
                     f" (embeddings, norms, lm_head{', expert stacks' if arch.num_experts else ''}) in "
                     f"{'bf16' if b == 2 else 'fp32'}; not yet measured on a GPU (benchmarks/qlora_gpu.py)")
    return ModelStates(params_b, grads_b, opt_b, lora_b, lora_no_grads, grads_b if accumulating else 0.0,
                       lora_b if accumulating else lora_no_grads, trainable, expert_stack, tuple(notes),
                       quantized * NF4_BYTES_PER_PARAM / n, quantized * NF4_SCALE_BYTES_PER_PARAM / n)


@dataclass(frozen=True)
class FsdpWorkingSet:
    """FSDP2's unsharded copies and the gradients on their way to be reduce-scattered (bytes)."""

    root_unsharded: float
    root_in_layers_bwd: float
    head_grad: float
    layer_grad: float
    layer_reduce_input: float
    root_reduce: float
    root_grad_shard: float
    layer_grad_shard: float
    gathered: float
    root_reduce_output: float


def fsdp_working_set(s: Step) -> FsdpWorkingSet:
    """Unsharded parameters are all-gathered (on one rank: copied) into buffers of their own in the compute dtype.
    A trained unit's gradient is reduce-scattered after its backward: the unsharded bf16 gradient is copied into a
    reduce-dtype input, then the reduce-scatter output (1/N of it) is cast to the parameter's dtype, which becomes
    the sharded gradient. The unit's parameters are resharded before that."""
    arch, n, cb, tb, rb = s.plan.arch, s.plan.world, s.cb, s.tb, s.reduce_bytes
    sharded = s.plan.sharded
    layer_u, root_u = arch.max_layer_params, arch.root_params
    cast = tb if tb != rb else 0
    # FSDP2 keeps the root unsharded from its forward to the end of backward; unwrapped, the weights are used
    # where they are.
    root_unsharded = root_u * cb if sharded else 0.0
    # ... unless reshard_after_forward is set explicitly, as accelerate does (TRL): then the root is gathered again
    # for the loss's backward, and with LoRA (no root gradient to wait for) let go before the layers' backward.
    # The allocator trace of the TRL GPT-OSS LoRA run shows no root copy at its training peak (estimator-notes.md).
    root_in_layers_bwd = 0.0 if s.trl and s.lora else root_unsharded
    # Gradients made in backward: FSDP2 makes them in the compute dtype; unwrapped, in the parameter's own.
    gb = cb if sharded else tb
    reduced = not s.lora and sharded
    return FsdpWorkingSet(
        root_unsharded=root_unsharded, root_in_layers_bwd=root_in_layers_bwd,
        head_grad=0 if s.lora else (arch.lm_head_params or arch.embed_params) * gb,  # lm_head grad, from the loss on
        layer_grad=0 if s.lora else layer_u * gb,
        # The layer just reduced keeps its reduce-scatter input until the next layer's reduce starts.
        layer_reduce_input=layer_u * rb if reduced else 0.0,
        root_reduce=root_u * max(cb + rb, rb + (rb + cast) / n) if reduced else 0.0,
        root_grad_shard=root_u * tb / n if reduced else 0.0,
        layer_grad_shard=layer_u * tb / n if reduced else 0.0,
        # FSDP2 gathers the layer being run (and prefetches the next) into buffers of their own.
        gathered=(gathered_layer_bytes(arch, cb) if s.quant else layer_u * cb) if sharded else 0.0,
        root_reduce_output=0.0 if s.lora else root_u * rb / n)


@dataclass(frozen=True)
class ActivationMemory:
    """What the decoder layers keep for backward and what their backward makes (bytes)."""

    kept: float
    """At the end of forward: the inputs of recomputed layers, every activation of the others."""
    recompute_last: float
    """Over `kept`, at the worst recompute (a checkpointed layer recomputes when the later layers freed theirs)."""
    recompute_first: float
    kept_first: float
    """What the first layer still holds at its backward."""
    transient: float
    layer_input: float
    mask: float
    score_transient: float
    host_offload: float
    host_short: float
    regenerated: int
    notes: tuple[str, ...]


def activation_memory(s: Step) -> ActivationMemory:
    plan, arch, t, cb, tokens = s.plan, s.plan.arch, s.spec.train, s.cb, s.tokens
    notes: list[str] = []
    compiled = COMPILED_ACTIVATION_FACTOR if t.compile and s.cuda else 1.0
    tiling = plan.tiled_mlp
    # A layer's bytes depend on its kind (type, MoE or not) only: priced once per kind (the planner prices many).
    layer_kinds = arch.layer_kinds
    kinds = {layer_kinds[i]: i for i in reversed(range(arch.layers))}
    by_kind = {k: layer_activation_bytes(arch, i, plan.attn, cb, t.seq_len, frozen=s.lora, gdn_torch=plan.gdn_torch,
                                         tiled=tiling.on) for k, i in kinds.items()}
    per_layer = [by_kind[kind] * tokens * compiled for kind in layer_kinds]
    groups = plan.head_groups
    if tiling.on:
        notes.append(f"tiled MLP: tiles of {tiling.tile_tokens:,} tokens, RMSNorms recomputed"
                     + (f"; attention's backward one of {groups} KV-head groups at a time" if groups > 1 else ""))
    if plan.gdn_torch and any(arch.layer_type(i) == LAYER_LINEAR for i in range(arch.layers)):
        notes.append("gated-delta layers through the PyTorch path (flash-linear-attention not installed): "
                     "fp32 intermediates counted")
    square = t.seq_len * t.seq_len * t.micro_batch
    cpu_sdpa = plan.attn == "sdpa" and not s.cuda
    if cpu_sdpa:  # each attention layer's additive copy of the mask, saved for its backward (constants.py)
        copy = SDPA_CPU_MASK_COPIES_PER_LAYER * cb * square
        per_layer = [x + (copy if arch.layer_type(i) != LAYER_LINEAR else 0.0) for i, x in enumerate(per_layer)]
    layer_input = cb * arch.hidden * tokens
    # The decisions' per-layer plan (runner.decide): the first k layers recompute, the others keep their
    # activations. A recomputed layer holds what its plan keeps (`LayerPlan.kept`: its input unless that waits in
    # host memory or is regenerated, the attention kernel's outputs where kept), priced by the table beside the
    # decisions: no lever is named here.
    layers = plan.layers
    k = plan.recomputed
    offload = plan.offloads
    hosted = sum(1 for layer in layers if layer.input in (HOSTED, SOURCE))
    regenerated = sum(1 for layer in layers if layer.input == REGENERATED)
    recomputed_kept = [sum((KEPT_BYTES_PER_TOKEN[name](arch, i, cb) * tokens for name in layers[i].kept), 0.0)
                       for i in range(k)]
    kept = sum(recomputed_kept) + sum(per_layer[k:])
    # A checkpointed layer is recomputed at the start of its own backward, when the layers after it have freed
    # what they kept: the largest of these moments, over and above `kept` (layer types differ in hybrids).
    # A tiled layer's recomputed input norm keeps the layer's input itself, which per_layer counts already.
    back = layer_input if not tiling.on else 0.0
    kept_at = 0.0
    worst = 0.0
    for i in range(arch.layers):
        kept_at += recomputed_kept[i] if i < k else per_layer[i]
        worst = max(worst, kept_at + (per_layer[i] + back - recomputed_kept[i] if i < k else 0.0))
    host_offload = hosted * layer_input
    short = k - hosted - regenerated
    host_short = short * layer_input if offload else 0.0
    if offload:
        regen = f"{regenerated} more regenerated in backward from the layer before's" if regenerated else ""
        gpu = f"the other {short} stay on the GPU, {gib(host_short):.1f} GiB" if short else ""
        notes.append(f"activation offload: {gib(host_offload):.1f} GiB of pinned host memory per rank"
                     + (f" ({hosted} of {k} recomputed layers' inputs, all the node's host holds: "
                        + "; ".join(x for x in (regen, gpu) if x) + ")" if hosted < k else ""))
    mask = 0.0
    score_transient = 0.0
    if plan.attn in ("sdpa", "eager") and t.packing:
        mask = SDPA_MASK_BYTES_PER_ELEM * square
    if cpu_sdpa:
        # On CPU a block always has a mask (the documents' when packed, the padding's when not): the bool one for
        # the step (each call's additive copy of it is counted in the layers above).
        mask = SDPA_MASK_BYTES_PER_ELEM_CPU * square
    if plan.attn == ULYSSES:  # SDPA's dense mask as above, over the whole row (all micro_batch blocks), packed or not
        mask = SDPA_MASK_BYTES_PER_ELEM * (t.seq_len * t.micro_batch) ** 2
    if plan.attn == "eager":
        score_transient = EAGER_SCORE_COPIES_TRANSIENT * cb * arch.heads * square
        mask = cb * square  # additive float mask, kept for the step
    return ActivationMemory(
        kept=kept, recompute_last=worst - kept, recompute_first=per_layer[0] if k else 0.0,
        kept_first=layer_input if k else per_layer[0],  # by the first layer's backward the others' are freed
        transient=backward_transient_bytes(arch, cb, tiling.on, flash_backward_workspace_bytes(arch)
                                           if s.cuda and plan.attn == "varlen" and plan.attn_kernel == "torch" else 0.0,
                                           groups) * tokens
        + (tile_bytes(arch, cb, tiling.tile_tokens) if tiling.on else 0.0), layer_input=layer_input, mask=mask,
        score_transient=score_transient, host_offload=host_offload, host_short=host_short, regenerated=regenerated,
        notes=tuple(notes))


@dataclass(frozen=True)
class LossMemory:
    final_norm: float
    """The final norm's saved tensors and the gathered hidden states the loss reads, kept to the loss's backward."""
    forward: float
    backward: float


def loss_memory(s: Step, head_grad: float) -> LossMemory:
    arch, t, cb, tokens = s.plan.arch, s.spec.train, s.cb, s.tokens
    norm_kept, norm_out = _norm_bytes(arch, cb, s.lora, recomputed=s.plan.tiled_mlp.on)  # tiled: recomputed too
    final_norm = (norm_kept + norm_out) * arch.hidden * tokens
    v = arch.vocab
    impl = s.plan.loss_impl
    if impl == "full":
        return LossMemory(final_norm, LOGITS_BYTES_PER_ELEM * tokens * v, LOGITS_BYTES_PER_ELEM * tokens * v)
    if impl == "chunked":
        chunk = min(tokens, s.plan.loss_chunk_tokens or tokens)
        # Backward of a chunk: recomputed log-softmax output, its gradient and the logits' gradient (fp32); and,
        # when lm_head trains, the chunk's weight gradient before it is added to the accumulated one.
        return LossMemory(final_norm, CHUNKED_LOSS_FORWARD_BYTES_PER_ELEM * chunk * v,
                          max(CHUNKED_LOSS_BYTES_PER_ELEM * chunk * v, 2 * chunk * v + head_grad))
    if impl == "fused":
        chunk = min(tokens, s.plan.loss_chunk_tokens or tokens)
        per_elem = FUSED_LOSS_COMPILED_BYTES_PER_ELEM if t.compile and s.cuda else FUSED_LOSS_BYTES_PER_ELEM
        # Made in forward and held to backward: the targets' hidden-state gradient and lm_head's weight gradient
        # (the latter is the head_grad that the backward phases count). In backward the hidden-state gradient
        # is scattered back into a zero tensor of the whole block.
        grad_hidden = cb * arch.hidden * tokens
        return LossMemory(final_norm, per_elem * chunk * v + grad_hidden + head_grad, 2 * grad_hidden)
    per_token = (cb * arch.hidden + TRL_FUSED_LOSS_BYTES_PER_TOKEN_EXTRA) * tokens
    return LossMemory(final_norm, per_token, per_token)


@dataclass(frozen=True)
class ExpertMerges:
    """LoRA on expert stacks (peft's ParamWrapper): the merged weight W + B·A of a layer is kept for that layer's
    backward, where its gradient joins it. Without checkpointing every MoE layer's merged weight stays from its
    forward to its backward."""

    at_backward: float
    kept: float
    last: float


def expert_merges(s: Step, expert_stack: int) -> ExpertMerges:
    arch, cb = s.plan.arch, s.cb
    if not s.lora:
        return ExpertMerges(0.0, 0.0, 0.0)
    at_backward = PARAMWRAPPER_MERGED_COPIES * expert_stack * cb
    if s.spec.train.activation_checkpointing:
        return ExpertMerges(at_backward, 0.0, at_backward)
    kept = sum(1 for i in range(arch.layers) if arch.is_moe_layer(i)) * expert_stack * cb
    return ExpertMerges(at_backward, kept, kept + expert_stack * cb)  # + the last one's gradient


def autocast_weight_copies(s: Step, trainable: int) -> float:
    """One unwrapped TRL process computes its fp32 trainable weights in bf16 under autocast, which keeps the bf16
    copy of every weight it casts until the forward (the loss included) returns: the decoder layers' and lm_head's
    matmul weights, not the input embedding's lookup. Counted with FSDP's gathered copies (the breakdown's
    fsdp_buffers): the same bf16 weight copies, made by autocast instead."""
    plan, arch = s.plan, s.plan.arch
    if not (plan.precision.autocast and not plan.sharded):
        return 0.0
    if s.lora:
        return trainable * s.cb
    return (arch.text_params - (arch.embed_params if arch.lm_head_params else 0)) * s.cb


@dataclass(frozen=True)
class Parts:
    states: ModelStates
    fsdp: FsdpWorkingSet
    act: ActivationMemory
    loss: LossMemory
    merges: ExpertMerges
    cast_cache: float
    sharded: bool
    dequant: float = 0.0


def loss_phase(p: Parts) -> Phase:
    """The end of the forward, the loss computed."""
    st = p.states
    return Phase(st.params, st.optimizer, grads=st.grads_accumulated,
                 fsdp_buffers=p.fsdp.root_unsharded + p.cast_cache, activations=p.act.kept + p.act.mask,
                 logits_loss=p.loss.final_norm + p.loss.forward, lora=st.lora_kept + p.merges.kept)


def _held(p: Parts, grads: float) -> tuple[float, float]:
    """Gradients that backward has made and FSDP2 has not yet reduced sit in its buffers (held); unwrapped they
    are the parameters' own .grad: (in grads, held)."""
    return (0.0, grads) if p.sharded else (grads, 0.0)


def backward_start_phase(p: Parts) -> Phase:
    """The loss's backward or the last layer's, whichever holds more."""
    st, f, a = p.states, p.fsdp, p.act
    grads_at_loss, held_at_loss = _held(p, f.head_grad)
    grads_at_last, held_at_last = _held(p, f.head_grad + f.layer_grad)
    loss_back = Phase(st.params, st.optimizer, grads=st.grads_accumulated + grads_at_loss,
                      fsdp_buffers=f.root_unsharded + held_at_loss + f.gathered, activations=a.kept + a.mask,
                      logits_loss=p.loss.final_norm + p.loss.backward, lora=st.lora_kept + p.merges.kept)
    last_layer = Phase(st.params, st.optimizer, grads=st.grads_accumulated + grads_at_last,
                       fsdp_buffers=f.root_in_layers_bwd + held_at_last + 2 * f.gathered,
                       activations=a.kept + a.recompute_last + a.transient + a.mask + a.score_transient,
                       logits_loss=0.0, lora=st.lora + p.merges.last, dequant=p.dequant)
    return max(loss_back, last_layer, key=lambda x: x.total)


def first_layer_phase(p: Parts) -> Phase:
    """The first layer's backward. Unwrapped, `grads` holds every gradient here (the input embedding's, still to
    come, is lm_head's when tied)."""
    st, f, a = p.states, p.fsdp, p.act
    _, held_at_last = _held(p, f.head_grad + f.layer_grad)
    return Phase(st.params, st.optimizer,
                 grads=max(st.grads_accumulated, st.grads - f.root_grad_shard - f.layer_grad_shard),
                 fsdp_buffers=f.root_in_layers_bwd + held_at_last + f.gathered + f.layer_reduce_input,
                 activations=a.kept_first + a.recompute_first + a.transient + a.mask + a.score_transient,
                 logits_loss=0.0, lora=st.lora + p.merges.at_backward, dequant=p.dequant)


def root_reduce_phase(p: Parts) -> Phase:
    """The root's gradient reduce-scatter, the last of backward."""
    st = p.states
    return Phase(st.params, st.optimizer, grads=max(st.grads_accumulated, st.grads - p.fsdp.root_grad_shard),
                 fsdp_buffers=p.fsdp.root_reduce, activations=p.act.mask, logits_loss=0.0, lora=st.lora)


def optimizer_phase(p: Parts) -> Phase:
    st = p.states
    return Phase(st.params, st.optimizer, grads=st.grads, fsdp_buffers=0.0, activations=0.0, logits_loss=0.0,
                 lora=st.lora)


def setup_phase(s: Step, states: ModelStates) -> Phase | None:
    """Random init draws the whole model on each GPU (runner.train.model.load_model), then FSDP2 keeps the rank's
    shard. fully_shard (native) swaps one layer's parameters at a time; accelerate's fsdp2_prepare_model (TRL)
    keeps the drawn state dict until the sharded model holds all of it. Unwrapped, the model is trained as drawn
    (TRL casts its trainable weights to fp32 one tensor at a time)."""
    plan, arch = s.plan, s.plan.arch
    if not (s.cuda and s.spec.model.init == "random"):
        return None
    whole = (arch.text_params + arch.vision_params) * s.b
    copy = (states.params if s.trl else arch.max_layer_params * s.b / plan.world) if plan.sharded else 0.0
    return Phase(params=whole + copy)


def state_holes(s: Step, p: Parts) -> float:
    """One unwrapped TRL process: its fp32 AdamW states are created at the first optimizer step, in the blocks the
    first step freed wherever a state tensor fits in one; the second step then reserves that working set again.
    The blocks that take states are the layer inputs the recomputed layers kept (when a state tensor fits in one)
    and the backward's transients. Checked on the H200 with TRL's liger kernels on conversations of realistic
    lengths at 8k and 32k (benchmarks/bench-h200/longchat-*; the figures in benchmarks/estimator-notes.md). Without
    liger the loss's and autocast's buffers were taken too (benchmarks/trl_reserved_steps.py), which TRL's best
    settings no longer leave."""
    if not (s.trl and not p.sharded and s.cuda and p.states.optimizer) or s.lora:  # adapters' states: small
        return 0.0
    a = p.act
    state_tensor = s.tb * s.plan.arch.hidden * s.plan.arch.intermediate
    freed = a.transient + (a.kept if a.layer_input >= state_tensor else 0.0)
    return min(p.states.optimizer, freed)


def memory_model(plan: Plan) -> Memory:
    """Bytes per GPU (or per CPU rank) at each phase of a step; the peak phase gives the breakdown.

    Phases (the largest is the peak): `loss` (end of the forward, the loss computed), `backward_start` (the loss's
    backward or the last layer's, whichever holds more), `backward_end` (the first layer's backward or the root's
    gradient reduce-scatter, whichever holds more), `optimizer`, and `setup` when the model is drawn on the GPU.
    """
    s = step_sizes(plan)
    states = model_states(s)
    fsdp = fsdp_working_set(s)
    act = activation_memory(s)
    reasons = list(states.notes)
    if plan.world == 1 and plan.sharded:
        reasons.append("one rank: FSDP still all-gathers into unsharded buffers (counted)")
    reasons += act.notes
    if plan.device == "cpu":
        reasons.append("CPU run: host RAM per rank, fp32 throughout; allocator behaviour differs from CUDA")
    parts = Parts(states, fsdp, act, loss_memory(s, fsdp.head_grad), expert_merges(s, states.expert_stack),
                  autocast_weight_copies(s, states.trainable), plan.sharded,
                  dequant_bytes(plan.arch, s.cb) if s.quant else 0.0)
    root = root_reduce_phase(parts)
    phases = {"loss": loss_phase(parts), "backward_start": backward_start_phase(parts),
              "backward_end": max(first_layer_phase(parts), root, key=lambda x: x.total),
              "optimizer": optimizer_phase(parts)}
    root_at_end = phases["backward_end"] is root  # before the copies: the NF4 weights and scales stay all step
    if states.quantized or states.quant_scales:
        phases = {k: replace(v, quantized=states.quantized, quant_scales=states.quant_scales) for k, v in phases.items()}
    setup = setup_phase(s, states)
    if setup is not None:
        phases["setup"] = setup
    if s.trl and not s.lora:
        reasons.append("TRL full fine-tune: fp32 master weights (16 B per parameter)")
    totals = {k: v.total for k, v in phases.items()}
    peak_phase = max(totals, key=lambda k: totals[k])

    # Held on the reduce-scatter stream at each phase: the sharded gradients, and the root's reduce output.
    on_reduce = {k: v.grads for k, v in phases.items()}
    on_reduce["backward_end"] += fsdp.root_reduce_output if root_at_end else 0.0
    on_reduce["optimizer"], on_reduce["setup"] = states.grads, 0.0
    reduce_pool = 0.0 if not s.cuda or s.lora or not plan.sharded else states.grads + fsdp.root_reduce_output
    default_pool = max(totals[k] - (on_reduce[k] if reduce_pool else 0.0) for k in phases)
    return Memory(phases, peak_phase, totals[peak_phase], phases[peak_phase].as_dict(), states.trainable, reasons,
                  states.expert_stack, reduce_pool, default_pool, act.host_offload, act.host_short,
                  state_holes(s, parts), act.regenerated, act.layer_input)


@dataclass(frozen=True)
class DeviceMemory:
    """What a rank needs beyond PyTorch's allocated peak, and what it has."""

    capacity: float
    context: float
    """CUDA context and NCCL buffers on a GPU; the process itself (interpreter, torch, gloo) on a CPU rank."""
    fragmentation: float
    idle_pools: float
    name: str


@dataclass(frozen=True)
class HostMemory:
    """Host memory that offloaded activations need on one node, and what the node has (bytes)."""

    needed: float
    capacity: float


def host_memory(plan: Plan, mem: Memory) -> HostMemory | None:
    """Every rank of a node page-locks its offloaded layer inputs (runner.train.offload) beside what the rank
    itself takes (HOST_RANK_BYTES), and the engine keeps HOST_RESERVE_BYTES free, within the node's memory
    (`Plan.host_bytes`). None without offload or where the node's memory is unknown."""
    if not mem.host_offload or plan.host_bytes is None:
        return None
    return HostMemory(plan.nproc * (mem.host_offload + HOST_RANK_BYTES) + HOST_RESERVE_BYTES, plan.host_bytes)


def device_memory(plan: Plan, mem: Memory) -> DeviceMemory:
    dev = _device_memory(plan, mem)
    cap = plan.spec.hardware.memory_gib
    return dev if cap is None else replace(dev, capacity=min(dev.capacity, cap * GIB))


def _device_memory(plan: Plan, mem: Memory) -> DeviceMemory:
    if plan.device == "cuda":
        assert plan.gpu is not None
        fraction = TRL_FRAGMENTATION_FRACTION if engine_for(plan.spec.engine).hf_trainer else FRAGMENTATION_FRACTION
        # What the allocator holds beyond that at its peak: each stream's pool at its own largest. The reduce-scatter
        # stream's idle blocks show in nvidia-smi but are free segments the allocator releases before it reports an
        # out-of-memory, so the verdict does not count them.
        idle_pools = max(0.0, mem.default_pool + mem.reduce_pool - mem.allocated)
        # The same for the blocks around the AdamW states: free space inside segments that the working set, at the
        # sizes it asks for, takes again (TRL's limit sat at its allocated peak, limit-4b-trl).
        idle_pools += mem.state_holes
        return DeviceMemory(plan.gpu.memory_gib * GIB, (CUDA_CONTEXT_GIB + (NCCL_GIB if plan.world > 1 else 0.0)) * GIB,
                            fraction * mem.allocated, idle_pools, plan.gpu.name)
    import psutil

    # No fragmentation term on CPU: tensors that size come from mmap and go back to the system when freed.
    return DeviceMemory(psutil.virtual_memory().total / plan.nproc, CPU_PROCESS_GIB * GIB, 0.0, 0.0, "cpu")
