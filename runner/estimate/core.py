"""The prediction: memory, verdict and time for one spec."""

from __future__ import annotations

import math
import os

from runner.estimate.constants import (
    BREAKDOWN_KEYS,
    CPU_EFFICIENCY,
    CPU_GFLOPS_PER_CORE,
    CPU_STEP_OVERHEAD_S,
    CUDA_CONTEXT_GIB,
    DEFAULT_DOC_LEN,
    DTYPE_BYTES,
    EAGER_ATTENTION_EFFICIENCY,
    FRAGMENTATION_FRACTION,
    GIB,
    GPU_STEP_OVERHEAD_S,
    HBM_EFFICIENCY,
    HOST_LINK_GB_S,
    LOAD_GB_PER_S,
    NCCL_GIB,
    PARAMWRAPPER_TRAFFIC,
    SETUP_BASE_S,
    TIGHT_FRACTION,
    TRL_FRAGMENTATION_FRACTION,
    TRL_STEP_OVERHEAD_S,
    TRL_UNWRAPPED_RATE_FACTOR,
    UNWRAPPED_RATE_FACTOR,
    UNWRAPPED_STEP_OVERHEAD_S,
    gib,
)
from runner.estimate.data_size import dataset_size
from runner.estimate.memory import memory_model
from runner.estimate.plan import make_plan
from runner.estimate.result import Estimate
from runner.estimate.timing import calibration, flops_per_step
from runner.spec import RunSpec


def predict(spec: RunSpec, doc_len: int | None = None) -> Estimate:
    """Per-GPU memory and time for a spec (its `auto` fields are resolved for planning, not for running), without
    the search for a fix (runner.estimate.whatif.estimate adds it)."""
    plan = make_plan(spec)
    arch, t = plan.arch, spec.train
    mem = memory_model(plan)
    reasons = list(arch.approximate_reasons) + list(plan.reasons) + mem.reasons
    if arch.num_experts:
        reasons.append("MoE step time assumes dense-matmul efficiency for the experts (not calibrated)")

    if plan.device == "cuda":
        assert plan.gpu is not None
        capacity = plan.gpu.memory_gib * GIB
        context = (CUDA_CONTEXT_GIB + (NCCL_GIB if plan.world > 1 else 0.0)) * GIB
        fragmentation = (TRL_FRAGMENTATION_FRACTION if spec.engine == "trl" else FRAGMENTATION_FRACTION) * mem.allocated
        # What the allocator holds beyond that at its peak: each stream's pool at its own largest. The reduce-scatter
        # stream's idle blocks show in nvidia-smi but are free segments the allocator releases before it reports an
        # out-of-memory, so the verdict does not count them.
        idle_pools = max(0.0, mem.default_pool + mem.reduce_pool - mem.allocated)
        # The same for the blocks around the AdamW states: free space inside segments that the working set, at the
        # sizes it asks for, takes again (TRL's limit sat at its allocated peak, limit-4b-trl).
        idle_pools += mem.state_holes
        gpu_name = plan.gpu.name
    else:
        import psutil

        capacity = psutil.virtual_memory().total / plan.nproc
        context = 0.3 * GIB  # interpreter, torch and gloo per rank
        fragmentation = FRAGMENTATION_FRACTION * mem.allocated
        idle_pools = 0.0
        gpu_name = "cpu"
    per_gpu = mem.allocated + fragmentation + context
    breakdown = {k: gib(mem.breakdown.get(k, 0.0)) for k in BREAKDOWN_KEYS}
    breakdown["cuda_context_nccl"] = gib(context)
    breakdown["fragmentation"] = gib(fragmentation)
    headroom = capacity - per_gpu
    if headroom < 0:
        verdict = "does not fit"
    elif headroom < TIGHT_FRACTION * capacity:
        verdict = "tight"
    else:
        verdict = "fits"

    # -- time ---------------------------------------------------------------------------
    data = dataset_size(spec, plan.loaded)
    if doc_len is None:
        doc_len = int(round(data.avg_tokens)) if data.avg_tokens else DEFAULT_DOC_LEN
    packed = spec.engine == "native" or t.packing
    per_rank_seqs = t.micro_batch * t.grad_accum
    if packed:
        tokens_per_step = t.seq_len * per_rank_seqs * plan.world
    else:
        tokens_per_step = min(doc_len, t.seq_len) * per_rank_seqs * plan.world
    flops, attn_flops = flops_per_step(plan, doc_len, tokens_per_step)
    hfu, hfu_source = calibration(plan)
    unwrapped = plan.device == "cuda" and spec.engine == "native" and not plan.sharded
    if unwrapped:
        hfu *= UNWRAPPED_RATE_FACTOR
        hfu_source += f"; × {UNWRAPPED_RATE_FACTOR} for one unwrapped rank"
    elif plan.device == "cuda" and spec.engine == "trl" and not plan.sharded:
        hfu *= TRL_UNWRAPPED_RATE_FACTOR
        hfu_source += f"; × {TRL_UNWRAPPED_RATE_FACTOR} for one unwrapped process (autocast casts)"
    if plan.device == "cuda":
        assert plan.gpu is not None
        rate = plan.world * plan.gpu.ceiling_tflops * 1e12 * hfu
        if plan.attn == "eager":
            step_s = (flops - attn_flops) / rate + attn_flops / (rate * EAGER_ATTENTION_EFFICIENCY)
        else:
            step_s = flops / rate
        if spec.method.kind == "lora" and mem.expert_stack:
            uses = (3 if t.activation_checkpointing else 2) * t.grad_accum
            moved = PARAMWRAPPER_TRAFFIC * uses * mem.expert_stack * 2 * sum(
                1 for i in range(arch.layers) if arch.is_moe_layer(i))
            step_s += moved / (plan.gpu.hbm_tb_s * 1e12 * HBM_EFFICIENCY)
        if mem.host_offload:
            # Each offloaded input comes back over the host link on the compute stream, just before its recompute
            # (the forward copies run on a side stream, overlapped).
            step_s += t.grad_accum * mem.host_offload / (HOST_LINK_GB_S * 1e9)
        step_s += TRL_STEP_OVERHEAD_S if spec.engine == "trl" else \
            UNWRAPPED_STEP_OVERHEAD_S if unwrapped else GPU_STEP_OVERHEAD_S
    else:
        cores = max(1, (os.cpu_count() or 2))
        step_s = flops / (cores * CPU_GFLOPS_PER_CORE * 1e9 * CPU_EFFICIENCY) + CPU_STEP_OVERHEAD_S
        hfu, hfu_source = CPU_EFFICIENCY, "CPU: an assumed share of 20 GFLOP/s per core"
    if t.max_steps is not None:
        steps: int | None = t.max_steps
    elif packed and data.tokens:
        steps = max(1, math.ceil(data.tokens * t.epochs / tokens_per_step))
    elif not packed and data.rows:
        steps = max(1, math.ceil(data.rows * t.epochs / (per_rank_seqs * plan.world)))
    else:
        steps = None
        reasons.append("dataset size unknown offline: set train.max_steps for a total time")
    if data.source and t.max_steps is None:
        reasons.append(f"dataset size: {data.source}")
    setup_s = SETUP_BASE_S[plan.device] + arch.params_total * DTYPE_BYTES[plan.dtype] / (LOAD_GB_PER_S * 1e9)
    total_s = None if steps is None else setup_s + steps * step_s

    notes = ("dataset size:", "one rank", "activation offload:")  # said, but nothing approximate about them
    approx_reasons = [r for r in reasons if not r.startswith(notes)]
    if plan.loaded.note:
        reasons.append(plan.loaded.note)
    approximate = bool(approx_reasons) or plan.device == "cpu"
    est = Estimate(
        fits=verdict != "does not fit", verdict=verdict, headroom_gib=gib(headroom), per_gpu_gib=gib(per_gpu),
        per_gpu_allocated_gib=gib(mem.allocated), per_gpu_reserved_gib=gib(per_gpu + idle_pools),
        gpu_memory_gib=round(capacity / GIB, 2), gpu=gpu_name,
        world_size=plan.world, breakdown=breakdown, step_s=round(step_s, 3), steps=steps,
        total_s=None if total_s is None else round(total_s, 1), tokens_per_step=tokens_per_step,
        flops_per_step=float(f"{flops:.4g}"), hfu_assumed=hfu, approximate=approximate,
        approximate_reason="; ".join(reasons), suggestion=None,
        arch={"model_type": arch.model_type, "params_total": arch.params_total, "params_active": arch.params_active,
              "layers": arch.layers, "vocab": arch.vocab},
        peak_phase=mem.peak_phase, device=plan.device, engine=spec.engine, method=spec.method.kind,
        seq_len=t.seq_len, attn_implementation=plan.attn, loss_impl=plan.loss_impl,
        activation_checkpointing=t.activation_checkpointing, params_trainable=mem.trainable,
        arch_source=plan.loaded.source, doc_len=doc_len, dataset_tokens=data.tokens, hfu_source=hfu_source,
        phases_gib={k: gib(v.total) for k, v in mem.phases.items()},
        host_offload_gib=gib(mem.host_offload),
    )
    return est

