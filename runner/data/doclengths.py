"""Document-length statistics of what a run trained on: each rank counts the lengths of the document segments in
the blocks it trained on (a whole tokenised conversation, or the piece of one split across blocks that lay in a
trained block) in a histogram, and the record merges the ranks'. Their tokens are the real tokens trained.

No torch: the record and `runner bench` read these from the ranks' end events.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

EXACT_BINS = 4096
"""Distinct lengths a rank reports exactly; past that, lengths of 1,024 tokens and more are rounded down to 10
significant bits (under 0.1% off), which bounds the histogram at a few thousand bins for any run."""


def histogram(lengths: Counter) -> list[list[int]]:
    """[[length, count], ...] by length: what a rank's end event carries for the merge."""
    if len(lengths) > EXACT_BINS:
        coarse: Counter = Counter()
        for n, c in lengths.items():
            drop = max(0, n.bit_length() - 10)
            coarse[n >> drop << drop] += c
        lengths = coarse
    return [[n, c] for n, c in sorted(lengths.items())]


def merge(histograms: Iterable[Iterable[Iterable[int]]]) -> Counter:
    out: Counter = Counter()
    for h in histograms:
        for n, c in h or ():
            out[int(n)] += int(c)
    return out


def summary(lengths: Counter, tokens: int | None = None, longest: int | None = None) -> dict[str, Any]:
    """{count, tokens, mean, p50, p90, max} of documents' lengths; percentiles by nearest rank (the smallest length
    that at least that share of documents do not exceed). `tokens` and `longest`: the exact sum and maximum, where
    the histogram was rounded."""
    count = sum(lengths.values())
    if not count:
        return {"count": 0, "tokens": 0, "mean": None, "p50": None, "p90": None, "max": None}
    ordered = sorted(lengths.items())

    def pct(p: float) -> int:
        rank, seen = math.ceil(p * count), 0
        for n, c in ordered:
            seen += c
            if seen >= rank:
                return n
        return ordered[-1][0]

    tokens = tokens if tokens is not None else sum(n * c for n, c in ordered)
    return {"count": count, "tokens": tokens, "mean": round(tokens / count, 1), "p50": pct(0.5), "p90": pct(0.9),
            "max": longest if longest is not None else ordered[-1][0]}


def merged_summary(per_rank: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One summary over every rank's end-event data (`doc_tokens` and `doc_lengths`), with `split` (documents split
    across blocks) summed; None when no rank has them."""
    ranks = [d for d in per_rank if isinstance(d.get("doc_tokens"), dict)]
    if not ranks:
        return None
    maxima = [d["doc_tokens"].get("max") for d in ranks if d["doc_tokens"].get("max") is not None]
    out = summary(merge(d.get("doc_lengths") for d in ranks), sum(d["doc_tokens"].get("tokens") or 0 for d in ranks),
                  max(maxima) if maxima else None)
    if all("split" in d["doc_tokens"] for d in ranks):
        out["split"] = sum(d["doc_tokens"]["split"] for d in ranks)
    return out
