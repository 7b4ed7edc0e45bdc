"""Time: hardware FLOPs per step and the calibrated rate (HFU) they run at."""

from __future__ import annotations

import math
import os

from runner.plan.constants import (
    ATTENTION_RATE_FACTOR,
    CALIBRATION,
    CPU_RANK_GFLOPS,
    CPU_STEP_OVERHEAD_S,
    DTYPE_BYTES,
    EAGER_ATTENTION_EFFICIENCY,
    GPU_STEP_OVERHEAD_S,
    HBM_EFFICIENCY,
    HOST_LINK_GB_S,
    LOAD_GB_PER_S,
    PARAMWRAPPER_TRAFFIC,
    NF4_DEQUANT_TRAFFIC,
    SETUP_BASE_S,
    TRL_STEP_OVERHEAD_S,
    TRL_UNWRAPPED_RATE_FACTOR,
    UNWRAPPED_RATE_FACTOR,
    UNWRAPPED_STEP_OVERHEAD_S,
)
from runner.plan.data_size import DataSize
from runner.plan.memory import Memory
from runner.plan.quant import quantized_params
from runner.plan.choices import Plan
from runner.facts.flops import hardware_flops
from runner.engines import engine_for
from runner.spec import RunSpec


def recompute_skipped_params(plan: Plan) -> int:
    """Matmul parameters per token that recomputation does not run again. The native engine's compiled layers hold
    their checkpoint inside the compiled graph (runner.train.apply.checkpoint_in_compile), and backward never reads
    a dense MLP's output projection, so it is not recomputed; a MoE layer's expert outputs feed the routing
    weights' gradient and are. Offloaded layers keep transformers' eager checkpoint."""
    spec = plan.spec
    if not engine_for(spec.engine).checkpoint_inside_compile or not spec.train.compile or plan.device != "cuda" \
            or plan.offloads:
        return 0
    return sum(plan.arch.dense_down_proj_params[:plan.recomputed])


def flops_per_step(plan: Plan, doc_len: int, tokens_per_step: int) -> tuple[float, float]:
    """(hardware FLOPs of one optimizer step over all ranks, the attention part of it): runner/facts/flops.py."""
    spec, arch = plan.spec, plan.arch
    flops, attn_flops = hardware_flops(arch, tokens=tokens_per_step, seq_len=spec.train.seq_len, doc_len=doc_len,
                                       lora=spec.method.adapters,
                                       recomputed=plan.recomputed,
                                       not_recomputed_params=recompute_skipped_params(plan), attn=plan.attn,
                                       packing=spec.train.packing,
                                       attention_share=sum(1 for layer in plan.layers if layer.reruns_attention)
                                       / max(1, arch.layers))
    if plan.loss_impl == "chunked":
        # Its chunks run lm_head forward again in backward (over the target tokens; counted over all of them, the
        # share is not known before tokenising). The fused loss does not (bench ablation-1p7b-chunked: 0.968 s a
        # step against 0.819 fused, of which these FLOPs are a quarter; the rest, its eager softmax, is not counted).
        flops += 2 * (arch.lm_head_params or arch.embed_params) * tokens_per_step
    return flops, attn_flops


def calibration(plan: Plan) -> tuple[float, str]:
    name = plan.gpu.name if plan.gpu else "cpu"
    engine, compiled = plan.spec.engine, plan.spec.train.compile
    for key in ((engine, name, compiled), (engine, name, not compiled), (engine, "H200", compiled),
                (engine, "H200", not compiled)):
        if key in CALIBRATION:
            rate, source = CALIBRATION[key]
            return rate, source if key[1] == name else f"the H200 figure, for lack of a measurement here ({source})"
    raise AssertionError(f"no calibration for the {engine} engine")  # every engine has an H200 entry



def tokens_per_step(spec: RunSpec, world: int, doc_len: int) -> int:
    """Tokens of one optimizer step over all ranks: whole blocks when packed, one document per sequence when not."""
    t = spec.train
    per_rank_seqs = t.micro_batch * t.grad_accum
    if t.packing:
        return t.seq_len * per_rank_seqs * world
    return min(doc_len, t.seq_len) * per_rank_seqs * world


def planned_steps(spec: RunSpec, data: DataSize, tokens: int, world: int,
                  packing_efficiency: float | None = None) -> int | None:
    """train.max_steps, else the steps of train.epochs over the dataset; None when its size is unknown.

    Exact when every row's length is known (`shard_steps`). Otherwise: packed, the blocks hold
    `packing_efficiency` real tokens per block token (bfd leaves room at block ends) and the eval share of the rows
    (dataset.eval_fraction) never trains; not packed, one block a row."""
    t = spec.train
    if t.max_steps is not None:
        return t.max_steps
    exact = shard_steps(spec, data, world)
    if exact is not None:
        return exact
    packs = t.packing
    if packs and data.tokens:
        trained = data.tokens * (1.0 - spec.dataset.eval_fraction) * t.epochs
        return max(1, math.ceil(trained / (tokens * (packing_efficiency or 1.0))))
    if not packs and data.rows:
        return max(1, math.ceil(data.rows * t.epochs / (t.micro_batch * t.grad_accum * world)))
    return None


def shard_steps(spec: RunSpec, data: DataSize, world: int) -> int | None:
    """The steps a run of one epoch makes when every row's length is known (`DataSize.row_lengths`): each rank's
    shard, read by the rank's own reader (runner.data.shard.load_examples: shuffled, then every n-th row; a reader
    is a rank, or a rank's DataLoader worker), cut into blocks as the rank's packer cuts them, then the engine's
    rule for ranks with unequal blocks. None when it cannot be exact: other than one epoch, held-out rows, or
    lengths not all known."""
    t = spec.train
    if not data.row_lengths or t.epochs != 1 or spec.dataset.eval_fraction or not spec.dataset.path:
        return None
    from runner.plan.data_size import reader_lengths
    from runner.data.packing import packing_preview

    engine = engine_for(spec.engine)
    workers = max(1, t.data_workers) if engine.data_workers else 1
    shards = reader_lengths(spec, data, world * workers)
    if shards is None:
        return None
    blocks = []
    for rank in range(world):
        n = 0
        for lengths in shards[rank * workers:(rank + 1) * workers]:
            if t.packing:
                n += packing_preview(lengths, t.seq_len, t.packing_strategy)["blocks"]
            else:
                n += sum(math.ceil(x / t.seq_len) for x in lengths)
        blocks.append(n)
    return steps_over_ranks(engine.pads_ranks_to_longest, blocks, t.micro_batch, t.grad_accum)


def steps_over_ranks(pads_to_longest: bool, blocks: list[int], micro_batch: int, grad_accum: int) -> int:
    """Optimizer steps for ranks holding `blocks` each. Padded to the longest rank, as the Trainer counts them
    (ceil of batches over grad_accum). Otherwise the loop stops after the step in which the first rank runs out,
    a step that runs when some rank still had a block for it (runner.train.native.train)."""
    if pads_to_longest:
        return math.ceil(math.ceil(max(blocks) / micro_batch) / grad_accum)
    per_step = micro_batch * grad_accum
    filled = min(b // per_step for b in blocks)  # steps every rank fills
    return filled + 1 if any(b > filled * per_step for b in blocks) else filled


def setup_seconds(plan: Plan) -> float:
    return SETUP_BASE_S[plan.device] + plan.arch.params_total * DTYPE_BYTES[plan.dtype] / (LOAD_GB_PER_S * 1e9)


def step_time(plan: Plan, mem: Memory, flops: float, attn_flops: float) -> tuple[float, float, str]:
    """(seconds per optimizer step, the HFU it assumes, where that comes from)."""
    if plan.device != "cuda":
        busy = min(plan.nproc, os.cpu_count() or 1) * plan.spec.hardware.nodes  # one thread per rank
        step_s = flops / (busy * CPU_RANK_GFLOPS * 1e9) + CPU_STEP_OVERHEAD_S
        return step_s, 1.0, (f"CPU: {CPU_RANK_GFLOPS:g} GFLOP/s per single-threaded rank and "
                             f"{CPU_STEP_OVERHEAD_S:g} s a step, fitted on the embedded demo (quiet 2-core machine)")
    spec, arch, t, gpu = plan.spec, plan.arch, plan.spec.train, plan.gpu
    assert gpu is not None
    hfu, source = calibration(plan)
    hf_trainer = engine_for(spec.engine).hf_trainer
    unwrapped = not hf_trainer and not plan.sharded
    if unwrapped:
        hfu *= UNWRAPPED_RATE_FACTOR
        source += f"; × {UNWRAPPED_RATE_FACTOR} for one unwrapped rank"
    elif hf_trainer and not plan.sharded:
        hfu *= TRL_UNWRAPPED_RATE_FACTOR
        source += f"; × {TRL_UNWRAPPED_RATE_FACTOR} for one unwrapped process (autocast casts)"
    rate = plan.world * gpu.ceiling_tflops * 1e12 * hfu
    if plan.attn == "eager":
        step_s = (flops - attn_flops) / rate + attn_flops / (rate * EAGER_ATTENTION_EFFICIENCY)
    elif plan.attn_kernel in ATTENTION_RATE_FACTOR:
        factor = ATTENTION_RATE_FACTOR[plan.attn_kernel]
        step_s = (flops - attn_flops) / rate + attn_flops / (rate * factor)
        source += f"; attention through {plan.attn_kernel} at × {factor:g} that rate"
    else:
        step_s = flops / rate
    # One more forward of a layer for each regenerated layer input (runner.train.regenerate), and of the attention
    # for each layer attending in KV-head groups (runner.train.head_groups): a recomputed layer runs about four
    # forwards' work (forward, recompute, a backward of two), its attention four and a half.
    step_s += flops / rate * mem.regenerated / (4 * arch.layers)
    if plan.head_groups > 1:
        step_s += attn_flops / rate / 4.5
    if spec.method.adapters and mem.expert_stack:
        uses = (3 if t.activation_checkpointing else 2) * t.grad_accum
        moved = PARAMWRAPPER_TRAFFIC * uses * mem.expert_stack * 2 * sum(
            1 for i in range(arch.layers) if arch.is_moe_layer(i))
        step_s += moved / (gpu.hbm_tb_s * 1e12 * HBM_EFFICIENCY)
    if spec.method.kind == "qlora":
        # Every rank dequantizes every layer it runs (FSDP2 gathers the NF4 form): each use of each weight.
        uses = (3 if t.activation_checkpointing else 2) * t.grad_accum * t.micro_batch
        step_s += NF4_DEQUANT_TRAFFIC * uses * quantized_params(arch) / (gpu.hbm_tb_s * 1e12 * HBM_EFFICIENCY)
    if mem.host_offload:
        # Each offloaded input comes back over the host link on the compute stream, just before its recompute, and
        # a regenerated input's source once more (the forward copies run on a side stream, overlapped).
        step_s += t.grad_accum * (mem.host_offload + mem.regenerated * mem.layer_input) / (HOST_LINK_GB_S * 1e9)
    step_s += TRL_STEP_OVERHEAD_S if hf_trainer else \
        UNWRAPPED_STEP_OVERHEAD_S if unwrapped else GPU_STEP_OVERHEAD_S
    return step_s, hfu, source
