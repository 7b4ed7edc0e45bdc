"""The native engine: a plain PyTorch FSDP2 training loop over packed blocks, one process per rank."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runner.events import EventWriter
from runner.spec import RunSpec, resolve_embedded
from runner.train.data import (
    IGNORE,
    PackedBlock,
    PackStats,
    collate,
    empty_block,
    has_generation_markers,
    load_examples,
    pack,
    tokenize_sft,
    tokenize_sft_generation,
)
from runner.train.model import load_model, load_tokenizer, shard_model
from runner.train.runtime import Runtime


def lr_at(spec: RunSpec, step: int, total_steps: int | None) -> float:
    """Learning rate for optimizer step `step` (1-based): linear warmup, then the schedule."""
    t = spec.train
    if t.warmup_steps and step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    if t.schedule == "constant" or not total_steps:
        return t.lr
    progress = min(1.0, (step - t.warmup_steps) / max(1, total_steps - t.warmup_steps))
    if t.schedule == "cosine":
        return t.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return t.lr * (1.0 - progress)


def block_stream(spec: RunSpec, tokenizer: Any, rt: Runtime, stats: PackStats) -> Iterator[PackedBlock]:
    """This rank's packed blocks over all epochs (a fractional epoch count stops mid-way through the last)."""
    d = spec.dataset
    path = resolve_embedded(d.path) if d.path else None
    tokenize = tokenize_sft_generation if has_generation_markers(tokenizer) else tokenize_sft
    field = d.messages_field
    # With max_steps the data repeats (reshuffled) until the step count is reached; else whole epochs, rounded up.
    epochs = math.ceil(spec.train.epochs) if spec.train.max_steps is None else 10**9
    for epoch in range(epochs):
        ds = load_examples(path, d.id, d.revision, d.split, rt.rank, rt.world_size, spec.train.seed, epoch)
        yield from pack((tokenize(tokenizer, ex[field]) for ex in ds), spec.train.seq_len, tokenizer.pad_token_id,
                        stats)


def train(spec: RunSpec, rt: Runtime, events: EventWriter) -> dict[str, Any]:
    """Train to the end of the data or max_steps; returns the rank's summary for its end event."""
    t = spec.train
    tokenizer = load_tokenizer(spec)
    torch.manual_seed(t.seed)
    model = load_model(spec, rt.device)
    model = shard_model(model, rt.device, t.activation_checkpointing)
    model.to(rt.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                            fused=rt.device == "cuda")

    stats = PackStats()
    blocks = block_stream(spec, tokenizer, rt, stats)
    pad_id = tokenizer.pad_token_id
    micro_per_step = t.grad_accum
    total_steps = t.max_steps
    events.event("train_begin", max_steps=total_steps, params=sum(p.numel() for p in model.parameters()))

    step = 0
    tokens_total = 0
    last_loss = None
    loop_start = time.perf_counter()
    while True:
        step_start = time.perf_counter()
        micro: list[list[PackedBlock]] = []
        ran_out = 0
        for _ in range(micro_per_step):
            group = []
            for _ in range(t.micro_batch):
                block = next(blocks, None)
                if block is None:
                    ran_out = 1
                    block = empty_block(t.seq_len, pad_id)
                group.append(block)
            micro.append(group)
        # Ranks hold different amounts of data: all agree on whether this is the last step, so none waits
        # alone in a collective. A cancel request travels in the same all-reduce.
        agree = torch.tensor([ran_out, int(rt.stop_requested)], dtype=torch.int64, device=rt.device)
        dist.all_reduce(agree, op=dist.ReduceOp.MAX)
        count = torch.tensor([sum(b.target_tokens for g in micro for b in g)], dtype=torch.float64, device=rt.device)
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
        ran_out_any, cancel_any = (bool(x) for x in agree.tolist())
        n_targets = float(count.item())
        if cancel_any or n_targets == 0:
            break

        lr = lr_at(spec, step + 1, total_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
        rank_targets = 0
        step_tokens = 0
        for group in micro:
            batch = {k: v.to(rt.device, non_blocking=True) for k, v in collate(group).items()}
            ce_sum = forward_loss_sum(model, batch)
            # FSDP averages gradients over ranks; scaling by world size makes the result a sum over
            # ranks, so the update is the mean over every target token of the global batch.
            (ce_sum * (rt.world_size / n_targets)).backward()
            loss_sum += ce_sum.detach().double()
            rank_targets += sum(b.target_tokens for b in group)
            step_tokens += sum(b.real_tokens for b in group)
        grad_norm = clip_grad_norm(model, t.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens_total += step_tokens

        if step % t.log_every == 0 or ran_out_any or step == total_steps:
            global_loss = loss_sum.clone()
            dist.all_reduce(global_loss, op=dist.ReduceOp.SUM)
            rank_loss = float(loss_sum.item()) / rank_targets if rank_targets else float("nan")
            last_loss = float(global_loss.item()) / n_targets
            events.step(step=step, loss=rank_loss, lr=lr, grad_norm=float(grad_norm), tokens=step_tokens,
                        step_s=round(time.perf_counter() - step_start, 6), mem_gib=rt.mem_gib(),
                        global_loss=last_loss, target_tokens=rank_targets)
        if ran_out_any or (total_steps is not None and step >= total_steps):
            break

    rt.synchronize()
    elapsed = time.perf_counter() - loop_start
    return {"steps": step, "tokens": tokens_total, "train_s": round(elapsed, 3), "final_loss": last_loss,
            "peak_mem_gib": rt.peak_mem_gib(), "data": stats.to_dict(), "reason": "cancelled" if rt.stop_requested
            else "done"}


def forward_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of token cross-entropies over the targets of one packed micro-batch (float32)."""
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    logits = out.logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Global gradient norm over every shard (DTensor-aware), clipped when max_norm > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)
