"""The native engine: a plain PyTorch FSDP2 training loop over packed blocks, one process per rank.

One optimizer step = grad_accum micro-batches of micro_batch blocks per rank. The loss is the sum of token
cross-entropies divided by the number of target tokens of the whole global batch (every rank, every micro-batch),
so the update does not depend on how the tokens fell across ranks or micro-batches. With
hardware.sequence_parallel = N, N consecutive ranks share each block (runner.train.ulysses): each counts and
trains its slice, so the block's tokens count once and the loss and gradients are the same as with whole blocks.
Before each step the ranks
agree, on the host, whether any ran out of data or was asked to stop, so all stop on the same step and none waits
alone in a collective.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from runner.train.data import PackedBlock, PackStats, collate, empty_block, to_device
from runner.train.loss import loss_sum
from runner.train.samples import with_samples
from runner.engines import saved_as
from runner.events.paths import RunPaths

if TYPE_CHECKING:
    from runner.decide.decisions import Decisions
    from runner.events.lines import EventWriter
    from runner.spec import RunSpec
from runner.train import model as model_mod
from runner.train.runtime import Runtime
from runner.train.schedule import lr_at
from runner.train.ulysses import SequenceParallel


GC_FREEZE_AFTER_STEPS = 2
"""Steps after which every live object (the model, compiled graphs and their guards: millions of them) is frozen out
of Python's garbage collector. A full collection over them took about two steps' worth of time at 8k-token blocks on
the H200 host (gc.callbacks; benchmarks/README.md); frozen, they are never traversed again. (The run-to-run spread at
8k blocks is not from this: it stayed, benchmarks/throughput-h200.md.)"""


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Global gradient norm over every shard (DTensor-aware), clipped when max_norm > 0; a tensor, no host sync."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batches: list[dict[str, Any]],
               global_targets: int, world_size: int, loss_impl: str, max_grad_norm: float,
               sp: SequenceParallel = SequenceParallel()) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over this rank's micro-batches (already on the device).

    Returns (this rank's summed token loss, global grad norm before clipping) as device tensors: nothing here
    waits for the GPU.
    """
    # FSDP averages gradients over ranks; scaling by world size makes that a sum over ranks, so the update is
    # the mean over every target token of the global batch.
    scale = world_size / global_targets
    total = None
    for batch in micro_batches:
        with sp.running(batch):  # a group's ranks exchange attention in forward and backward
            ce = loss_sum(model, batch, loss_impl)
            (ce * scale).backward()
        total = ce.detach() if total is None else total + ce.detach()
    grad_norm = clip_grad_norm(model, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert total is not None
    return total, grad_norm


def block_source(spec: RunSpec, tokenizer: Any):
    from runner.spec import resolve_embedded
    from runner.data.formats import RowFormat
    from runner.train.data import DataSource

    d, t = spec.dataset, spec.train
    # With max_steps the data repeats (reshuffled each pass) until the step count is reached.
    return DataSource(path=resolve_embedded(d.path) if d.path else None, dataset_id=d.id, revision=d.revision,
                      split=d.split, messages_field=d.messages_field, seq_len=t.seq_len, pad_id=tokenizer.pad_token_id,
                      packing=t.packing, seed=t.seed, epochs=None if t.max_steps is not None else t.epochs,
                      row_format=RowFormat.from_spec(d), packing_strategy=t.packing_strategy,
                      eval_fraction=d.eval_fraction)


def block_iterator(spec: RunSpec, tokenizer: Any, rank: int, world_size: int, device: str) -> Iterator[PackedBlock]:
    """This rank's blocks, from the training process or from train.data_workers DataLoader workers."""
    from runner.train.data import BlockStream

    stream = BlockStream(block_source(spec, tokenizer), tokenizer, rank, world_size)
    workers = spec.train.data_workers
    if workers == 0:
        return iter(stream)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers, pin_memory=device == "cuda",
                                         prefetch_factor=4)
    return iter(loader)


def _agree(flags: list[int], targets: int, group: dist.ProcessGroup | None) -> tuple[list[bool], int]:
    """All-reduce (MAX of flags, SUM of target count) on the host-side group: no device sync."""
    f = torch.tensor(flags, dtype=torch.int64)
    n = torch.tensor([targets], dtype=torch.int64)
    dist.all_reduce(f, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(n, op=dist.ReduceOp.SUM, group=group)
    return [bool(x) for x in f.tolist()], int(n.item())


def build(spec: RunSpec, rt: Runtime, decisions: Decisions) -> dict[str, Any]:
    """Tokenizer, model (LoRA applied, sharded, on the device), optimizer and what the rank reports of them, as
    `decisions` say (made before launch: runner.decide); nothing is chosen here."""
    from runner.facts.catalog import in_vision_part
    from runner.train.apply import apply
    from runner.train.attention import keep_documents_apart, recurrent_layer_types
    from runner.train.evaluation import attach_eval
    from runner.train.loss import attach_chunked_loss
    from runner.train.model import load_model, load_tokenizer, param_count
    from runner.train.optim import allocate_states, build_optimizer
    from runner.train.qlora import not_quantized_notes, with_adapters

    t = spec.train
    tokenizer = load_tokenizer(spec)
    sp = SequenceParallel.build(decisions.sequence_parallel, rt.rank, rt.world_size)
    model = load_model(spec, decisions.attn, seed=t.seed, device=rt.device, varlen_kernel=decisions.attn_kernel)
    recurrent = bool(recurrent_layer_types(model.config))
    # Document boundaries go to the model when they are honoured; a recurrent model without packing gets
    # one document per block, and only position_ids.
    pass_boundaries = t.packing or not recurrent
    packing_mechanism = keep_documents_apart(model, t.packing, model_mod.DTYPES.get(spec.model.dtype, torch.float32))
    model, lora_left_out, quantization = with_adapters(model, spec, rt.world_size, rt.device)
    if quantization and rt.rank == 0:  # the rank log says it too, beside the train_begin event
        print(f"[native] qlora: {quantization['quantized_layers']} Linear layers in NF4 ({quantization['library']})"
              + "".join(f"; {n}" for n in not_quantized_notes(quantization)), flush=True)
    params = param_count(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model = apply(model, decisions)
    model.to(rt.device)
    model.train()
    if decisions.loss_impl in ("chunked", "fused"):
        attach_chunked_loss(model, decisions.loss_impl, decisions.loss_chunk_tokens, compiled=decisions.compile)
    attach_eval(model)
    opt = build_optimizer([p for p in model.parameters() if p.requires_grad], t.optimizer_precision, t.lr,
                          tuple(t.betas), t.weight_decay, rt.device, t.seed, rt.rank)
    # States before the first forward (not in the blocks its backward frees); not for a vision tower, which
    # text-only data never gives a gradient (runner.plan.memory counts the same).
    allocate_states(opt, [p for n, p in model.named_parameters() if p.requires_grad and not in_vision_part(n)])
    info = {**decisions.attention.to_dict(), "optimizer_precision": t.optimizer_precision,
            "loss_impl": decisions.loss_impl, "loss_reason": decisions.loss_reason,
            "loss_chunk_tokens": decisions.loss_chunk_tokens, "tiled_mlp": decisions.tiled_mlp_reason,
            "packing": (f"on ({t.packing_strategy}): " + (packing_mechanism or "document mask / cu_seqlens"))
            if t.packing else "off: one document per block",
            "params": params, "trainable_params": trainable, "model_type": model.config.model_type,
            "lora_left_out": lora_left_out, "quantization": quantization,
            "fsdp": (f"fsdp2 over {rt.world_size} rank" + "s" * (rt.world_size > 1)) if decisions.fsdp
            else "none (one rank)", "fsdp_sharded": decisions.fsdp, "levers": decisions.levers,
            "sequence_parallel": sp.size, "offloaded_layers": decisions.offloaded_layers,
            "regenerated_layers": decisions.regenerated_layers, "attention_head_groups": decisions.head_groups,
            "decisions": decisions.to_dict()}
    return {"tokenizer": tokenizer, "model": model, "optimizer": opt, "loss_impl": decisions.loss_impl,
            "pass_boundaries": pass_boundaries, "info": info, "sp": sp}


def _resume(run_dir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, rt: Runtime,
            blocks: Iterator[PackedBlock], stats: PackStats, evaluator: Any,
            events: EventWriter) -> tuple[int, int, str]:
    """Load the latest checkpoint and replay the blocks it had consumed: (step, blocks consumed, checkpoint)."""
    from runner.train import checkpoint as ckpt

    path = RunPaths(run_dir).latest_checkpoint()
    if path is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {RunPaths(run_dir).checkpoints}")
    saved = ckpt.load(path, model, opt, rt.rank, rt.world_size, rt.device)
    step = saved["step"]
    blocks_consumed = 0
    # The stream is deterministic: replaying the consumed blocks also rebuilds the data statistics.
    for block in itertools.islice(blocks, saved["blocks_consumed"]):
        stats.add(block)
        blocks_consumed += 1
    if evaluator is not None:
        from runner.events.lines import read_events

        evaluator.restore(read_events(Path(events._f.name)), step)
    events.resume(step=step, checkpoint=str(path), blocks_consumed=blocks_consumed)
    return step, blocks_consumed, str(path)


def _draw(blocks: Iterator[PackedBlock], grad_accum: int, micro_batch: int, seq_len: int,
          pad_id: int) -> tuple[list[list[PackedBlock]], int, list[PackedBlock]]:
    """One optimizer step's micro-batches: (groups of blocks, 1 if the stream ran out, the blocks drawn). A rank
    that ran out feeds empty blocks, so its collectives still match its peers'."""
    micro: list[list[PackedBlock]] = []
    ran_out, drawn = 0, []
    for _ in range(grad_accum):
        group = []
        for _ in range(micro_batch):
            block = next(blocks, None)
            if block is None:
                ran_out = 1
                block = empty_block(seq_len, pad_id)
            else:
                drawn.append(block)
            group.append(block)
        micro.append(group)
    return micro, ran_out, drawn


def _skipped(real: list[PackedBlock], stats: PackStats, events: EventWriter, step: int, rank: int) -> None:
    """Blocks drawn for a step that no rank had a target for: counted apart (metrics.packing), written as an event,
    and said once in rank 0's log."""
    said = stats.skipped_no_target_blocks > 0 or rank != 0
    for block in real:
        stats.skip(block)
    tokens = sum(b.real_tokens for b in real)
    events.event("skipped", after_step=step, blocks=len(real), tokens=tokens, reason="no target token on any rank")
    if not said:
        print(f"[native] skipped {len(real)} block(s) ({tokens} tokens) after step {step}: no rank's blocks held a "
              "target token (the middle of a long prompt, or empty replies); such blocks are counted in "
              "metrics.packing.skipped_no_target_blocks", flush=True)


def _batches(micro: list[list[PackedBlock]], pass_boundaries: bool, device: str,
             sp: SequenceParallel) -> list[dict[str, Any]]:
    """Each micro-batch collated, cut to this rank's slice (sequence parallel) and on the device, without the
    boundary tensors where the model takes none."""
    batches = []
    for group in micro:
        batch = collate(group)
        if not pass_boundaries:
            batch.pop("cu_seqlens")
            batch.pop("seq_idx")
        batches.append(to_device(sp.shard(batch), device))
    return batches


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> float:
    for group in opt.param_groups:
        group["lr"] = lr
    return lr


def _checkpoint(run_dir: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, rt: Runtime,
                blocks_consumed: int, control: Any, events: EventWriter) -> int:
    """Save a checkpoint of this step (every rank takes part) and say so; returns the step saved."""
    from runner.train import checkpoint as ckpt

    ckpt.save(run_dir, step, model, opt, rt.rank, rt.world_size, rt.device, {"blocks_consumed": blocks_consumed},
              group=control)
    events.checkpoint(step=step, path=str(RunPaths(run_dir).step_checkpoint(step)))
    return step


def _freeze_gc_after_compiling(steps_done: int) -> None:
    if steps_done == GC_FREEZE_AFTER_STEPS:
        # Compiled by now (the first step compiles, the second recompiles for a new number of documents): what
        # lives now lives to the end, and the collector need not walk it again.
        gc.collect()
        gc.freeze()


def _log_step(events: EventWriter, rt: Runtime, step: int, micro: list[list[PackedBlock]], loss_sum: torch.Tensor,
              n_targets: int, rank_targets: int, lr: float, grad_norm: Any, step_tokens: int, step_s: float,
              data_s: float, sp: SequenceParallel) -> float:
    """The step's event line: this rank's loss (null without targets; its slice's under sequence parallelism) and
    the global loss; returns the latter."""
    global_loss = loss_sum.detach().double()
    local = float(global_loss.item())
    dist.all_reduce(global_loss, op=dist.ReduceOp.SUM)
    loss = float(global_loss.item()) / n_targets
    events.step(step=step, loss=local / rank_targets if rank_targets else None, lr=lr, grad_norm=float(grad_norm),
                tokens=step_tokens, step_s=round(step_s, 6), mem_gib=rt.mem_gib(), global_loss=loss,
                target_tokens=rank_targets, data_s=round(data_s, 6),
                doc_len_sq=sp.share(sum(b.doc_len_sq for g in micro for b in g)))
    return loss


def train(spec: RunSpec, rt: Runtime, events: EventWriter, decisions: Decisions, run_dir: Path | None = None,
          resume: bool = False) -> dict[str, Any]:
    """Train to the end of the data or max_steps as `decisions` say; returns the rank's summary for its end event."""
    from runner.train.evaluation import Evaluator
    from runner.train.export import export
    from runner.train.summary import end_summary

    t, run_dir = spec.train, run_dir or Path(".")
    parts = build(spec, rt, decisions)
    model, opt, tokenizer, sp = parts["model"], parts["optimizer"], parts["tokenizer"], parts["sp"]
    # Host-side agreement goes over gloo even on GPU, so deciding to stop never waits for the device.
    control = dist.new_group(backend="gloo") if rt.device == "cuda" else None

    stats = PackStats()
    counted = stats if sp.index == 0 else PackStats()  # a group's blocks counted once, by its first rank
    blocks = block_iterator(spec, tokenizer, *sp.data_shard(rt.rank, rt.world_size), rt.device)
    evaluator = with_samples(Evaluator.build(spec, tokenizer, *sp.data_shard(rt.rank, rt.world_size), rt.device,
                                             parts["pass_boundaries"], sp), spec, tokenizer, rt)
    evaluated_at, stopped_early, pad_id, total_steps = None, None, tokenizer.pad_token_id, t.max_steps
    step, blocks_consumed, resumed_from = \
        _resume(run_dir, model, opt, rt, blocks, counted, evaluator, events) if resume else (0, 0, None)
    events.train_begin(max_steps=total_steps, step=step, **parts["info"], data_workers=t.data_workers,
                       resumed_from=resumed_from)
    tokens_total, last_loss, cancelled, emergency_checkpoint = 0, None, False, False
    last_saved = step if resumed_from else None
    first_step = step  # where this process started (a resumed run starts past 0)
    loop_start = time.perf_counter()
    while total_steps is None or step < total_steps:
        step_start = time.perf_counter()
        consumed_before = blocks_consumed
        micro, ran_out, drawn = _draw(blocks, t.grad_accum, t.micro_batch, t.seq_len, pad_id)
        blocks_consumed += len(drawn)
        batches = _batches(micro, parts["pass_boundaries"], rt.device, sp)
        data_s = time.perf_counter() - step_start
        rank_targets = sum(sp.targets(b) for b in batches)
        (ran_out_any, cancel_any, save_any), n_targets = _agree(
            [ran_out, int(rt.stop_requested), int(rt.checkpoint_requested)], rank_targets, control)
        if cancel_any or (n_targets == 0 and ran_out_any):
            cancelled = cancel_any
            emergency_checkpoint = save_any
            blocks_consumed = consumed_before  # this step did not happen: resume replays its blocks
            break
        if n_targets == 0:  # no rank has a target (middles of long prompts): nothing to learn, not a step
            _skipped(drawn, counted, events, step, rt.rank)
            continue

        lr = _set_lr(opt, lr_at(spec, step + 1, total_steps))
        loss_sum_t, grad_norm = train_step(model, opt, batches, n_targets, rt.world_size, parts["loss_impl"],
                                           t.max_grad_norm, sp)
        step += 1
        counted.add_all(drawn)  # the record's packing statistics count what trained
        _freeze_gc_after_compiling(step - first_step)
        step_tokens = sum(sp.real_tokens([b.real_tokens for b in g], t.seq_len) for g in micro)
        tokens_total += step_tokens

        last_step = ran_out_any or (total_steps is not None and step >= total_steps)
        if step % t.log_every == 0 or last_step:
            last_loss = _log_step(events, rt, step, micro, loss_sum_t, n_targets, rank_targets, lr, grad_norm,
                                  step_tokens, time.perf_counter() - step_start, data_s, sp)
        if evaluator is not None and evaluator.due(step):
            evaluated_at = step
            if evaluator.run(model, step, events)["stop"]:
                stopped_early = step  # every rank has the same eval loss: all stop here
                last_step = True
        if t.checkpoint_every and step % t.checkpoint_every == 0 and not last_step:
            last_saved = _checkpoint(run_dir, step, model, opt, rt, blocks_consumed, control, events)
        if ran_out_any or stopped_early:
            break

    if (t.checkpoint_every or emergency_checkpoint) and last_saved != step and step > 0:
        _checkpoint(run_dir, step, model, opt, rt, blocks_consumed, control, events)
    rt.synchronize()
    elapsed = time.perf_counter() - loop_start - (evaluator.seconds if evaluator else 0.0)
    if evaluator is not None and not cancelled and step > 0 and evaluated_at != step:
        evaluator.run(model, step, events)
    saved = saved_as(spec)
    exported = export(saved, model, tokenizer, run_dir, rt.rank, spec) if not cancelled and saved != "none" else None
    return end_summary(rt, model, stats, steps=step, tokens=tokens_total, train_s=elapsed, final_loss=last_loss,
                       cancelled=cancelled, stopped_early=stopped_early, params=parts["info"]["params"],
                       trainable_params=parts["info"]["trainable_params"], exported=exported)
