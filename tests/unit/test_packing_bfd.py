"""Packing strategies: bfd keeps conversations whole, both strategies give each document's own loss, the preview
the estimator and the wizard read agrees with the packer."""

from __future__ import annotations

import math
import random

import pytest
import torch

from runner.train.data import PackStats, collate, make_block, pack
from runner.train.loss import full_loss_sum
from runner.data.packing import BFD_BUFFER_BLOCKS, bfd_layout, packing_preview
from tests.unit.test_packing import _assert_equal, _loss_and_grads, _per_document, _qwen3


def _docs(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        prompt = n // 3
        out.append((torch.randint(0, 128, (n,), generator=g).tolist(), [False] * prompt + [True] * (n - prompt)))
    return out


def _segments(block):
    """(token ids of each document segment) of a block, padding left out."""
    cu = block.cu_seqlens.tolist()
    return [block.input_ids[a:b].tolist() for a, b in zip(cu[:-1], cu[1:]) if b <= block.real_tokens]


def test_bfd_never_splits_a_conversation_shorter_than_the_block():
    rng = random.Random(3)
    lengths = [rng.randint(5, 120) for _ in range(300)]
    docs = _docs(lengths)
    stats = PackStats()
    blocks = list(pack(docs, 128, 0, stats, strategy="bfd"))
    assert stats.split_documents == 0 and stats.examples == len(docs)
    segments = [tuple(s) for b in blocks for s in _segments(b)]
    # Every conversation is exactly one segment of one block, whole: none cut, none lost, none repeated.
    assert sorted(segments) == sorted(tuple(ids) for ids, _ in docs)
    wrapped = PackStats()
    list(pack(docs, 128, 0, wrapped, strategy="wrapped"))
    assert wrapped.split_documents > 0  # the same data wrapped cuts conversations at block ends
    # Lengths up to nearly a block leave room no other conversation fits: 92.6% here (96.8% with one buffer).
    assert stats.to_dict()["packing_efficiency"] > 0.9


def test_bfd_is_best_fit_decreasing():
    # Sorted 7, 5, 4, 3, 1 into blocks of 8: 7 opens A; 5 opens B; 4 opens C; 3 fits B exactly (best fit);
    # 1 fits A exactly.
    layout = bfd_layout([4, 7, 1, 5, 3], 8)
    assert [[i for i, _, _ in b] for b in layout] == [[1, 2], [3, 4], [0]]


def test_bfd_splits_a_conversation_longer_than_the_block_into_pieces_counted_once():
    docs = _docs([20, 300, 50])
    stats = PackStats()
    blocks = list(pack(docs, 128, 0, stats, strategy="bfd"))
    assert stats.split_documents == 1
    segments = [s for b in blocks for s in _segments(b)]
    long_doc = docs[1][0]
    pieces = [long_doc[0:128], long_doc[128:256], long_doc[256:300]]
    assert all(p in segments for p in pieces)  # split from its start into block-sized pieces, nothing dropped
    assert sum(len(s) for s in segments) == 370


def test_bfd_stream_is_deterministic_and_bounded():
    rng = random.Random(5)
    docs = _docs([rng.randint(5, 60) for _ in range(2000)])
    a = [b.input_ids.tolist() for b in pack(docs, 64, 0, strategy="bfd")]
    b = [b.input_ids.tolist() for b in pack(iter(docs), 64, 0, strategy="bfd")]
    assert a == b

    consumed = 0

    def counting():
        nonlocal consumed
        for d in docs:
            consumed += 1
            yield d

    first = next(pack(counting(), 64, 0, strategy="bfd"))
    assert first.real_tokens > 0
    # The first block leaves once one buffer (BFD_BUFFER_BLOCKS blocks of tokens) is read, not the whole stream.
    assert sum(len(d[0]) for d in docs[:consumed]) < (BFD_BUFFER_BLOCKS + 1) * 64 < sum(len(d[0]) for d in docs)


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_packed_blocks_equal_documents_one_by_one(strategy):
    """Summed over the blocks a strategy makes, the loss and gradients are those of the documents one by one."""
    model = _qwen3("sdpa")
    # Wrapped: lengths that meet the block ends exactly (40 + 24 = 64, 30 + 34 = 64), so no document is cut;
    # bfd must pair them up itself from a shuffled order.
    lengths = [40, 30, 24, 34, 17, 9] if strategy == "bfd" else [40, 24, 30, 34, 17, 9]
    docs = _docs(lengths, seed=2)
    stats = PackStats()
    blocks = list(pack(docs, 64, 0, stats, strategy=strategy))
    assert stats.split_documents == 0 and len(blocks) == 3

    def packed():
        return sum(full_loss_sum(model, collate([b])) for b in blocks)

    _assert_equal(_loss_and_grads(model, packed), _per_document(model, docs), f"{strategy} blocks")


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_preview_agrees_with_the_packer(strategy):
    rng = random.Random(11)
    lengths = [rng.randint(3, 300) for _ in range(700)]
    docs = [([1] * n, [True] * n) for n in lengths]
    stats = PackStats()
    blocks = list(pack(docs, 256, 0, stats, strategy=strategy))
    p = packing_preview(lengths, 256, strategy)
    assert p["blocks"] == len(blocks)
    assert p["split_documents"] == stats.split_documents
    assert p["packing_efficiency"] == stats.to_dict()["packing_efficiency"]
    assert p["real_tokens"] == stats.real_tokens


def test_preview_rejects_an_unknown_strategy():
    with pytest.raises(ValueError, match="bfd, wrapped"):
        packing_preview([10], 64, "first_fit")


def test_make_block_keeps_bfd_documents_apart():
    block = make_block([1, 2, 3, 4, 5], [True] * 5, [0, 2], 8, 0)
    assert block.position_ids.tolist()[:5] == [0, 1, 0, 1, 2]


@pytest.mark.parametrize(("strategy", "packing"), [("bfd", True), ("wrapped", True), ("wrapped", False)])
def test_document_statistics_count_what_the_blocks_trained(strategy, packing):
    """Each block carries its document segments (whole documents, or the pieces of split ones it holds): the
    statistics of any blocks drawn add up to their real tokens, and a run that trained only the later pieces of long
    conversations still counts them (it counted 0 documents for 4,629 real tokens trained when a document was
    counted only where it began, at its whole length)."""
    from collections import Counter

    rng = random.Random(5)
    lengths = [rng.randint(5, 300) for _ in range(400)]  # some longer than the block: split
    docs = _docs(lengths)
    docs[7] = (docs[7][0], [False] * len(docs[7][0]))  # skipped: no target
    kept = lengths[:7] + lengths[8:]
    stats = PackStats()
    blocks = list(pack(docs, 128, 0, stats, packing=packing, strategy=strategy))
    for b in blocks:
        assert list(b.doc_lengths) == [len(s) for s in _segments(b)]
    summary = stats.to_dict()["doc_tokens"]
    assert summary["tokens"] == sum(kept) == stats.real_tokens
    assert summary["count"] == sum(len(_segments(b)) for b in blocks)
    # Pieces: a document of n > 128 tokens is at least ceil(n / 128) of them (wrapped may cut a shorter one too).
    assert summary["split"] >= sum(math.ceil(n / 128) for n in kept if n > 128)
    if strategy == "bfd" or not packing:
        assert summary["split"] == sum(math.ceil(n / 128) for n in kept if n > 128)
        assert summary["count"] == sum(math.ceil(n / 128) for n in kept)
    # Blocks holding no document's first token (the middle of a long conversation) trained real tokens: they count.
    middles = [b for b in blocks if b.doc_lengths and all(
        tuple(s[:5]) not in {tuple(d[0][:5]) for d in docs} for s in _segments(b))]
    assert middles
    some = PackStats()
    for b in middles:
        some.add(b)
    part = some.to_dict()["doc_tokens"]
    assert part["count"] == sum(len(b.doc_lengths) for b in middles) > 0
    assert part["tokens"] == some.real_tokens > 0 and part["split"] == part["count"]
    s = sorted(n for b in middles for n in b.doc_lengths)  # nearest rank over the segments
    assert part == {"count": len(s), "tokens": sum(s), "mean": round(sum(s) / len(s), 1),
                    "p50": s[math.ceil(0.5 * len(s)) - 1], "p90": s[math.ceil(0.9 * len(s)) - 1], "max": s[-1],
                    "split": len(s)}
    assert Counter(n for b in blocks for n in b.doc_lengths) == stats.doc_lengths


def test_document_statistics_merge_over_ranks_exactly():
    from collections import Counter

    from runner.data import doclengths

    rng = random.Random(2)
    ranks = [[rng.randint(1, 40_000) for _ in range(n)] for n in (300, 1, 57)]
    data = [{"doc_tokens": doclengths.summary(Counter(r)), "doc_lengths": doclengths.histogram(Counter(r))}
            for r in ranks]
    assert doclengths.merged_summary(data) == doclengths.summary(Counter(n for r in ranks for n in r))
    # Past EXACT_BINS distinct lengths a rank's histogram is rounded (under 0.1%); count, tokens and max stay exact.
    many = Counter(range(1, 3 * doclengths.EXACT_BINS))
    merged = doclengths.merged_summary([{"doc_tokens": doclengths.summary(many),
                                         "doc_lengths": doclengths.histogram(many)}])
    exact = doclengths.summary(many)
    assert len(doclengths.histogram(many)) < len(many) / 2
    assert {k: merged[k] for k in ("count", "tokens", "mean", "max")} == {k: exact[k] for k in ("count", "tokens",
                                                                                                   "mean", "max")}
    assert abs(merged["p90"] - exact["p90"]) / exact["p90"] < 1e-3


def test_trl_rows_drawn_follow_the_trainers_order():
    from runner.train.trl_data import EpochOrder, draws

    assert draws(5, None, 0) == {i: 1 for i in range(5)}  # counted in epochs: the rows hold every epoch
    assert draws(5, 3, 0) == {0: 1, 1: 1, 2: 1}  # the first pass is stream order
    order = EpochOrder(5, 0)
    order.set_epoch(1)
    second = list(order)
    assert draws(5, 7, 0) == {**{i: 1 for i in range(5)}, **{i: 2 for i in second[:2]}}


def test_bfd_blocks_leave_each_buffer_in_a_seeded_order_not_longest_first():
    # Opening order puts a buffer's longest conversations in its first blocks; a run (and a benchmark timing its
    # first steps) would see the length tail first, every buffer. The order is drawn from the seed.
    rng = random.Random(7)
    docs = _docs([rng.randint(5, 128) for _ in range(600)])
    opening = [max(len(docs[i][0]) for i, _, _ in b) for b in bfd_layout([len(d[0]) for d in docs], 128)]
    assert opening == sorted(opening, reverse=True)

    def buffers(blocks):
        """The longest document of each block, buffer by buffer (the consumed counts ride on a buffer's first)."""
        out = []
        for b in blocks:
            if b.examples:
                out.append([])
            out[-1].append(max(b.doc_lengths, default=0))
        return out

    a = list(pack(docs, 128, 0, strategy="bfd", seed=0))
    c = list(pack(docs, 128, 0, strategy="bfd", seed=1))
    assert [x.input_ids.tolist() for x in a] == [x.input_ids.tolist() for x in pack(docs, 128, 0, strategy="bfd")]
    assert [x.input_ids.tolist() for x in a] != [x.input_ids.tolist() for x in c]
    assert sorted(x.input_ids.tolist() for x in a) == sorted(x.input_ids.tolist() for x in c)
    for longest in buffers(a)[:-1] + buffers(c)[:-1]:
        assert len(longest) > 20 and longest != sorted(longest, reverse=True)
        # The first half of a buffer holds no more of its long conversations than the second (within chance).
        half = len(longest) // 2
        assert sum(longest[:half]) < 1.25 * sum(longest[half:2 * half])
