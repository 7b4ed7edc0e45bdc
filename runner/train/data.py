"""SFT data: stream this rank's shard, tokenise with an assistant-only loss mask, pack into exact-length blocks.

Rules, in the order the data meets them:

* Sharding: every (rank, DataLoader worker) stream reads a disjoint shard, `split_dataset_by_node` over
  rank * workers + worker of world * workers (the same for hub datasets and local files). The order is
  deterministic for a given seed, world size and `train.data_workers`, which is what resume relies on.
* Rows: `runner.data.formats` reads each row in the dataset's format (messages, ShareGPT, alpaca, prompt/completion,
  text; detected on the stream's first row unless dataset.format says) as messages with a trained flag each, or
  as text segments.
* Tokenisation: templates with `{% generation %}` markers give ids and mask in one render when exactly the
  assistant turns train; otherwise turns are bracketed one by one (runner.data.tokens); text is tokenised
  as it is, ending in EOS. Examples without a trained token are skipped and counted (`skipped_no_assistant`).
* Packing (`train.packing=true`, `train.packing_strategy=wrapped`; `bfd` keeps conversations whole and is
  laid out by runner.data.packing): examples are concatenated and cut into blocks of exactly seq_len tokens. Inside
  a block each document is a segment: position_ids restart at 0, `cu_seqlens` / `seq_idx` / `max_len` give the
  boundaries, and the label of a segment's first token is -100 so the shifted loss never predicts across a
  boundary. A document longer than the room left in a block is cut at the block end and continues at the start
  of the next block as a new segment (positions restart, its first token there is not a target, the context
  before the cut is not visible): `split_documents` counts such documents. The last partial block is padded
  with segments of its own (at most PAD_SEGMENT tokens each, so padding costs attention in proportion to its
  length) and no targets.
* No packing (`train.packing=false`): one document per block, padded to seq_len; a longer document is split into
  seq_len pieces the same way. For models whose layers cannot keep packed documents apart.
* Statistics: each block carries what the stream consumed for it (examples, skipped, split documents) and the
  length of every document segment it holds (`doc_lengths`: a whole conversation, or the piece of a split one that
  lies in this block; `doc_splits`: how many are pieces), so PackStats, fed the blocks a rank trains on, reports
  the documents as they trained (runner.data.doclengths; the record merges the ranks'): their tokens add up to the
  real tokens trained, and a run that trained only pieces of long conversations still counts them.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runner.data import doclengths
from runner.data.formats import RowFormat, RowReader
from runner.data.packing import BFD_BUFFER_BLOCKS, bfd_layout, shuffle_blocks
from runner.data.shard import load_examples
from runner.data.tokens import Example, has_generation_markers, tokenize_sample
from runner.train.blocks import IGNORE, PackedBlock, carry_counts, empty_block, make_block  # noqa: F401 - re-exported


@dataclass
class PackStats:
    examples: int = 0
    skipped_no_assistant: int = 0
    split_documents: int = 0
    blocks: int = 0
    real_tokens: int = 0
    target_tokens: int = 0
    padded_tokens: int = 0
    fingerprint: hashlib._Hash = field(default_factory=hashlib.sha256, repr=False)
    fingerprint_blocks: int = 0
    doc_lengths: Counter = field(default_factory=Counter, repr=False)  # length → document segments, blocks added
    doc_splits: int = 0  # of those segments, the pieces of documents split across blocks
    # Blocks drawn but not trained: every rank's blocks of that step held no target token (the middle of a long
    # prompt, empty replies), so no step was taken on them.
    skipped_no_target_blocks: int = 0
    skipped_no_target_tokens: int = 0

    def add_all(self, blocks: Iterable[PackedBlock]) -> None:
        for block in blocks:
            self.add(block)

    def skip(self, block: PackedBlock) -> None:
        """Count a block drawn but not trained on (its step had no target token on any rank)."""
        self.skipped_no_target_blocks += 1
        self.skipped_no_target_tokens += block.real_tokens

    def see(self, block: PackedBlock) -> None:
        """Hash the stream's first blocks into the data fingerprint, trained or not: it names the data."""
        if self.fingerprint_blocks < FINGERPRINT_BLOCKS:
            self.fingerprint.update(block.input_ids.numpy().tobytes())
            self.fingerprint_blocks += 1

    def add_counts(self, counts: dict[str, int], times: int = 1) -> None:
        """Count a block by its `block_counts`, `times` times (a row the trainer draws more than once)."""
        self.examples += counts["examples"] * times
        self.skipped_no_assistant += counts["skipped_no_assistant"] * times
        self.split_documents += counts["split_documents"] * times
        self.blocks += times
        self.real_tokens += counts["real_tokens"] * times
        self.padded_tokens += (counts["tokens"] - counts["real_tokens"]) * times
        self.target_tokens += counts["target_tokens"] * times

    def add(self, block: PackedBlock, documents: bool = True) -> None:
        """Count a block; `documents=False` leaves its documents out of the length statistics (a block that was
        built but will not be trained on)."""
        self.examples += block.examples
        self.skipped_no_assistant += block.skipped_no_assistant
        self.split_documents += block.split_documents
        if documents:
            self.add_documents(block)
        self.blocks += 1
        self.real_tokens += block.real_tokens
        self.padded_tokens += block.input_ids.numel() - block.real_tokens
        self.target_tokens += block.target_tokens
        self.see(block)

    def add_documents(self, block: PackedBlock, times: int = 1) -> None:
        """The document segments of this block (whole documents or pieces), trained on `times` times."""
        for n in block.doc_lengths:
            self.doc_lengths[n] += times
        self.doc_splits += block.doc_splits * times

    def to_dict(self) -> dict[str, Any]:
        total = self.real_tokens + self.padded_tokens
        return {
            "examples": self.examples,
            "skipped_no_assistant": self.skipped_no_assistant,
            "split_documents": self.split_documents,
            "blocks": self.blocks,
            "real_tokens": self.real_tokens,
            "target_tokens": self.target_tokens,
            "packing_efficiency": round(self.real_tokens / total, 4) if total else None,
            "target_share": round(self.target_tokens / total, 4) if total else None,
            "fingerprint": self.fingerprint.hexdigest(),
            "skipped_no_target_blocks": self.skipped_no_target_blocks,
            "skipped_no_target_tokens": self.skipped_no_target_tokens,
            # Documents as trained (whole, or the piece in a trained block): a summary, and the histogram the record
            # merges; their tokens are the real tokens trained.
            "doc_tokens": {**doclengths.summary(self.doc_lengths), "split": self.doc_splits},
            "doc_lengths": doclengths.histogram(self.doc_lengths),
        }


FINGERPRINT_BLOCKS = 4  # token ids of the first blocks of each rank are hashed into the data fingerprint


def block_counts(block: PackedBlock) -> dict[str, int]:
    """What PackStats counts of a block, kept without its tensors (PackStats.add_counts)."""
    return {"examples": block.examples, "skipped_no_assistant": block.skipped_no_assistant,
            "split_documents": block.split_documents, "real_tokens": block.real_tokens,
            "target_tokens": block.target_tokens, "tokens": block.input_ids.numel()}


def pack(examples: Iterable[Example], seq_len: int, pad_id: int, stats: PackStats | None = None,
         packing: bool = True, strategy: str = "wrapped", seed: int = 0) -> Iterator[PackedBlock]:
    """Concatenate tokenised examples and cut exact seq_len blocks (the rules are in the module docstring);
    `strategy="bfd"` packs whole conversations by best-fit decreasing instead (runner.data.packing), its blocks
    in an order drawn from `seed`.

    Each block carries what was consumed to build it (examples, skipped, split documents); `stats`, when
    given, is updated as blocks are yielded.
    """
    if packing and strategy == "bfd":
        yield from pack_bfd(examples, seq_len, pad_id, stats, seed=seed)
        return
    buf: list[int] = []
    loss: list[bool] = []
    starts: list[int] = []  # offsets in buf where documents begin; 0 may mean "a new document starts the block"
    pending = {"examples": 0, "skipped_no_assistant": 0, "split_documents": 0}

    def emit(ids: list[int], mask: list[bool], st: list[int], continued: bool, cut: bool) -> PackedBlock:
        """`continued`: the block begins inside a document; `cut`: its last document goes on in the next block."""
        block = carry_counts(make_block(ids, mask, st, seq_len, pad_id), pending)
        segments = block.document_segment_lengths()
        block.doc_lengths, block.doc_splits = tuple(segments), min(len(segments), int(continued) + int(cut))
        if stats is not None:
            stats.add(block)
        return block

    for ids, mask in examples:
        pending["examples"] += 1
        if not any(mask):
            pending["skipped_no_assistant"] += 1
            continue
        if not packing:
            if len(ids) > seq_len:
                pending["split_documents"] += 1
            for a in range(0, len(ids), seq_len):
                yield emit(ids[a:a + seq_len], mask[a:a + seq_len], [0], a > 0, a + seq_len < len(ids))
            continue
        starts.append(len(buf))
        buf.extend(ids)
        loss.extend(mask)
        while len(buf) >= seq_len:
            # The cut falls inside a document unless one begins exactly at it; count that document once,
            # when it started in this block (a document spanning several blocks is one split document).
            if len(buf) > seq_len and seq_len not in starts and any(s < seq_len for s in starts):
                pending["split_documents"] += 1
            yield emit(buf[:seq_len], loss[:seq_len], starts, not starts or starts[0] != 0,
                       len(buf) > seq_len and seq_len not in starts)
            buf, loss = buf[seq_len:], loss[seq_len:]
            starts = [s - seq_len for s in starts if s >= seq_len]
    if buf:
        yield emit(buf, loss, starts, not starts or starts[0] != 0, False)


def pack_bfd(examples: Iterable[tuple[list[int], list[bool]]], seq_len: int, pad_id: int, stats: PackStats | None = None,
             buffer_blocks: int = BFD_BUFFER_BLOCKS, seed: int = 0) -> Iterator[PackedBlock]:
    """`pack`'s contract with the bfd strategy (runner.data.packing lays the blocks out): PackedBlocks carrying
    what the stream consumed for them."""
    docs: list[tuple[list[int], list[bool]]] = []
    buffered = 0
    buffers = 0
    pending = {"examples": 0, "skipped_no_assistant": 0, "split_documents": 0}

    def flush() -> Iterator[PackedBlock]:
        nonlocal docs, buffered, buffers
        layout = shuffle_blocks(bfd_layout([len(ids) for ids, _ in docs], seq_len), seed, buffers)
        buffers += 1
        for block_items in layout:
            ids: list[int] = []
            mask: list[bool] = []
            starts: list[int] = []
            for i, a, b in block_items:
                starts.append(len(ids))
                ids.extend(docs[i][0][a:b])
                mask.extend(docs[i][1][a:b])
            # The consumed counts ride on the first block of the buffer, so they add up wherever blocks go; each
            # block carries its document segments (whole documents, or the pieces of split ones it holds).
            block = carry_counts(make_block(ids, mask, starts, seq_len, pad_id), pending)
            block.doc_lengths = tuple(b - a for _, a, b in block_items)
            block.doc_splits = sum((a, b) != (0, len(docs[i][0])) for i, a, b in block_items)
            if stats is not None:
                stats.add(block)
            yield block
        docs, buffered = [], 0

    for ids, mask in examples:
        pending["examples"] += 1
        if not any(mask):
            pending["skipped_no_assistant"] += 1
            continue
        if len(ids) > seq_len:
            pending["split_documents"] += 1
        docs.append((ids, mask))
        buffered += len(ids)
        if buffered >= buffer_blocks * seq_len:
            yield from flush()
    if docs:
        yield from flush()


def collate(blocks: list[PackedBlock]) -> dict[str, Any]:
    """Stack micro_batch blocks as one packed row: documents stay apart because positions and cu_seqlens do.

    Also gives the loss what it needs without a device sync: `target_index` (positions whose next token is a
    target) and `target_ids` (those next tokens), computed here on the host.
    """
    if len(blocks) == 1:
        b = blocks[0]
        out: dict[str, Any] = {"input_ids": b.input_ids[None], "labels": b.labels[None],
                               "position_ids": b.position_ids[None], "seq_idx": b.seq_idx[None],
                               "cu_seqlens": b.cu_seqlens, "max_len": b.max_len}
    else:
        offsets = []
        total = 0
        for b in blocks:
            offsets.append(b.cu_seqlens[:-1] + total)
            total += b.input_ids.numel()
        seq_idx, base = [], 0
        for b in blocks:
            seq_idx.append(b.seq_idx + base)
            base += int(b.seq_idx.max()) + 1
        out = {
            "input_ids": torch.cat([b.input_ids for b in blocks])[None],
            "labels": torch.cat([b.labels for b in blocks])[None],
            "position_ids": torch.cat([b.position_ids for b in blocks])[None],
            "seq_idx": torch.cat(seq_idx)[None],
            "cu_seqlens": torch.cat([*offsets, torch.tensor([total], dtype=torch.int32)]).to(torch.int32),
            "max_len": max(b.max_len for b in blocks),
        }
    shifted = out["labels"][0, 1:]
    index = torch.nonzero(shifted != IGNORE).flatten()
    out["target_index"] = index
    out["target_ids"] = shifted[index]
    return out


def to_device(batch: dict[str, Any], device: str | torch.device) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ---------------------------------------------------------------------------------------------
# Streaming this rank's shard


_END = object()


def _iterate_unsplit(ds: Any) -> Iterator[dict[str, Any]]:
    """Iterate an HF streaming dataset inside a DataLoader worker without its own per-worker split.

    `datasets` hands each DataLoader worker a share of the *files* when it sees worker info; our shard is already
    per (rank, worker), so a second split would leave all but one worker of a one-file dataset empty. The check
    happens once, when iteration starts: hide the worker info for that first step only.
    """
    it = iter(ds)
    import torch.utils.data as tud

    real = tud.get_worker_info
    if real() is not None:
        tud.get_worker_info = lambda: None
    try:
        first = next(it, _END)
    finally:
        tud.get_worker_info = real
    if first is _END:
        return
    yield first
    yield from it


@dataclass
class DataSource:
    """Where the examples come from and how to cut them: everything a (rank, worker) stream needs."""

    path: Path | None
    dataset_id: str | None
    revision: str | None
    split: str
    messages_field: str
    seq_len: int
    pad_id: int
    packing: bool
    seed: int
    epochs: float | None  # None = repeat until the trainer stops (train.max_steps)
    row_format: RowFormat | None = None  # None = conversations in messages_field (dataset.format=auto)
    packing_strategy: str = "wrapped"
    # Rows held out for evaluation (runner.train.evaluation): a training stream drops them, an eval stream
    # (heldout=True) keeps only them.
    eval_fraction: float = 0.0
    heldout: bool = False


class BlockStream(torch.utils.data.IterableDataset):
    """This rank's packed blocks; under a DataLoader each worker packs its own disjoint shard.

    Blocks of several workers arrive interleaved in the DataLoader's fixed round-robin order, so the stream is
    deterministic for a given number of workers.
    """

    def __init__(self, source: DataSource, tokenizer: Any, rank: int, world_size: int):
        super().__init__()
        self.source = source
        self.tokenizer = tokenizer
        self.rank = rank
        self.world_size = world_size

    def _shard(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * workers + worker, self.world_size * workers

    def _rows(self, epoch: int) -> Iterator[dict[str, Any]]:
        s = self.source
        shard_rank, shard_world = self._shard()
        ds = load_examples(s.path, s.dataset_id, s.revision, s.split, shard_rank, shard_world, s.seed, epoch)
        if not s.eval_fraction:
            yield from _iterate_unsplit(ds)
            return
        from runner.data.formats import is_heldout

        for row in _iterate_unsplit(ds):
            if is_heldout(row, s.seed, s.eval_fraction) == s.heldout:
                yield row

    def __iter__(self) -> Iterator[PackedBlock]:
        s = self.source
        markers = has_generation_markers(self.tokenizer)
        read = RowReader(s.row_format or RowFormat(columns=() if s.messages_field == "messages"
                                                   else (("messages", s.messages_field),)))

        def examples() -> Iterator[Example]:
            if s.epochs is None:
                epochs: Iterable[int] = itertools.count()
                whole, frac = math.inf, 0.0
            else:
                whole, frac = math.floor(s.epochs), s.epochs - math.floor(s.epochs)
                epochs = range(math.ceil(s.epochs))
            shard_rows: int | None = None
            for epoch in epochs:
                rows = self._rows(epoch)
                if epoch >= whole and frac:
                    # The last, fractional epoch: the same share of this shard's rows, counted on a full pass.
                    if shard_rows is None:
                        shard_rows = sum(1 for _ in self._rows(epoch))
                    rows = itertools.islice(rows, round(frac * shard_rows))
                n = 0
                for row in rows:
                    n += 1
                    yield tokenize_sample(self.tokenizer, read(row), markers)
                shard_rows = n if epoch < whole else shard_rows

        yield from pack(examples(), s.seq_len, s.pad_id, packing=s.packing, strategy=s.packing_strategy,
                        seed=s.seed)
