"""Memory: bytes per GPU (or per CPU rank) at each phase of a step."""

from __future__ import annotations

from dataclasses import dataclass

from runner.catalog import LAYER_LINEAR
from runner.estimate.activations import _norm_bytes, backward_transient_bytes, layer_activation_bytes
from runner.estimate.constants import (
    ADAM_STATES_PER_PARAM,
    CHUNKED_LOSS_BYTES_PER_ELEM,
    CHUNKED_LOSS_FORWARD_BYTES_PER_ELEM,
    COMPILED_ACTIVATION_FACTOR,
    DTYPE_BYTES,
    EAGER_SCORE_COPIES_TRANSIENT,
    FUSED_LOSS_BYTES_PER_ELEM,
    FUSED_LOSS_COMPILED_BYTES_PER_ELEM,
    LOGITS_BYTES_PER_ELEM,
    NATIVE_REDUCE_BYTES,
    PARAMWRAPPER_MERGED_COPIES,
    SDPA_MASK_BYTES_PER_ELEM,
    TRL_FUSED_LOSS_BYTES_PER_TOKEN_EXTRA,
    TRL_REDUCE_BYTES,
    TRL_TRAINABLE_BYTES,
    gib,
)
from runner.estimate.lora import lora_params
from runner.estimate.plan import Plan, fused_chunk_tokens, loss_chunk_tokens, offloads_activations, recomputed_layers


@dataclass
class _Memory:
    phases: dict[str, dict[str, float]]
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
    state_holes: float = 0.0
    """Reserved, not allocated: the first step's working set that one unwrapped TRL process reserves again in its
    second step, after the AdamW states (created at the first optimizer step) took the blocks it had freed."""


def memory_model(plan: Plan) -> _Memory:
    """Bytes per GPU (or per CPU rank) at each phase of a step; the peak phase gives the breakdown.

    Phases (the largest is the peak): `loss` (end of the forward, the loss computed), `backward_start` (the loss's
    backward or the last layer's, whichever holds more), `backward_end` (the first layer's backward or the root's
    gradient reduce-scatter, whichever holds more) and `optimizer`.
    """
    spec, arch = plan.spec, plan.arch
    t = spec.train
    n = plan.world
    reasons: list[str] = []
    b = DTYPE_BYTES[plan.dtype]  # weights as loaded
    cb = 2 if plan.device == "cuda" else b  # compute dtype (FSDP param_dtype) — bf16 on GPU
    tokens = t.seq_len * t.micro_batch
    lora = spec.method.kind == "lora"
    trl = spec.engine == "trl"
    ac = t.activation_checkpointing

    text = arch.text_params
    vision = arch.vision_params
    lora_n, expert_stack, lora_notes = lora_params(arch, spec.method.lora) if lora else (0, 0, [])
    reasons += lora_notes

    # -- sharded model states -----------------------------------------------------------
    tb = TRL_TRAINABLE_BYTES if trl and plan.device == "cuda" else b  # trainable parameters as FSDP holds them
    if lora:
        trainable = lora_n
        params_b, grads_b, opt_b = (text + vision) * b / n, 0.0, 0.0
        lora_b = trainable * tb * (2 + ADAM_STATES_PER_PARAM) / n  # adapter weights, grads, AdamW states
        lora_no_grads = trainable * tb * (1 + ADAM_STATES_PER_PARAM) / n
    else:
        trainable = text
        # The vision tower gets no gradient in text-only training: no grads, no optimizer state (AdamW skips it).
        params_b = (text + vision) * tb / n
        grads_b = text * tb / n
        opt_b = text * tb * ADAM_STATES_PER_PARAM / n
        lora_b = lora_no_grads = 0.0
    g_accum = grads_b if t.grad_accum > 1 else 0.0
    lora_kept = lora_b if t.grad_accum > 1 else lora_no_grads

    # -- FSDP2 unsharded working set ----------------------------------------------------
    # Unsharded parameters are all-gathered (on one rank: copied) into buffers of their own in the compute dtype.
    # A trained unit's gradient is reduce-scattered after its backward: the unsharded bf16 gradient is copied into
    # a reduce-dtype input, then the reduce-scatter output (1/N of it) is cast to the parameter's dtype, which
    # becomes the sharded gradient. The unit's parameters are resharded before that.
    reduce_bytes = (TRL_REDUCE_BYTES if trl else NATIVE_REDUCE_BYTES) if plan.device == "cuda" else b
    sharded = plan.sharded

    def reduce_peak(params: int) -> float:
        cast = tb if tb != reduce_bytes else 0
        return params * max(cb + reduce_bytes, reduce_bytes + (reduce_bytes + cast) / n)

    layer_u = arch.max_layer_params
    root_u = arch.root_params
    # FSDP2 keeps the root unsharded from its forward to the end of backward; unwrapped, the weights are used
    # where they are.
    root_unsharded = root_u * cb if sharded else 0.0
    # ... unless reshard_after_forward is set explicitly, as accelerate does (TRL): then the root is gathered again
    # for the loss's backward, and with LoRA (no root gradient to wait for) let go before the layers' backward.
    # The allocator trace of the TRL GPT-OSS LoRA run shows no root copy at its training peak (estimator-notes.md).
    root_in_layers_bwd = 0.0 if trl and lora else root_unsharded
    # Gradients made in backward: FSDP2 makes them in the compute dtype; unwrapped, in the parameter's own.
    gb = cb if sharded else tb
    head_grad = 0 if lora else (arch.lm_head_params or arch.embed_params) * gb  # lm_head grad, from the loss on
    layer_grad = 0 if lora else layer_u * gb
    # The layer just reduced keeps its reduce-scatter input until the next layer's reduce starts.
    layer_reduce_input = 0.0 if lora or not sharded else layer_u * reduce_bytes
    root_reduce = 0.0 if lora or not sharded else reduce_peak(root_u)
    root_grad_shard = 0.0 if lora or not sharded else root_u * tb / n
    layer_grad_shard = 0.0 if lora or not sharded else layer_u * tb / n
    # FSDP2 gathers the layer being run (and prefetches the next) into buffers of their own.
    gathered = layer_u * cb if sharded else 0.0
    if n == 1 and sharded:
        reasons.append("one rank: FSDP still all-gathers into unsharded buffers (counted)")

    # -- activations --------------------------------------------------------------------
    compiled = COMPILED_ACTIVATION_FACTOR if t.compile and plan.device == "cuda" else 1.0
    per_layer = [layer_activation_bytes(arch, i, plan.attn, cb, t.seq_len, frozen=lora, gdn_torch=plan.gdn_torch)
                 * tokens * compiled for i in range(arch.layers)]
    if plan.gdn_torch and any(arch.layer_type(i) == LAYER_LINEAR for i in range(arch.layers)):
        reasons.append("gated-delta layers through the PyTorch path (flash-linear-attention not installed): "
                       "fp32 intermediates counted")
    transient = backward_transient_bytes(arch, cb) * tokens
    layer_input = cb * arch.hidden * tokens
    k = recomputed_layers(spec, arch.layers)  # the first k layers recompute, the others keep their activations
    # Offloaded, a recomputed layer's input waits in host memory and comes back for its own recompute only.
    offload = offloads_activations(spec, plan.device)
    on_gpu_input = 0.0 if offload else layer_input
    kept = k * on_gpu_input + sum(per_layer[k:])
    # A checkpointed layer is recomputed at the start of its own backward, when the layers after it have freed
    # what they kept: the largest of these moments, over and above `kept` (layer types differ in hybrids).
    kept_at = 0.0
    worst = 0.0
    for i in range(arch.layers):
        kept_at += on_gpu_input if i < k else per_layer[i]
        worst = max(worst, kept_at + (per_layer[i] + layer_input - on_gpu_input if i < k else 0.0))
    host_offload = k * layer_input if offload else 0.0
    if offload:
        reasons.append(f"activation offload: {gib(host_offload):.1f} GiB of pinned host memory per rank")
    recompute_last = worst - kept
    recompute_first = per_layer[0] if k else 0.0
    kept_first = layer_input if k else per_layer[0]  # by the first layer's backward the others' are freed
    mask = 0.0
    score_transient = 0.0
    if plan.attn in ("sdpa", "eager") and spec.train.packing:
        mask = SDPA_MASK_BYTES_PER_ELEM * t.seq_len * t.seq_len * t.micro_batch
    if plan.attn == "eager":
        score_transient = EAGER_SCORE_COPIES_TRANSIENT * cb * arch.heads * t.seq_len * t.seq_len * t.micro_batch
        mask = cb * t.seq_len * t.seq_len * t.micro_batch  # additive float mask, kept for the step

    # -- logits and loss ----------------------------------------------------------------
    # The final norm's saved tensors and the gathered hidden states the loss reads (the size of the norm's output)
    # stay until the loss's backward.
    norm_kept, norm_out = _norm_bytes(arch, cb, lora)
    final_norm = (norm_kept + norm_out) * arch.hidden * tokens
    v = arch.vocab
    if plan.loss_impl == "full":
        loss_fwd = LOGITS_BYTES_PER_ELEM * tokens * v
        loss_bwd = LOGITS_BYTES_PER_ELEM * tokens * v
    elif plan.loss_impl == "chunked":
        chunk = min(tokens, loss_chunk_tokens(v))
        loss_fwd = CHUNKED_LOSS_FORWARD_BYTES_PER_ELEM * chunk * v
        # Backward of a chunk: recomputed log-softmax output, its gradient and the logits' gradient (fp32); and,
        # when lm_head trains, the chunk's weight gradient before it is added to the accumulated one.
        loss_bwd = max(CHUNKED_LOSS_BYTES_PER_ELEM * chunk * v, 2 * chunk * v + head_grad)
    elif plan.loss_impl == "fused":
        chunk = min(tokens, fused_chunk_tokens(v))
        per_elem = FUSED_LOSS_COMPILED_BYTES_PER_ELEM if t.compile and plan.device == "cuda" else \
            FUSED_LOSS_BYTES_PER_ELEM
        # Made in forward and held to backward: the targets' hidden-state gradient and lm_head's weight gradient
        # (the latter is the head_grad that the backward phases count). In backward the hidden-state gradient
        # is scattered back into a zero tensor of the whole block.
        grad_hidden = cb * arch.hidden * tokens
        loss_fwd = per_elem * chunk * v + grad_hidden + head_grad
        loss_bwd = 2 * grad_hidden
    else:
        loss_fwd = loss_bwd = (cb * arch.hidden + TRL_FUSED_LOSS_BYTES_PER_TOKEN_EXTRA) * tokens
    if plan.device == "cpu":
        reasons.append("CPU run: host RAM per rank, fp32 throughout; allocator behaviour differs from CUDA")

    # -- LoRA on expert stacks (ParamWrapper) -------------------------------------------
    # The merged weight W + B·A of a layer is kept for that layer's backward, where its gradient joins it.
    # Without checkpointing every MoE layer's merged weight stays from its forward to its backward.
    moe_layers = sum(1 for i in range(arch.layers) if arch.is_moe_layer(i))
    merged_bwd = PARAMWRAPPER_MERGED_COPIES * expert_stack * cb if lora else 0.0
    merged_kept = 0.0 if ac or not lora else moe_layers * expert_stack * cb
    last_merged = merged_bwd if ac or not lora else merged_kept + expert_stack * cb  # + the last one's gradient

    # One unwrapped TRL process computes its fp32 trainable weights in bf16 under autocast, which keeps the bf16
    # copy of every weight it casts until the forward (the loss included) returns: the decoder layers' and
    # lm_head's matmul weights, not the input embedding's lookup. Counted with FSDP's gathered copies (the
    # breakdown's fsdp_buffers): the same bf16 weight copies, made by autocast instead.
    cast_cache = 0.0
    if trl and not sharded and plan.device == "cuda" and plan.dtype != "float32":  # the engine's autocast rule
        cast_cache = trainable * cb if lora else (text - (arch.embed_params if arch.lm_head_params else 0)) * cb
    base = {"params": params_b, "optimizer": opt_b}
    acts_common = mask
    loss_phase = {**base, "grads": g_accum, "fsdp_buffers": root_unsharded + cast_cache,
                  "activations": kept + acts_common, "logits_loss": final_norm + loss_fwd,
                  "lora": lora_kept + merged_kept}
    # Gradients that backward has made and FSDP2 has not yet reduced sit in its buffers; unwrapped they are the
    # parameters' own .grad.
    grads_at_loss, held_at_loss = (0.0, head_grad) if sharded else (head_grad, 0.0)
    grads_at_last, held_at_last = (0.0, head_grad + layer_grad) if sharded else (head_grad + layer_grad, 0.0)
    loss_back = {**base, "grads": g_accum + grads_at_loss, "fsdp_buffers": root_unsharded + held_at_loss + gathered,
                 "activations": kept + acts_common, "logits_loss": final_norm + loss_bwd,
                 "lora": lora_kept + merged_kept}
    last_layer = {**base, "grads": g_accum + grads_at_last,
                  "fsdp_buffers": root_in_layers_bwd + held_at_last + 2 * gathered,
                  "activations": kept + recompute_last + transient + acts_common + score_transient,
                  "logits_loss": 0.0, "lora": lora_b + last_merged}
    # Unwrapped, `grads` holds every gradient here (the input embedding's, still to come, is lm_head's when tied).
    first_layer = {**base, "grads": max(g_accum, grads_b - root_grad_shard - layer_grad_shard),
                   "fsdp_buffers": root_in_layers_bwd + held_at_last + gathered + layer_reduce_input,
                   "activations": kept_first + recompute_first + transient + acts_common + score_transient,
                   "logits_loss": 0.0, "lora": lora_b + merged_bwd}
    root_phase = {**base, "grads": max(g_accum, grads_b - root_grad_shard), "fsdp_buffers": root_reduce,
                  "activations": acts_common, "logits_loss": 0.0, "lora": lora_b}
    optimizer = {**base, "grads": grads_b, "fsdp_buffers": 0.0, "activations": 0.0, "logits_loss": 0.0,
                 "lora": lora_b}

    def total(phase: dict[str, float]) -> float:
        return sum(phase.values())

    phases = {
        "loss": loss_phase,
        "backward_start": max(loss_back, last_layer, key=total),
        "backward_end": max(first_layer, root_phase, key=total),
        "optimizer": optimizer,
    }
    if plan.device == "cuda" and spec.model.init == "random":
        # Random init draws the whole model on each GPU (runner.train.model.load_model), then FSDP2 keeps the
        # rank's shard. fully_shard (native) swaps one layer's parameters at a time; accelerate's
        # fsdp2_prepare_model (TRL) keeps the drawn state dict until the sharded model holds all of it. Unwrapped,
        # the model is trained as drawn (TRL casts its trainable weights to fp32 one tensor at a time).
        whole = (text + vision) * b
        copy = (params_b if trl else layer_u * b / n) if sharded else 0.0
        phases["setup"] = {"params": whole + copy}
    if trl and not lora:
        reasons.append("TRL full fine-tune: fp32 master weights (16 B per parameter)")
    totals = {k: total(v) for k, v in phases.items()}
    peak_phase = max(totals, key=lambda k: totals[k])
    allocated = totals[peak_phase]
    breakdown = dict(phases[peak_phase])

    # -- the reduce-scatter stream's pool -------------------------------------------------
    # Held on the reduce-scatter stream at each phase: the sharded gradients, and the root's reduce output.
    root_out = 0.0 if lora else root_u * reduce_bytes / n
    on_reduce = {"loss": phases["loss"]["grads"], "backward_start": phases["backward_start"]["grads"],
                 "backward_end": phases["backward_end"]["grads"] + (root_out if phases["backward_end"] is root_phase
                                                                    else 0.0),
                 "optimizer": grads_b, "setup": 0.0}
    reduce_pool = 0.0 if plan.device != "cuda" or lora or not sharded else grads_b + root_out
    default_pool = max(totals[k] - (on_reduce[k] if reduce_pool else 0.0) for k in phases)

    # -- blocks the AdamW states take over (one unwrapped TRL process) ----------------------
    # Its fp32 AdamW states are created at the first optimizer step, in the blocks the first step freed (layer
    # inputs, autocast's weight copies, the loss's and the recompute's buffers) wherever a state tensor fits in
    # one; the second step then reserves that working set again. Measured on the H200 (trl_reserved_steps.py):
    # 1.72B at 32k reserved 25.9 GiB after step 1 and 38.7 from step 2 on, 31.0 allocated; at 8k, where a layer
    # input (32 MiB) is smaller than an MLP weight's state (48 MiB), 28.1 with 27.0 allocated.
    state_holes = 0.0
    if trl and not sharded and plan.device == "cuda" and opt_b:
        state_tensor = tb * arch.hidden * arch.intermediate
        freed = transient + (kept + cast_cache + final_norm + loss_fwd if layer_input >= state_tensor else 0.0)
        state_holes = min(opt_b, freed)
    return _Memory({k: {**v} for k, v in phases.items()}, peak_phase, allocated, breakdown, trainable, reasons,
                   expert_stack, reduce_pool, default_pool, host_offload, state_holes)

