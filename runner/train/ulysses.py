"""Ulysses sequence parallelism: a block's tokens split over the ranks of a group, attention exchanged.

Each rank of a sequence-parallel group holds a contiguous slice of the block (`shard_block`): its tokens, their
global positions (so rotary embeddings are the unsplit block's) and their targets, shifted on the whole block
before it is cut (the last token of a slice predicts the first of the next). Everything but attention maps each
token on its own. Attention (`ulysses_attention`, registered as attn_implementation "ulysses") exchanges heads for
sequence with one all-to-all: each rank then holds the whole block for 1/N of the heads, attends with the block's
own document boundaries and causality (from the global positions, `global_positions`), and a second all-to-all
gives every rank its tokens back with all heads. The all-to-all carries gradients (its backward is the inverse
exchange), so parameter gradients are each rank's share of the block's: summed over the group they are the block's.

The native engine runs it with `hardware.sequence_parallel` = N (`SequenceParallel`): N consecutive ranks form a
group that reads the same blocks (the data is sharded over the rank // N), each rank keeps its slice of every
micro-batch and counts its slice's targets, so the step's target count, the loss and the gradients are the
blocks' once, whatever N (tests/dist/test_sequence_parallel.py). train.seq_len must be a multiple of N (refused
otherwise, not padded: a padded block would change what a step trains on).

The attention after the exchange is torch's SDPA with a dense document mask over the whole row (micro_batch ×
seq_len tokens squared, one byte each, built once per micro-batch and counted by the estimator): right for CPU
and short blocks. Long GPU blocks need the varlen kernel over the block's cu_seqlens instead, which is not wired.

Gated-delta (and other recurrent) layers carry state along the sequence and cannot be split this way; nor can
attention whose heads do not divide over the group: `sequence_parallel_problems` says so before anything runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runner.errors import Problem
from runner.decide.rules import ULYSSES
_STATE: dict[str, Any] = {"group": None, "positions": None, "mask": None}


def _a2a(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-to-all along dim 0 (one chunk per rank), with autograd."""
    from torch.distributed.nn.functional import all_to_all_single

    x = x.contiguous()  # the collective reads and writes flat memory: both buffers must be in row-major order
    return all_to_all_single(torch.empty_like(x), x, group=group)


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """(B, H, s, D) on each of n ranks (s = S / n, rank r holding tokens r·s ...) → (B, H / n, S, D): rank r's
    heads r·H/n ... over the whole block."""
    n = dist.get_world_size(group)
    b, h, s, d = x.shape
    chunks = x.reshape(b, n, h // n, s, d).transpose(0, 1)  # (n: head chunk, B, H/n, s, D)
    got = _a2a(chunks, group)  # (n: sequence chunk, B, H/n, s, D)
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The inverse of seq_to_heads: (B, H / n, S, D) → (B, H, s, D)."""
    n = dist.get_world_size(group)
    b, hn, seq, d = x.shape
    chunks = x.reshape(b, hn, n, seq // n, d).permute(2, 0, 1, 3, 4)  # (n: sequence chunk, B, H/n, s, D)
    got = _a2a(chunks, group)  # (n: head chunk, B, H/n, s, D)
    return got.transpose(0, 1).reshape(b, n * hn, seq // n, d)


def document_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """(B, 1, S, S) boolean: token i sees token j when j ≤ i within one document (a document starts where the
    position restarts at 0)."""
    doc = (positions == 0).cumsum(-1)
    same = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(positions.shape[-1], positions.shape[-1], dtype=torch.bool, device=positions.device).tril()
    return (same & causal)[:, None]


def ulysses_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query (B, H, s, D), key/value (B, Hkv, s, D) of this rank's tokens; the
    local mask is ignored (the block's is built from the global positions). Returns (B, s, H, D)."""
    group = _STATE["group"]
    n = dist.get_world_size(group)
    h, hkv = query.shape[1], key.shape[1]
    if hkv % n:  # fewer KV heads than ranks: every rank gets the KV heads of its query heads
        key, value = (t.repeat_interleave(h // hkv, dim=1) for t in (key, value))
    q, k, v = (seq_to_heads(t, group) for t in (query, key, value))
    if _STATE["mask"] is None:  # one mask for every layer of the forward (each would keep its own for backward)
        _STATE["mask"] = document_causal_mask(_STATE["positions"])
    mask = _STATE["mask"]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                         enable_gqa=k.shape[1] != q.shape[1])
    return heads_to_seq(out, group).transpose(1, 2).contiguous(), None


def register_ulysses() -> None:
    """Make attn_implementation="ulysses" loadable by transformers (idempotent); it builds its own mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ULYSSES, ulysses_attention)
    AttentionMaskInterface.register(ULYSSES, lambda *args, **kwargs: None)


@contextlib.contextmanager
def global_positions(positions: torch.Tensor, group: dist.ProcessGroup | None) -> Iterator[None]:
    """Run the model's forward (and backward) with the whole block's positions (B, S) for its attention."""
    before = dict(_STATE)
    _STATE.update(group=group, positions=positions, mask=None)
    try:
        yield
    finally:
        _STATE.update(before)


def shard_block(input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor, rank: int,
                size: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s contiguous slice of a block (B, S): its tokens, global positions, and `targets`, the labels
    shifted on the whole block (the token each position predicts; -100 past the end), then cut."""
    seq = input_ids.shape[-1]
    if seq % size:
        raise ValueError(f"a block of {seq} tokens does not split over {size} sequence-parallel ranks")
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
    cut = slice(rank * seq // size, (rank + 1) * seq // size)
    return {"input_ids": input_ids[:, cut], "position_ids": position_ids[:, cut], "targets": targets[:, cut]}


def sequence_parallel_problems(config: Any, size: int) -> list[Problem]:
    """Why a model cannot split its blocks over `size` ranks with Ulysses (empty when it can)."""
    from runner.facts.families import family_of, text_config

    if size <= 1:
        return []
    fam, text = family_of(config), text_config(config)
    if fam.recurrent:
        return [Problem("hardware.sequence_parallel", f"{fam.model_type} has {fam.recurrent.replace('_', '-')} "
                        "layers, whose state runs along the whole sequence: a rank holding part of a block cannot "
                        "compute them", "use hardware.sequence_parallel=1")]
    heads = getattr(text, "num_attention_heads", 0) or 0
    if heads % size:
        return [Problem("hardware.sequence_parallel", f"{heads} attention heads do not divide over {size} ranks",
                        "use a sequence_parallel that divides the number of heads")]
    return []


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place in hardware.sequence_parallel: groups of `size` consecutive ranks share each block, and
    this rank is `index` in its group. size 1: every call is a no-op (the rank holds its whole blocks)."""

    size: int = 1
    index: int = 0
    group: dist.ProcessGroup | None = None

    @classmethod
    def build(cls, size: int, rank: int, world_size: int) -> SequenceParallel:
        if size <= 1:
            return cls()
        register_ulysses()
        mine = None
        # new_group is collective over the whole world: every rank creates every group, in the same order.
        for first in range(0, world_size, size):
            group = dist.new_group(list(range(first, first + size)))
            if first <= rank < first + size:
                mine = group
        return cls(size, rank % size, mine)

    def data_shard(self, rank: int, world_size: int) -> tuple[int, int]:
        """(shard, shards) of the data stream: a group's ranks read the same blocks."""
        return rank // self.size, world_size // self.size

    def shard(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A collated micro-batch cut to this rank's slice: its tokens, global positions and targets (the loss's
        target_index / target_ids over the slice), the row's positions kept whole for the attention mask."""
        if self.size <= 1:
            return batch
        part = shard_block(batch["input_ids"], batch["labels"], batch["position_ids"], self.index, self.size)
        targets = part["targets"].reshape(-1)
        index = torch.nonzero(targets != -100).flatten()
        return {"input_ids": part["input_ids"], "position_ids": part["position_ids"], "targets": part["targets"],
                "target_index": index, "target_ids": targets[index], "block_positions": batch["position_ids"]}

    def running(self, batch: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
        """The context a sharded micro-batch's forward and backward run in (recomputed layers attend again)."""
        if self.size <= 1:
            return contextlib.nullcontext()
        return global_positions(batch["block_positions"], self.group)

    def targets(self, batch: dict[str, Any]) -> int:
        """Target tokens of this rank's slice: summed over a group, the block's, counted once."""
        return int(batch["target_index"].numel())

    def real_tokens(self, lengths: list[int], seq_len: int) -> int:
        """Real (not padding) tokens of this rank's slice of a row of blocks holding lengths[i] real tokens each
        (padding ends a block): summed over a group, the row's."""
        row = len(lengths) * seq_len
        lo, hi = self.index * row // self.size, (self.index + 1) * row // self.size
        return sum(max(0, min(hi, i * seq_len + n) - max(lo, i * seq_len)) for i, n in enumerate(lengths))

    def share(self, total: int) -> int:
        """This rank's part of a count the group's ranks report together (the attention work of its blocks): the
        parts sum to `total`."""
        return total // self.size + (total % self.size if self.index == 0 else 0)
