"""Evaluation during training: the held-out rows, the eval blocks of each rank, eval loss and token accuracy
over every rank, and early stopping. Both engines call `Evaluator`.

* Held-out rows (`dataset.eval_fraction`): a row is held out when the hash of its content with `train.seed`
  falls under the fraction. The choice depends on neither the world size, the data workers nor the order of
  the stream, so training never sees a held-out row, and a resume or replay holds out the same rows. (Identical
  rows are held out together, so a duplicate cannot leak into training.) Or a named split (`dataset.eval_split`).
* The eval rows are tokenised, masked and packed exactly as training rows are (same strategy and seq_len); each
  rank evaluates its disjoint shard, padded with empty blocks to the same count so FSDP's collectives match.
* Global eval loss = summed token loss / summed target tokens over every rank; token accuracy = targets whose
  argmax prediction is right / targets. Every rank gets the same numbers, so early stopping
  (`train.early_stop_patience` evaluations without improvement) stops all ranks on the same step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from runner.data.formats import is_heldout  # noqa: F401 - the held-out rule, kept with the row formats

if TYPE_CHECKING:
    from runner.events.lines import Event, EventWriter
    from runner.spec import RunSpec

EVAL_METHOD = "sft_eval_sums"


def has_eval(spec: RunSpec) -> bool:
    return bool(spec.dataset.eval_split) or spec.dataset.eval_fraction > 0


def eval_source(spec: RunSpec, pad_id: int):
    """The DataSource of the eval rows: one pass, the same tokenisation and packing as training."""
    from runner.spec import resolve_embedded
    from runner.train.data import DataSource

    d, t = spec.dataset, spec.train
    return DataSource(path=resolve_embedded(d.path) if d.path else None, dataset_id=d.id, revision=d.revision,
                      split=d.eval_split or d.split, messages_field=d.messages_field, seq_len=t.seq_len,
                      pad_id=pad_id, packing=t.packing, seed=t.seed, epochs=1.0,
                      packing_strategy=t.packing_strategy,
                      eval_fraction=0.0 if d.eval_split else d.eval_fraction, heldout=not d.eval_split)


def eval_sums(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """[summed token loss, right argmax predictions, target tokens] of one packed batch, float64, no logits
    tensor for the whole block (lm_head runs on the target positions, a chunk at a time)."""
    import torch.nn.functional as F

    from runner.train.loss import _target_hidden, chunk_tokens_for

    hidden, index, targets, head = _target_hidden(model, batch)
    out = torch.zeros(3, dtype=torch.float64, device=hidden.device)
    chunk = chunk_tokens_for(head.weight.shape[0])
    selected = hidden.index_select(0, index)
    for start in range(0, selected.size(0), chunk):
        logits = head(selected[start:start + chunk]).float()
        want = targets[start:start + chunk]
        out[0] += F.cross_entropy(logits, want, reduction="sum").double()
        out[1] += (logits.argmax(-1) == want).sum()
    out[2] = index.numel()
    return out


def attach_eval(model: torch.nn.Module) -> None:
    """Give the (FSDP root) model an `sft_eval_sums(batch)` method run under FSDP's forward hooks, as the chunked
    loss is (runner.train.loss.attach_chunked_loss): it calls the base model and lm_head directly."""
    import types

    setattr(model, EVAL_METHOD, types.MethodType(lambda self, batch: eval_sums(self, batch), model))
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    if isinstance(model, FSDPModule):
        register_fsdp_forward_method(model, EVAL_METHOD)


@dataclass
class Evaluator:
    """This rank's eval blocks and the early-stopping state; `run(step)` evaluates and writes the eval event."""

    spec: RunSpec
    device: str
    batches: list[dict[str, Any]]
    own_blocks: int
    pass_boundaries: bool = True
    history: list[tuple[int, float]] = field(default_factory=list)
    best: tuple[int, float] | None = None
    stale: int = 0
    seconds: float = 0.0  # time spent evaluating, kept out of the training time and tokens/s
    sp: Any = None  # runner.train.ulysses.SequenceParallel: the batches are this rank's slices

    @classmethod
    def build(cls, spec: RunSpec, tokenizer: Any, rank: int, world_size: int, device: str,
              pass_boundaries: bool = True, sp: Any = None) -> Evaluator | None:
        """None when the run has no eval set. Blocks are collated once: the same batches at every evaluation."""
        from runner.train.data import BlockStream, collate, empty_block

        if not has_eval(spec):
            return None
        pad_id = tokenizer.pad_token_id
        blocks = list(BlockStream(eval_source(spec, pad_id), tokenizer, rank, world_size))
        count = torch.tensor([len(blocks)], dtype=torch.int64, device=device)  # nccl reduces device tensors
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        n = -(-int(count.item()) // spec.train.micro_batch) * spec.train.micro_batch
        if n == 0:
            raise ValueError("the eval set is empty: no held-out row with an assistant turn "
                             f"(dataset.eval_fraction={spec.dataset.eval_fraction}, "
                             f"dataset.eval_split={spec.dataset.eval_split!r}); raise the fraction or name a split")
        own = len(blocks)
        blocks += [empty_block(spec.train.seq_len, pad_id) for _ in range(n - own)]
        mb = spec.train.micro_batch
        batches = []
        for i in range(0, n, mb):
            batch = collate(blocks[i:i + mb])
            if not pass_boundaries:
                batch.pop("cu_seqlens")
                batch.pop("seq_idx")
            batches.append(sp.shard(batch) if sp is not None else batch)
        return cls(spec, device, batches, own, pass_boundaries, sp=sp)

    def restore(self, past_events: list[Event], step: int) -> None:
        """On resume: the best eval loss and the evaluations since it, from this rank's eval events up to `step`
        (the checkpoint's), so early stopping goes on counting as if the run had not stopped."""
        from runner.events.lines import latest_evals

        for e in latest_evals(past_events):
            if e.step is None or e.step > step:
                continue
            s, loss = e.step, e.loss
            self.history.append((s, loss if loss is not None else float("inf")))
            if loss is not None and (self.best is None or loss < self.best[1]):
                self.best, self.stale = (s, loss), 0
            else:
                self.stale += 1

    def due(self, step: int) -> bool:
        every = self.spec.train.eval_every
        return bool(every) and step % every == 0

    @torch.no_grad()
    def run(self, model: torch.nn.Module, step: int, events: EventWriter,
            sums_fn: Any = None) -> dict[str, Any]:
        """Evaluate every batch, all-reduce the sums, write `{"event": "eval", ...}`; returns the event's fields."""
        import time

        from runner.train.data import to_device

        start = time.perf_counter()
        was_training = model.training
        model.eval()
        total = torch.zeros(3, dtype=torch.float64, device=self.device)
        fn = sums_fn or getattr(model, EVAL_METHOD, None) or (lambda b: eval_sums(model, b))
        for batch in self.batches:
            batch = to_device(batch, self.device)
            with self.sp.running(batch) if self.sp is not None else contextlib.nullcontext():
                total += fn(batch)
        if was_training:
            model.train()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        loss_sum, right, targets = (float(x) for x in total.tolist())
        loss = loss_sum / targets if targets else None
        fields = {"step": step, "loss": loss, "accuracy": right / targets if targets else None,
                  "target_tokens": int(targets), "blocks": self.own_blocks}
        self.history.append((step, loss if loss is not None else float("inf")))
        if loss is not None and (self.best is None or loss < self.best[1]):
            self.best, self.stale = (step, loss), 0
        else:
            self.stale += 1
        patience = self.spec.train.early_stop_patience
        fields["stop"] = bool(patience) and self.stale >= patience
        if self.best is not None:
            fields["best_step"], fields["best_loss"] = self.best
        self.seconds += time.perf_counter() - start
        fields["eval_s"] = round(time.perf_counter() - start, 3)
        events.eval(**fields)
        return fields
