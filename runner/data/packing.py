"""The best-fit-decreasing layout that keeps conversations whole, and a packing preview from document lengths.

Two strategies fill the exact `train.seq_len` blocks the ranks build (runner.train.data.pack,
`train.packing_strategy`):

* `wrapped`: documents are concatenated in stream order and cut every seq_len tokens; a document that does not
  fit in the room left continues in the next block without the context before the cut (data.pack).
* `bfd`: best-fit decreasing within a bounded buffer, as TRL's `packing_strategy="bfd"`. Documents are read in
  stream order into a buffer of BFD_BUFFER_BLOCKS blocks' worth of tokens; the buffer is sorted by length (longest
  first, ties in stream order) and each document goes into the open block with the least room that still holds
  it, or opens a new one. A document never crosses a block boundary, so every conversation keeps its prompt in
  context. The buffer's blocks then leave in a seeded random order (`shuffle_blocks`): in opening order the
  first blocks of every buffer would hold its longest conversations and the last its shortest, so training (and
  a benchmark that times the first steps) would see the length tail first, every buffer.
  Rule for a conversation longer than seq_len: it is split into seq_len-token pieces from its start (each piece a
  segment of its own, whose first token is not a target, as in `wrapped`); the pieces are packed like documents
  and the conversation is counted once in `split_documents`. Nothing is truncated away.

The buffer is filled in stream order, sorted stably and its blocks shuffled by a generator seeded with the run's
seed and the buffer's number, so the blocks are a pure function of the stream and the seed: resume and replay
skip and see the same blocks.
"""

from __future__ import annotations

import math
import random
from typing import Any

STRATEGIES = ("bfd", "wrapped")
Layout = list[list[tuple[int, int, int]]]  # blocks, each a list of (document index, start, end)
BFD_BUFFER_BLOCKS = 64
"""Blocks' worth of tokens that one bfd buffer holds before it is packed: large enough that the sort finds fits,
small enough that a block waits on few documents. docs/data.md gives the share of real tokens it packs on the
embedded data against other buffer sizes and `wrapped`."""


def pieces(length: int, seq_len: int) -> list[tuple[int, int]]:
    """(start, end) pieces of a document: whole when it fits, else seq_len-token pieces from its start."""
    if length <= seq_len:
        return [(0, length)]
    return [(a, min(a + seq_len, length)) for a in range(0, length, seq_len)]


def bfd_layout(lengths: list[int], seq_len: int) -> Layout:
    """Blocks as lists of (document index, start, end), by best-fit decreasing over these documents.

    Pure and deterministic: the sort is stable (ties keep input order) and blocks are returned in opening order.
    """
    items = [(i, a, b) for i, n in enumerate(lengths) for a, b in pieces(n, seq_len)]
    items.sort(key=lambda it: -(it[2] - it[1]))  # stable: equal lengths keep stream order
    blocks: Layout = []
    room: list[int] = []
    # Blocks grouped by room left: the best fit for a piece of n tokens is the open block with the smallest
    # room >= n. A list of rooms scanned linearly is fast enough for buffers of tens of blocks.
    for it in items:
        n = it[2] - it[1]
        best, best_room = -1, seq_len + 1
        for k, r in enumerate(room):
            if n <= r < best_room:
                best, best_room = k, r
                if r == n:
                    break
        if best < 0:
            blocks.append([it])
            room.append(seq_len - n)
        else:
            blocks[best].append(it)
            room[best] -= n
    for block in blocks:
        block.sort(key=lambda it: (it[0], it[1]))  # documents inside a block in stream order
    return blocks


def shuffle_blocks(layout: Layout, seed: int, buffer: int) -> Layout:
    """The layout's blocks in a random order drawn from (seed, buffer number): the same for the same run and
    buffer, different from one buffer to the next."""
    order = list(layout)
    random.Random(f"bfd:{seed}:{buffer}").shuffle(order)
    return order


def packing_preview(lengths: list[int], seq_len: int, strategy: str = "bfd",
                    buffer_blocks: int = BFD_BUFFER_BLOCKS) -> dict[str, Any]:
    """What packing these document lengths (tokens, in stream order) into seq_len blocks gives, without tokens.

    Returns {strategy, documents, blocks, real_tokens, packing_efficiency (real / block tokens),
    split_documents, tokens_per_block}. For the estimator: the number of blocks (hence steps) a data set makes,
    and the share of each block that is real tokens.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"packing strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    lengths = [int(n) for n in lengths if n > 0]
    real = sum(lengths)
    split = 0
    if strategy == "wrapped":
        blocks = math.ceil(real / seq_len) if real else 0
        pos = 0
        for n in lengths:
            # Split when it does not end inside the block it starts in (ending exactly at a cut is whole).
            if (pos % seq_len) + n > seq_len:
                split += 1
            pos += n
    else:
        blocks, start, filled = 0, 0, 0
        for k, n in enumerate(lengths):
            split += n > seq_len
            filled += n
            if filled >= buffer_blocks * seq_len or k == len(lengths) - 1:
                blocks += len(bfd_layout(lengths[start:k + 1], seq_len))
                start, filled = k + 1, 0
    return {"strategy": strategy, "documents": len(lengths), "blocks": blocks, "real_tokens": real,
            "packing_efficiency": round(real / (blocks * seq_len), 4) if blocks else None,
            "split_documents": split, "tokens_per_block": round(real / blocks, 1) if blocks else None}
