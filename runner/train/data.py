"""SFT data: stream this rank's shard, tokenise with an assistant-only loss mask, pack into exact-length blocks.

Rules, in the order the data meets them:

* Sharding: every (rank, DataLoader worker) stream reads a disjoint shard, `split_dataset_by_node` over
  rank * workers + worker of world * workers (the same for hub datasets and local files). The order is
  deterministic for a given seed, world size and `train.data_workers`, which is what resume relies on.
* Rows: `runner.data.formats` reads each row in the dataset's format (messages, ShareGPT, alpaca, prompt/completion,
  text; detected on the stream's first row unless dataset.format says) as messages with a trained flag each, or
  as text segments.
* Tokenisation: templates with `{% generation %}` markers give ids and mask in one render when exactly the
  assistant turns train; otherwise turns are bracketed one by one (the prefix method, below); text is tokenised
  as it is, ending in EOS. Examples without a trained token are skipped and counted (`skipped_no_assistant`).
* Packing (`train.packing=true`, `train.packing_strategy=wrapped`; `bfd` keeps conversations whole and is
  described in runner.train.packing): examples are concatenated and cut into blocks of exactly seq_len tokens. Inside
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
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runner.data import doclengths
from runner.data.formats import RowFormat, RowReader, Sample
from runner.train.blocks import IGNORE, PackedBlock, carry_counts, empty_block, make_block  # noqa: F401 - re-exported
Example = tuple[list[int], list[bool]]


# ---------------------------------------------------------------------------------------------
# Tokenisation


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation: bool = False) -> list[int]:
    return _ids(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=True,
                                              return_dict=False))


def tokenize_sft(tokenizer: Any, messages: list[dict[str, Any]], trained: list[bool] | None = None,
                 tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation and a mask that is True only on the trained turns' responses (any template).

    `trained` flags the turns that carry the loss (default: every assistant turn). Each is bracketed by two
    renders: the conversation up to just before it with the generation prompt, and the conversation through it.
    The response is what lies between where each render stops agreeing with the full conversation: measuring
    agreement (a common prefix) rather than render length keeps the mask right for templates whose generation
    prompt adds tokens the full render lacks (a prefilled `<think>`). The generation prompt itself is never a
    target: the model is given it at inference time, also when the full render spells it differently
    (`_align_to_header`).
    """
    if trained is None:
        trained = [m.get("role") == "assistant" for m in messages]
    full = _render(tokenizer, messages, tools)
    mask = [False] * len(full)
    for i, _ in enumerate(messages):
        if not trained[i]:
            continue
        prefix = _render(tokenizer, messages[:i], tools, generation=True) if i else []
        through = _render(tokenizer, messages[: i + 1], tools)
        start, end = _common_prefix(prefix, full), _common_prefix(through, full)
        if start < len(prefix):
            start = _align_to_header(tokenizer, full, start, end, prefix, _render(tokenizer, messages[:i], tools))
        for j in range(start, end):
            mask[j] = True
    return full, mask


HEADER_SLACK = 4  # tokens the full render may add before the turn header that the generation prompt lacks


def _align_to_header(tokenizer: Any, full: list[int], start: int, end: int, prompt: list[int],
                     before: list[int]) -> int:
    """Where the response starts when the generation prompt is not a prefix of the full render.

    Templates that put a separator before each turn header (a newline between turns) render the header
    differently in the full conversation than at the end of the generation prompt, so agreement stops before the
    header and the header would be trained. Find the generation prompt's header (less leading and trailing
    whitespace tokens) just after `start` in the full render and start after it and its trailing whitespace.
    A prefilled generation prompt (`<think>` the full render lacks) agrees through its header: nothing to find.
    """
    header = prompt[_common_prefix(before, prompt):]
    blank = [not tokenizer.decode([t]).strip() for t in header]
    lo, hi = 0, len(header)
    while lo < hi and blank[lo]:
        lo += 1
    while hi > lo and blank[hi - 1]:
        hi -= 1
    core = header[lo:hi]
    if not core:
        return start
    for p in range(start, min(end - len(core), start + HEADER_SLACK + lo) + 1):
        if full[p:p + len(core)] == core:
            q = p + len(core)
            for _ in range(len(header) - hi):  # the header's trailing whitespace, as the full render spells it
                if q < end and not tokenizer.decode([full[q]]).strip():
                    q += 1
            return q
    return start


PROBE = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."},
         {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Hi."}]


def generation_prompt_is_prefix(tokenizer: Any) -> bool:
    """Whether the template's generation prompt is a prefix of its full render (when not, the turn header is
    found by `_align_to_header`, and the preview says so)."""
    prompt = _render(tokenizer, PROBE[:3], None, generation=True)
    return _render(tokenizer, PROBE, None)[:len(prompt)] == prompt


def tokenize_sft_generation(tokenizer: Any, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[bool]]:
    """Fast path for templates with `{% generation %}` markers: one render gives ids and mask."""
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


def tokenize_text(tokenizer: Any, segments: list[tuple[str, bool]]) -> tuple[list[int], list[bool]]:
    """Plain text segments (text, trained?) as one document ending in EOS (TRL's standard prompt/completion and
    language-modeling rows); a segment's mask starts where the tokenisation of the text so far stops agreeing
    with the text before it, so a token merged across a boundary belongs to the later segment."""
    ids: list[int] = []
    mask: list[bool] = []
    text = ""
    for piece, trained in segments:
        text += piece
        cur = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        keep = _common_prefix(ids, cur)
        ids, mask = cur, mask[:keep] + [trained] * (len(cur) - keep)
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
        mask.append(bool(segments) and segments[-1][1])
    return ids, mask


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and bool(_GENERATION_TAG.search(template))


def tokenize_sample(tokenizer: Any, sample: Sample, markers: bool | None = None) -> tuple[list[int], list[bool]]:
    """One row (runner.data.formats.Sample) as ids and loss mask. Generation markers mark every assistant turn, so they
    serve only when exactly the assistant turns train; any other choice of turns is bracketed turn by turn."""
    if sample.segments is not None:
        return tokenize_text(tokenizer, sample.segments)
    messages = sample.messages or []
    if markers is None:
        markers = has_generation_markers(tokenizer)
    if markers and sample.trained == [m.get("role") == "assistant" for m in messages]:
        return tokenize_sft_generation(tokenizer, messages, sample.tools)
    return tokenize_sft(tokenizer, messages, sample.trained, sample.tools)


def _ids(x: Any) -> list[int]:
    # apply_chat_template returns a list, or a BatchEncoding in some versions even with return_dict=False.
    if isinstance(x, dict) or hasattr(x, "input_ids"):
        x = x["input_ids"]
    return list(x)


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
    `strategy="bfd"` packs whole conversations by best-fit decreasing instead (runner.train.packing), its blocks
    in an order drawn from `seed`.

    Each block carries what was consumed to build it (examples, skipped, split documents); `stats`, when
    given, is updated as blocks are yielded.
    """
    if packing and strategy == "bfd":
        from runner.train.packing import pack_bfd

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


def load_examples(dataset_path: Path | None, dataset_id: str | None, revision: str | None, split: str,
                  shard_rank: int, shard_world: int, seed: int, epoch: int = 0, shuffle_buffer: int = 1000):
    """A streamed, shuffled, disjoint shard of the dataset for one (rank, dataloader worker)."""
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    if dataset_path is not None and dataset_path.is_dir():
        ds = load_dataset(str(dataset_path), split=split, streaming=True)
    elif dataset_path is not None:
        ds = load_dataset(local_builder(dataset_path), data_files=str(dataset_path), split="train", streaming=True)
    else:
        ds = load_dataset(dataset_id, revision=revision, split=split, streaming=True)
    ds = split_dataset_by_node(ds, rank=shard_rank, world_size=shard_world)
    if shuffle_buffer > 1:
        ds = ds.shuffle(seed=seed + epoch, buffer_size=shuffle_buffer)
    return ds


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


LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def local_builder(path: Path) -> str:
    """The `datasets` builder of a local file; a .jsonl.gz / .json.gz / .csv.gz takes its inner format's (the
    builder decompresses it)."""
    from runner.data.datafiles import data_suffix

    builder = LOCAL_BUILDERS.get(data_suffix(path))
    if builder is None:
        raise ValueError(f"unsupported dataset file type {path.suffix!r} (expected one of {', '.join(LOCAL_BUILDERS)},"
                         f" or .gz of a text one)")
    return builder


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
