"""A real `runner bench` on 2 CPU ranks: both engines on the same spec, each twice (interleaved), results written as
JSON and Markdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import dir_args, run_cli


def _first_blocks(rank: int, n: int) -> list:
    """The first blocks of a rank's one-pass stream of tiny-cpu at 128 tokens, as the TRL engine builds them."""
    import itertools

    from runner.spec import load_spec, resolve_embedded
    from runner.train.data import BlockStream, DataSource
    from runner.train.model import load_tokenizer

    spec = load_spec("tiny-cpu", ["train.seq_len=128"])
    tok = load_tokenizer(spec)
    source = DataSource(path=resolve_embedded(spec.dataset.path), dataset_id=None, revision=None, split="train",
                        messages_field="messages", seq_len=128, pad_id=tok.pad_token_id, packing=True, seed=0,
                        epochs=1.0, packing_strategy=spec.train.packing_strategy)
    return list(itertools.islice(BlockStream(source, tok, rank, 2), n))


@pytest.mark.dist
def test_bench_runs_both_engines_repeated_interleaved_and_writes_results(dirs, tmp_path):
    out = tmp_path / "bench"
    code, _, _ = run_cli(["bench", "tiny-cpu", "--engines", "native,trl", "--sweep", "train.seq_len=128",
                          "--set", "train.activation_checkpointing=true", "--set", "train.recompute_layers=1",
                          "--set", "train.loss_impl=fused", "--steps", "3", "--warmup", "1", "--repeat", "2",
                          "--out", str(out), "--name", "t", *dir_args(dirs)])
    assert code == 0
    result = json.loads((out / "t.json").read_text())
    # Repeats interleave (every configuration once, then again), so that drift spreads over all of them, and the
    # spread of each configuration's runs is reported; a repeat learns exactly what the first run did.
    rows = result["rows"]
    assert [(r["engine"], r["repeat"]) for r in rows] == [("native", 1), ("trl", 1), ("native", 2), ("trl", 2)]
    assert [r["last_loss"] for r in rows[2:]] == [r["last_loss"] for r in rows[:2]]
    assert len(result["repeats"]) == 2
    assert all(len(g["tokens_per_s"]) == 2 and g["spread"] >= 0 for g in result["repeats"])
    assert "## Repeats" in (out / "t.md").read_text()
    native, trl = rows[:2]
    assert [native["engine"], trl["engine"]] == ["native", "trl"]
    for row in (native, trl):
        assert row["status"] == "succeeded" and row["seq_len"] == 128
        assert row["steps_measured"] == 3 and row["tokens_per_s"] > 0
        assert 0 <= row["data_wait_share"] < 1  # both engines time their wait for data
        # The loss at the last measured step (1 warm-up + 3), as rank 0's step line says it.
        curve = json.loads(Path(row["record"]).read_text())["metrics"]["loss_curve"]["0"]
        assert row["last_step"] == 4 and row["last_loss"] == curve[-1][1] and curve[-1][0] == 4
    assert native["spec"]["recompute_layers"] == 1 and native["choices"]["loss_impl"] == "fused"
    assert trl["choices"]["loss_impl"] == "trl-fused"
    assert trl["native_only_left_out"] == ["train.recompute_layers"] and trl["spec"]["recompute_layers"] is None
    for row in (native, trl):  # the documents trained on, as the run's record merged them over both ranks
        packing = json.loads(Path(row["record"]).read_text())["metrics"]["packing"]
        docs = row["doc_tokens"]
        assert docs == {k: packing["doc_tokens"][k] for k in ("count", "mean", "p50", "p90", "max", "split")}
        assert docs["count"] > 0 and docs["p50"] <= docs["p90"] <= docs["max"]
    # TRL builds a whole pass of blocks, then trains on its first 4 per rank (1 warm-up and 3 measured steps of one
    # block): those blocks' documents, and no others, are the row's.
    assert trl["doc_tokens"]["count"] == sum(len(b.doc_lengths) for r in (0, 1) for b in _first_blocks(r, 4))
    # Both engines train the same model on the same blocks: they learn alike, and no pair is flagged.
    assert result["loss_gaps"] == []
    md = (out / "t.md").read_text()
    assert "| sft-tui/tiny-qwen3 | native | 128 |" in md and "torch 2." in md
    d = native["doc_tokens"]
    assert f"| {d['mean']:,.0f} / {d['p50']:,} / {d['p90']:,} / {d['max']:,} ({d['count']:,}) |" in md
    assert result["command"].startswith("runner bench tiny-cpu --engines native,trl")
    assert not list(out.glob(".*.tmp"))


@pytest.mark.dist
def test_bench_finds_the_largest_block_that_fits_with_real_runs(dirs, tmp_path):
    """On CPU nothing runs out of memory: every probe fits and the search says the limit is above the range."""
    out = tmp_path / "limits"
    code, _, _ = run_cli(["bench", "tiny-cpu", "--engines", "native", "--max-seq-len", "128:384:128",
                          "--out", str(out), "--name", "l", *dir_args(dirs)])
    assert code == 0
    limits = json.loads((out / "l.json").read_text())["limits"]["engines"]["native"]
    assert limits["measured_max_seq_len"] == 384 and limits["search_complete"]
    # The search starts where the estimator puts the limit: the top of the range, confirmed by one probe.
    assert [p["seq_len"] for p in limits["probes"]] == [384]
    assert all(p["status"] == "succeeded" for p in limits["probes"])
    assert all(p["peak_mem_gib"]["rss"] > 0 for p in limits["probes"])  # each probe's measured peak is kept
    assert "above the range" in limits["note"] and limits["predicted_max_seq_len"] == 384
    assert "Largest tokens per block that fits" in (out / "l.md").read_text()


def test_bench_rejects_seq_len_sweep_with_max_seq_len(dirs, tmp_path, capsys):
    code, _, err = run_cli(["bench", "tiny-cpu", "--max-seq-len", "128:256", "--sweep", "train.seq_len=128",
                            "--out", str(tmp_path), *dir_args(dirs)], capsys)
    assert code == 2 and "leave it out of --sweep" in err
    code, _, err = run_cli(["bench", "tiny-cpu", "--repeat", "0", "--out", str(tmp_path), *dir_args(dirs)], capsys)
    assert code == 2 and "--repeat expects 1 or more" in err
    assert not list(tmp_path.glob("*.json"))
