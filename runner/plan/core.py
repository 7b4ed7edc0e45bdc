"""The prediction: memory, verdict and time for one spec."""

from __future__ import annotations

from runner.plan.constants import (
    BREAKDOWN_KEYS,
    QUANT_KEYS,
    DEFAULT_DOC_LEN,
    GIB,
    TIGHT_FRACTION,
    gib,
)
from runner.facts.gpus import HOST_RANK_BYTES, HOST_RESERVE_BYTES
from runner.plan.coverage import outside_measured
from runner.plan.data_size import dataset_size
from runner.plan.memory import (  # noqa: F401 (DeviceMemory re-exported)
    DeviceMemory, HostMemory, Memory, device_memory, host_memory, memory_model)
from runner.plan.autotune import document_lengths, tune
from runner.plan.choices import Plan, make_plan
from runner.plan.result import PER_GPU_BASIS, Estimate
from runner.plan.timing import flops_per_step, planned_steps, setup_seconds, step_time, tokens_per_step
from runner.spec import RunSpec


def host_limit_reason(plan: Plan, mem: Memory, host: HostMemory | None, alone: bool) -> str:
    """Why the GPU holds layer inputs that activation offload would have sent to the host; `alone`: the GPU would
    have room for the rest were they on the host."""
    held = (f"activation offload page-locks {gib(host.needed):.1f} GiB ({plan.nproc} rank(s) × "
            f"{gib(mem.host_offload):.1f} GiB, beside {gib(HOST_RANK_BYTES):.1f} GiB a rank takes and "
            f"{gib(HOST_RESERVE_BYTES):.0f} GiB kept free) of {gib(host.capacity):.1f} GiB"
            if host is not None else
            f"{gib(plan.host_bytes or 0.0):.1f} GiB cannot hold one layer's input beside what a rank takes")
    return (f"host memory is {'the limit' if alone else 'short too'}: {held}, so {gib(mem.host_short):.1f} GiB of "
            "layer inputs stay on the GPU"
            + ("" if plan.spec.hardware.host_memory_gib else " (the OS's figure: hardware.host_memory_gib states "
                                                             "the node's where the OS reports too little)"))


def verdict_for(headroom: float, capacity: float) -> str:
    if headroom < 0:
        return "does not fit"
    return "tight" if headroom < TIGHT_FRACTION * capacity else "fits"


def predict(spec: RunSpec, doc_len: int | None = None) -> Estimate:
    """Per-GPU memory and time for a spec (its `auto` fields are resolved for planning, not for running, and its
    `auto` levers as runner.plan.autotune resolves them for the run), without the search for a fix
    (runner.plan.whatif.estimate adds it)."""
    tuned = tune(spec, *(document_lengths(spec) if doc_len is None else (doc_len, doc_len)))
    spec = tuned.spec
    plan = make_plan(spec)
    arch, t = plan.arch, spec.train
    mem = memory_model(plan)
    reasons = list(arch.approximate_reasons) + list(plan.reasons) + mem.reasons
    if arch.num_experts:
        reasons.append("MoE step time assumes dense-matmul efficiency for the experts (not calibrated)")
    dev = device_memory(plan, mem)
    per_gpu = mem.allocated + dev.fragmentation + dev.context
    breakdown = {k: gib(mem.breakdown.get(k, 0.0)) for k in BREAKDOWN_KEYS
                 if k not in QUANT_KEYS or spec.method.kind == "qlora"}
    breakdown["cuda_context_nccl"] = gib(dev.context)
    breakdown["fragmentation"] = gib(dev.fragmentation)
    if plan.device != "cuda":  # no CUDA context, no NCCL: the rank process itself
        breakdown = {("process" if k == "cuda_context_nccl" else k): v for k, v in breakdown.items()}
    headroom = dev.capacity - per_gpu
    host = host_memory(plan, mem)
    if mem.host_short and headroom < 0:
        reasons.append(host_limit_reason(plan, mem, host, alone=headroom + mem.host_short >= 0))

    data = dataset_size(spec, plan.loaded)
    packs = t.packing
    attn_len = doc_len
    if doc_len is None:
        doc_len = int(round(data.avg_tokens)) if data.avg_tokens else DEFAULT_DOC_LEN
        attn_len = (data.attention_len(t.seq_len) if packs and data.lengths else None) or doc_len
    tokens = tokens_per_step(spec, plan.data_ranks, doc_len)
    flops, attn_flops = flops_per_step(plan, attn_len, tokens)
    step_s, hfu, hfu_source = step_time(plan, mem, flops, attn_flops)
    packing = None
    if packs and data.lengths:
        from runner.data.packing import packing_preview

        packing = {**packing_preview(list(data.lengths), t.seq_len, t.packing_strategy),
                   "sampled_rows": len(data.lengths)}
    steps = planned_steps(spec, data, tokens, plan.data_ranks, packing and packing.get("packing_efficiency"))
    if steps is None:
        reasons.append("dataset size unknown offline: set train.max_steps for a total time")
    if data.source and t.max_steps is None:
        reasons.append(f"dataset size: {data.source}")
    total_s = None if steps is None else setup_seconds(plan) + steps * step_s

    scope = outside_measured(plan)
    if scope:
        reasons.append(scope)
    notes = ("dataset size:", "one rank", "activation offload:", "tiled MLP:", "host memory is")  # said, but nothing approximate about them
    approx_reasons = [r for r in reasons if not r.startswith(notes)]
    if plan.loaded.note:
        reasons.append(plan.loaded.note)
    return Estimate(
        fits=headroom >= 0, verdict=verdict_for(headroom, dev.capacity), headroom_gib=gib(headroom),
        per_gpu_gib=gib(per_gpu), per_gpu_allocated_gib=gib(mem.allocated),
        per_gpu_reserved_gib=gib(per_gpu + dev.idle_pools), gpu_memory_gib=round(dev.capacity / GIB, 2),
        gpu=dev.name, world_size=plan.world, breakdown=breakdown, step_s=round(step_s, 3), steps=steps,
        total_s=None if total_s is None else round(total_s, 1), tokens_per_step=tokens,
        flops_per_step=float(f"{flops:.4g}"), hfu_assumed=hfu, approximate=bool(approx_reasons) or plan.device == "cpu",
        approximate_reason="; ".join(reasons), suggestion=None,
        arch={"model_type": arch.model_type, "params_total": arch.params_total, "params_active": arch.params_active,
              "layers": arch.layers, "vocab": arch.vocab},
        peak_phase=mem.peak_phase, device=plan.device, engine=spec.engine, method=spec.method.kind,
        seq_len=t.seq_len, attn_implementation=plan.attn, loss_impl=plan.loss_impl,
        activation_checkpointing=t.activation_checkpointing, params_trainable=mem.trainable,
        arch_source=plan.loaded.source, doc_len=doc_len, dataset_tokens=data.tokens, hfu_source=hfu_source,
        phases_gib={k: gib(v.total) for k, v in mem.phases.items()},
        host_offload_gib=gib(mem.host_offload),
        host_memory_gib=round(plan.host_bytes / GIB, 1)
        if plan.host_bytes is not None and (mem.host_offload or mem.host_short) else None,
        peak_mem_gib=({"allocated": gib(mem.allocated), "reserved": gib(per_gpu + dev.idle_pools - dev.context)}
                      if plan.device == "cuda" else {"rss": gib(per_gpu)}),
        per_gpu_basis=PER_GPU_BASIS[plan.device], approximate_scope=scope,
        dataset_format=data.row_format, packing=packing, **tuned.to_dict(),
    )
