"""SFT data: stream this rank's shard, tokenise with an assistant-only loss mask, pack into exact-length blocks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

IGNORE = -100


# ---------------------------------------------------------------------------------------------
# Tokenisation


def tokenize_sft(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation and a mask that is True only on assistant responses.

    Each assistant turn is bracketed by templating the conversation up to just before it (with the
    generation prompt) and through it: the tokens in between are the response. This works for any chat
    template whose renders are prefix-consistent, without `{% generation %}` markers.
    """
    full = _ids(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
    mask = [False] * len(full)
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        prefix = _ids(tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=True,
                                                    return_dict=False))
        through = _ids(tokenizer.apply_chat_template(messages[: i + 1], tokenize=True, return_dict=False))
        for j in range(len(prefix), min(len(through), len(full))):
            mask[j] = True
    return full, mask


def tokenize_sft_generation(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """Fast path for templates with `{% generation %}` markers: one render gives ids and mask."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


def has_generation_markers(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "{% generation %}" in template.replace("{%- generation %}", "{% generation %}")


def _ids(x: Any) -> list[int]:
    # apply_chat_template returns a list, or a BatchEncoding in some versions even with return_dict=False.
    if isinstance(x, dict) or hasattr(x, "input_ids"):
        x = x["input_ids"]
    return list(x)


# ---------------------------------------------------------------------------------------------
# Packing


@dataclass
class PackedBlock:
    """One block of exactly seq_len tokens holding whole or split documents, kept apart by these signals."""

    input_ids: torch.Tensor  # [seq_len] long
    labels: torch.Tensor  # [seq_len] long; -100 on prompts, padding and each segment's first token
    position_ids: torch.Tensor  # [seq_len] long; restarts at 0 in every segment
    seq_idx: torch.Tensor  # [seq_len] int32; segment index per token (gated-delta / linear-attention layers)
    cu_seqlens: torch.Tensor  # [segments + 1] int32; segment boundaries (varlen attention)
    max_len: int
    real_tokens: int  # tokens that are not padding

    @property
    def target_tokens(self) -> int:
        # A label at t is the target of the prediction made at t-1: count labels after the first position.
        return int((self.labels[1:] != IGNORE).sum())


def make_block(ids: list[int], mask: list[bool], starts: list[int], seq_len: int, pad_id: int) -> PackedBlock:
    """Build one block from ids (≤ seq_len, padded here), their loss mask and the offsets where documents begin."""
    real = len(ids)
    pad = seq_len - real
    ids_t = torch.tensor(ids + [pad_id] * pad, dtype=torch.long)
    labels = ids_t.clone()
    labels[~torch.tensor(mask + [False] * pad, dtype=torch.bool)] = IGNORE
    bounds = [0, *sorted({s for s in starts if 0 < s < real}), real]
    if pad:
        bounds.append(seq_len)  # padding is its own segment, so it attends only to itself
    position_ids = torch.empty(seq_len, dtype=torch.long)
    seq_idx = torch.empty(seq_len, dtype=torch.int32)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        position_ids[a:b] = torch.arange(b - a)
        seq_idx[a:b] = i
        labels[a] = IGNORE  # its causal target would come from the previous segment
    return PackedBlock(
        input_ids=ids_t,
        labels=labels,
        position_ids=position_ids,
        seq_idx=seq_idx,
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
        max_len=max(b - a for a, b in zip(bounds[:-1], bounds[1:])),
        real_tokens=real,
    )


def empty_block(seq_len: int, pad_id: int) -> PackedBlock:
    """An all-masked block: a rank that ran out feeds it so collectives stay matched; it adds no loss."""
    return make_block([], [], [], seq_len, pad_id)


@dataclass
class PackStats:
    examples: int = 0
    skipped_no_assistant: int = 0
    split_documents: int = 0
    blocks: int = 0
    real_tokens: int = 0
    target_tokens: int = 0
    padded_tokens: int = 0
    fingerprint: "hashlib._Hash" = field(default_factory=hashlib.sha256, repr=False)
    fingerprint_blocks: int = 0

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
        }


FINGERPRINT_BLOCKS = 4  # token ids of the first blocks of each rank are hashed into the data fingerprint


def pack(examples: Iterable[tuple[list[int], list[bool]]], seq_len: int, pad_id: int,
         stats: PackStats | None = None) -> Iterator[PackedBlock]:
    """Concatenate tokenised examples and cut exact seq_len blocks, as the reference notebook does.

    A document that crosses a block boundary continues in the next block as a new segment (positions restart,
    its first token there is not a target). The final partial block is padded rather than dropped.
    """
    stats = stats if stats is not None else PackStats()
    buf: list[int] = []
    loss: list[bool] = []
    starts: list[int] = []

    def emit(ids: list[int], mask: list[bool], st: list[int]) -> PackedBlock:
        block = make_block(ids, mask, st, seq_len, pad_id)
        stats.blocks += 1
        stats.real_tokens += block.real_tokens
        stats.padded_tokens += seq_len - block.real_tokens
        stats.target_tokens += block.target_tokens
        if stats.fingerprint_blocks < FINGERPRINT_BLOCKS:
            stats.fingerprint.update(block.input_ids.numpy().tobytes())
            stats.fingerprint_blocks += 1
        return block

    for ids, mask in examples:
        stats.examples += 1
        if not any(mask):
            stats.skipped_no_assistant += 1
            continue
        starts.append(len(buf))
        buf.extend(ids)
        loss.extend(mask)
        while len(buf) >= seq_len:
            if len(buf) > seq_len and seq_len not in starts:
                stats.split_documents += 1  # a document crosses the cut and continues as a new segment
            yield emit(buf[:seq_len], loss[:seq_len], starts)
            buf, loss = buf[seq_len:], loss[seq_len:]
            starts = [s - seq_len for s in starts if s - seq_len > 0]
    if buf:
        yield emit(buf, loss, starts)


def collate(blocks: list[PackedBlock]) -> dict[str, torch.Tensor]:
    """Stack micro_batch blocks as one packed row: documents stay apart because positions and cu_seqlens do."""
    if len(blocks) == 1:
        b = blocks[0]
        return {"input_ids": b.input_ids[None], "labels": b.labels[None], "position_ids": b.position_ids[None],
                "seq_idx": b.seq_idx[None], "cu_seqlens": b.cu_seqlens, "max_len": torch.tensor(b.max_len)}
    offsets = []
    total = 0
    for b in blocks:
        offsets.append(b.cu_seqlens[:-1] + total)
        total += b.input_ids.numel()
    seq_idx, base = [], 0
    for b in blocks:
        seq_idx.append(b.seq_idx + base)
        base += int(b.seq_idx.max()) + 1
    return {
        "input_ids": torch.cat([b.input_ids for b in blocks])[None],
        "labels": torch.cat([b.labels for b in blocks])[None],
        "position_ids": torch.cat([b.position_ids for b in blocks])[None],
        "seq_idx": torch.cat(seq_idx)[None],
        "cu_seqlens": torch.cat([*offsets, torch.tensor([total], dtype=torch.int32)]).to(torch.int32),
        "max_len": torch.tensor(max(b.max_len for b in blocks)),
    }


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


LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def local_builder(path: Path) -> str:
    builder = LOCAL_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(f"unsupported dataset file type {path.suffix!r} (expected one of {', '.join(LOCAL_BUILDERS)})")
    return builder
