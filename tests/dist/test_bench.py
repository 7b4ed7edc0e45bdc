"""A real `runner bench` on 2 CPU ranks: both engines on the same spec, results written as JSON and Markdown."""

from __future__ import annotations

import json

from tests.conftest import dir_args, run_cli


def test_bench_runs_both_engines_and_writes_results(dirs, tmp_path):
    out = tmp_path / "bench"
    code, _, _ = run_cli(["bench", "tiny-cpu", "--engines", "native,trl", "--sweep", "train.seq_len=128",
                          "--set", "train.activation_checkpointing=true", "--set", "train.recompute_layers=1",
                          "--set", "train.loss_impl=fused", "--steps", "3", "--warmup", "1", "--out", str(out),
                          "--name", "t", *dir_args(dirs)])
    assert code == 0
    result = json.loads((out / "t.json").read_text())
    native, trl = result["rows"]
    assert [native["engine"], trl["engine"]] == ["native", "trl"]
    for row in (native, trl):
        assert row["status"] == "succeeded" and row["seq_len"] == 128
        assert row["steps_measured"] == 3 and row["tokens_per_s"] > 0
        assert 0 <= row["data_wait_share"] < 1 if row["data_wait_share"] is not None else True
    assert native["spec"]["recompute_layers"] == 1 and native["choices"]["loss_impl"] == "fused"
    assert trl["choices"]["loss_impl"] == "trl fused lm head"
    assert trl["native_only_left_out"] == ["train.recompute_layers"] and trl["spec"]["recompute_layers"] is None
    md = (out / "t.md").read_text()
    assert "| sft-tui/tiny-qwen3 | native | 128 |" in md and "torch 2." in md
    assert result["command"].startswith("runner bench tiny-cpu --engines native,trl")
    assert not list(out.glob(".*.tmp"))
