"""The TRL engine's data: this rank's packed blocks as rows TRL's padding-free collator takes, in a loader the
trainer uses as is. The same tokens and targets as the native engine (runner.train.data builds both)."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist

from runner.spec import RunSpec, resolve_embedded
from runner.train.data import PackedBlock, PackStats, block_counts, empty_block
from runner.train.runtime import Runtime



def block_row(block: PackedBlock) -> dict[str, Any]:
    """A block as TRL's padding-free collator takes it: ids, labels (-100 off target) and segment lengths; with the
    block's real tokens and Σ L² over its document segments (padding left out), for the step's statistics."""
    return {"input_ids": block.input_ids.tolist(), "labels": block.labels.tolist(),
            "seq_lengths": (block.cu_seqlens[1:] - block.cu_seqlens[:-1]).tolist(), "real_tokens": block.real_tokens,
            "doc_len_sq": block.doc_len_sq}


def rank_rows(spec: RunSpec, tokenizer: Any, rt: Runtime, stats: PackStats,
              documents: list[PackedBlock] | None = None) -> list[dict[str, Any]]:
    """This rank's blocks: all epochs when the run is counted in epochs, one pass when it is counted in steps.
    Each block's statistics are not added to `stats` but kept in `documents` (one block a row, its tensors
    dropped): they are counted as the trainer's steps consume the rows (TrainedRows)."""
    from runner.data.formats import RowFormat
    from runner.train.data import BlockStream, DataSource

    d, t = spec.dataset, spec.train
    source = DataSource(path=resolve_embedded(d.path) if d.path else None, dataset_id=d.id, revision=d.revision,
                        split=d.split, messages_field=d.messages_field, seq_len=t.seq_len,
                        pad_id=tokenizer.pad_token_id, packing=t.packing, seed=t.seed,
                        epochs=1.0 if t.max_steps is not None else t.epochs, packing_strategy=t.packing_strategy,
                        eval_fraction=d.eval_fraction, row_format=RowFormat.from_spec(d))
    rows = []
    for block in BlockStream(source, tokenizer, rt.rank, rt.world_size):
        stats.see(block)
        rows.append({**block_row(block), "row": len(rows)})
        if documents is not None:
            documents.append(documents_only(block))
    return rows


class TrainedRows:
    """This rank's rows' statistics, counted into PackStats as the trainer's steps consume the rows (its loss
    function sees their indices), so the record counts what trained, not the file."""

    def __init__(self, stats: PackStats, documents: list[PackedBlock]):
        self.stats, self.documents = stats, documents

    def trained(self, rows: list[int]) -> None:
        for i in rows:
            if 0 <= i < len(self.documents):  # -1: a row that only evens the ranks' row counts
                self.stats.add_counts(self.documents[i].counts)
                self.stats.add_documents(self.documents[i])


def documents_only(block: PackedBlock) -> PackedBlock:
    """The block's statistics without its tensors (kept for every row until the trainer trains on it)."""
    empty = torch.empty(0, dtype=torch.long)
    kept = PackedBlock(empty, empty, empty, empty, empty, 0, 0, doc_lengths=block.doc_lengths,
                       doc_splits=block.doc_splits)
    kept.counts = block_counts(block)  # type: ignore[attr-defined]
    return kept


def draws(n_rows: int, drawn: int | None, seed: int) -> Counter:
    """How many times the trainer draws each row: every row once when the run is counted in epochs (`drawn` None:
    the rows hold every epoch), else the first `drawn` rows of EpochOrder's sequence (stream order, then a seeded
    permutation per further pass)."""
    if drawn is None:
        return Counter(range(n_rows))
    out: Counter = Counter()
    order, epoch = EpochOrder(n_rows, seed), 0
    while drawn > 0 and n_rows:
        order.set_epoch(epoch)
        out.update(itertools.islice(iter(order), drawn))
        drawn, epoch = drawn - n_rows, epoch + 1
    return out


def equalise_rows(rows: list[dict[str, Any]], seq_len: int, pad_id: int, device: str) -> int:
    """Pad every rank to the same number of rows with all-masked blocks, so every rank runs the same steps."""
    count = torch.tensor([len(rows)], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    target = int(count.item())
    while len(rows) < target:
        rows.append({**block_row(empty_block(seq_len, pad_id)), "row": -1})
    return target


class EpochOrder(torch.utils.data.Sampler):
    """The shard's stream order in the first pass; a seeded permutation of it in each later one."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        if self.epoch == 0:
            return iter(range(self.n))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


class RankLoader(torch.utils.data.DataLoader):
    """This rank's rows in order. The trainer uses it as is: accelerate must not shard it a second time.

    `wait_s` accumulates the time the trainer spent waiting for batches (collation included): the step events'
    data_s, as the native engine reports it."""

    wait_s = 0.0
    trained: TrainedRows | None = None  # counts the rows the trainer's loss saw (rank_dataset sets it)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Any:
        batches = super().__iter__()
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.wait_s += time.perf_counter() - start
            yield batch


COUNTING_KEYS = ("real_tokens", "doc_len_sq", "rows")
"""What CountingCollator adds to TRL's batch for the step's statistics: popped before the model sees the batch."""


class CountingCollator:
    """TRL's padding-free collator plus the batch's real-token count (popped again before the forward)."""

    def __init__(self, pad_token_id: int):
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        self.inner = DataCollatorForLanguageModeling(pad_token_id=pad_token_id, padding_free=True)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        keep = ("input_ids", "labels", "seq_lengths")
        batch = self.inner([{k: ex[k] for k in keep} for ex in examples])
        batch["real_tokens"] = sum(int(ex["real_tokens"]) for ex in examples)
        # Σ document length² of the batch (padding left out): the attention FLOPs of MFU, as the native engine
        # reports them.
        batch["doc_len_sq"] = sum(int(ex["doc_len_sq"]) for ex in examples)
        batch["rows"] = [int(ex.get("row", -1)) for ex in examples]  # which rows trained (TrainedRows)
        return batch


def collator_passes_boundaries() -> bool:
    """Whether this TRL's padding-free collator gives the model the document boundaries (cu_seq_lens_q, seq_idx)
    that gated-delta layers need to restart per document, not only position_ids."""
    from runner.train.data import make_block

    block = make_block([5, 6, 7, 8], [False, True, False, True], [0, 2], 4, 0)
    batch = CountingCollator(0)([block_row(block)])
    return "cu_seq_lens_q" in batch and "seq_idx" in batch


def rank_dataset(spec: RunSpec, tokenizer: Any, rt: Runtime, stats: PackStats) -> tuple[Any, RankLoader, int, int]:
    """This rank's rows as a datasets.Dataset and the loader the trainer uses as is: (dataset, loader, this rank's
    own rows, rows after every rank was padded to the same count). The loader's `trained` counts the rows into
    `stats` as the trainer trains on them."""
    from datasets import Dataset

    from runner.errors import UserError

    t = spec.train
    documents: list[PackedBlock] = []
    rows = rank_rows(spec, tokenizer, rt, stats, documents)
    own_rows = len(rows)
    n_rows = equalise_rows(rows, t.seq_len, tokenizer.pad_token_id, rt.device)
    if n_rows == 0:
        raise UserError(f"dataset {spec.dataset.path or spec.dataset.id}: no example with an assistant turn on any "
                        f"rank (split {spec.dataset.split!r}, field {spec.dataset.messages_field!r})")
    dataset = Dataset.from_list(rows)
    loader = RankLoader(dataset, batch_size=t.micro_batch, sampler=EpochOrder(n_rows, t.seed),
                        collate_fn=CountingCollator(tokenizer.pad_token_id), num_workers=0,
                        pin_memory=rt.device == "cuda")
    loader.trained = TrainedRows(stats, documents)
    return dataset, loader, own_rows, n_rows
