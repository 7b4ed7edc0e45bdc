"""A CPU estimate against a real CPU run: the same quantity (peak RSS per rank), under the name the ranks use."""

from __future__ import annotations

import json

from runner.plan import estimate
from runner.spec import load_spec

RSS_TOLERANCE = 0.25
"""The process itself is most of a tiny CPU rank's memory (CPU_PROCESS_GIB); its size moves with library versions."""


def test_cpu_estimate_has_no_cuda_parts():
    e = estimate(load_spec("tiny-cpu", []))
    assert "cuda_context_nccl" not in e.breakdown and e.breakdown["process"] > 0
    assert set(e.peak_mem_gib) == {"rss"} and e.peak_mem_gib["rss"] == e.per_gpu_gib
    assert "RSS" in e.per_gpu_basis


def test_cpu_estimate_predicts_the_ranks_measured_rss(tiny_run):
    record = json.loads(tiny_run["record"].read_text())
    predicted = record["estimate"]["peak_mem_gib"]
    for rank, info in record["metrics"]["per_rank"].items():
        measured = info["peak_mem"]
        assert set(measured) == set(predicted) == {"rss"}, (rank, measured, predicted)
        error = (predicted["rss"] - measured["rss"]) / measured["rss"]
        assert abs(error) <= RSS_TOLERANCE, (rank, predicted, measured, error)


def test_a_cpu_rank_holds_the_packed_blocks_bool_mask_not_cudas_additive_copy():
    """sdpa on packed CPU blocks: the s × s bool mask transformers builds (1 byte per element), which torch's CPU
    kernel reads as it is; measured on the embedded model at 8k and 16k tokens (runner/plan/constants.py)."""
    packed, unpacked = (estimate(load_spec("tiny-cpu", ["train.seq_len=8192", f"train.packing={p}"]))
                        for p in ("true", "false"))
    mask_gib = 8192 * 8192 / 2**30
    assert abs(packed.breakdown["activations"] - unpacked.breakdown["activations"] - mask_gib) < 0.01
