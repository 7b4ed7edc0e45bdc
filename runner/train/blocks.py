"""Packed blocks: exactly seq_len tokens holding whole or split documents, with the signals that keep them apart."""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100

PAD_SEGMENT = 128
"""Padding is cut into segments of at most this many tokens, each attending only to itself. As one segment, the
padding of a partly filled block (the last of each bfd buffer, the end of the data, a rank's empty block) cost
attention work in the square of its length: 30k pad tokens of a 32k block took longer than a block of real
conversations. Cut, it costs in proportion to its length, like the rest of the block; 128 is one attention tile."""


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
    # What the stream consumed to produce this block, so statistics add up wherever the block was built
    # (a DataLoader worker's counters never reach the training process otherwise).
    examples: int = 0
    skipped_no_assistant: int = 0
    split_documents: int = 0
    # Tokens of each document segment in this block (a whole document, or the piece of a split one held here): the
    # statistics of what was trained on follow the blocks drawn (a block built but never drawn adds none).
    doc_lengths: tuple[int, ...] = ()
    doc_splits: int = 0  # of those segments, the pieces of documents split across blocks

    def document_segment_lengths(self) -> list[int]:
        """Lengths of the segments that hold real tokens (documents or their pieces), padding left out."""
        cu = self.cu_seqlens.tolist()
        return [b - a for a, b in zip(cu, cu[1:]) if b <= self.real_tokens]

    @property
    def doc_len_sq(self) -> int:
        """Σ L² over the document segments (padding left out): the causal attention work that MFU counts."""
        return sum(n * n for n in self.document_segment_lengths())

    @property
    def target_tokens(self) -> int:
        # A label at t is the target of the prediction made at t-1: count labels after the first position.
        return int((self.labels[1:] != IGNORE).sum())

    def pin_memory(self) -> PackedBlock:
        for name in ("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"):
            setattr(self, name, getattr(self, name).pin_memory())
        return self


def make_block(ids: list[int], mask: list[bool], starts: list[int], seq_len: int, pad_id: int) -> PackedBlock:
    """Build one block from ids (≤ seq_len, padded here), their loss mask and the offsets where documents begin."""
    real = len(ids)
    if real > seq_len or len(mask) != real:
        raise ValueError(f"a block takes at most {seq_len} ids with one mask flag each, got {real} ids and "
                         f"{len(mask)} flags")
    pad = seq_len - real
    ids_t = torch.tensor(ids + [pad_id] * pad, dtype=torch.long)
    labels = ids_t.clone()
    labels[~torch.tensor(mask + [False] * pad, dtype=torch.bool)] = IGNORE
    bounds = [0, *sorted({s for s in starts if 0 < s < real}), real] if real else [0]
    if pad:  # padding: segments of its own, so it attends only to itself (PAD_SEGMENT)
        bounds += [*range(real + PAD_SEGMENT, seq_len, PAD_SEGMENT), seq_len]
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


def carry_counts(block: PackedBlock, pending: dict[str, int]) -> PackedBlock:
    """Move what the stream consumed since the last block (examples, skipped, split documents) onto this block and
    zero the counts, so statistics add up wherever the block is built or consumed."""
    block.examples, block.skipped_no_assistant, block.split_documents = (
        pending["examples"], pending["skipped_no_assistant"], pending["split_documents"])
    pending.update(examples=0, skipped_no_assistant=0, split_documents=0)
    return block
