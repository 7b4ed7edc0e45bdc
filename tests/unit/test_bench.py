"""`runner bench` row planning: engines × sweeps, and native-only levers left out of trl rows."""

from __future__ import annotations

import pytest

from runner.cli.bench import combos, parse_sweeps, row_spec
from runner.errors import UserError


def test_rows_are_engines_times_sweeps_and_trl_skips_native_only_sweeps():
    sweeps = parse_sweeps(["train.seq_len=128,256", "train.recompute_layers=1,2"])
    rows = combos(["native", "trl"], sweeps)
    native = [r for r in rows if r[0] == "engine=native"]
    trl = [r for r in rows if r[0] == "engine=trl"]
    assert len(native) == 4
    # The recompute sweep means nothing to trl: one row per seq_len, run without the field.
    assert trl == [["engine=trl", "train.seq_len=128", "train.recompute_layers=null"],
                   ["engine=trl", "train.seq_len=256", "train.recompute_layers=null"]]


def test_trl_row_leaves_out_the_native_only_setting_of_the_spec_and_says_so():
    over = ["train.activation_checkpointing=true", "train.recompute_layers=2"]
    native, dropped = row_spec("tiny-cpu", over, ["engine=native"], 5)
    assert native.train.recompute_layers == 2 and dropped == [] and native.train.max_steps == 5
    trl, dropped = row_spec("tiny-cpu", over, ["engine=trl"], 5)
    assert trl.engine == "trl" and trl.train.recompute_layers is None
    assert dropped == ["train.recompute_layers"]
    assert trl.train.seq_len == native.train.seq_len and trl.train.seed == native.train.seed


def test_trl_row_runs_without_activation_offload():
    over = ["train.activation_checkpointing=true", "train.offload_activations=true", "train.recompute_layers=2"]
    trl, dropped = row_spec("tiny-cpu", over, ["engine=trl"], 5)
    assert trl.train.offload_activations is False and trl.train.recompute_layers is None
    assert dropped == ["train.recompute_layers", "train.offload_activations"]
    assert combos(["trl"], parse_sweeps(["train.offload_activations=true,false"])) == [
        ["engine=trl", "train.offload_activations=false"]]


def test_bad_sweep_is_a_user_error():
    with pytest.raises(UserError, match="field=v1,v2"):
        parse_sweeps(["train.seq_len"])


def test_max_seq_len_range_is_parsed_with_clear_errors():
    from runner.cli.bench_limit import grid, parse_range

    assert parse_range("32768:65536:8192") == (32768, 65536, 8192)
    assert grid(*parse_range("4096:16384")) == [4096, 8192, 12288, 16384]
    for bad in ("32768", "a:b", "0:8", "65536:32768"):
        with pytest.raises(UserError, match="--max-seq-len"):
            parse_range(bad)


@pytest.mark.parametrize("limit", [None, 4096, 12288, 40960, 65536])
def test_bisection_finds_the_largest_fitting_length_in_log_probes(limit):
    from runner.cli.bench_limit import grid, largest_fitting

    lengths = grid(4096, 65536, 4096)
    tried = []

    def fits(n):
        tried.append(n)
        return limit is not None and n <= limit

    found, complete = largest_fitting(lengths, fits)
    assert found == limit and complete
    assert len(tried) <= 5  # 16 lengths: ceil(log2(17))


def test_bisection_started_at_the_estimate_is_always_right_and_short_when_the_estimate_is():
    """Started anywhere, the search still finds the limit; started at the limit, it takes two probes."""
    import random

    from runner.cli.bench_limit import largest_fitting

    rng = random.Random(0)
    for _ in range(500):
        lengths = list(range(1, rng.randint(1, 40) + 1))
        limit = rng.randint(0, len(lengths))  # 0: nothing fits
        start = rng.randrange(len(lengths))
        tried = []

        def fits(n, limit=limit, tried=tried):
            tried.append(n)
            return n <= limit

        found, complete = largest_fitting(lengths, fits, start=start)
        assert (found or 0) == limit and complete, (lengths, limit, start)
        assert len(tried) <= 2 + len(lengths).bit_length()
        if 0 < limit < len(lengths) and start == limit - 1:
            assert tried == [limit, limit + 1]


def test_bisection_stops_on_a_failure_that_is_not_out_of_memory():
    from runner.cli.bench_limit import largest_fitting

    found, complete = largest_fitting([1, 2, 3, 4], lambda n: True if n < 2 else None)
    assert complete is False and found is None  # the first probe (2) failed: nothing is known to fit


def test_predicted_limit_is_where_the_estimate_stops_fitting():
    from runner.cli.bench_limit import grid, predicted_limit
    from runner.plan import estimate
    from runner.spec import load_spec

    spec = load_spec("qwen3-1.7b-bench-h200", ["train.activation_checkpointing=false", "train.recompute_layers=null"])
    lengths = grid(8192, 262144, 8192)
    limit = predicted_limit(spec, lengths)
    assert limit is not None and limit < lengths[-1]

    def at(n):
        return estimate(spec.model_copy(update={"train": spec.train.model_copy(update={"seq_len": n})}), suggest=False)

    assert at(limit).fits and not at(limit + 8192).fits


def test_limits_compare_engines_and_score_the_estimator(tmp_path):
    from rich.console import Console

    from runner.cli.bench_limit import find_limits, grid
    from runner.spec import load_spec

    no_ckpt = ["train.activation_checkpointing=false", "train.recompute_layers=null"]
    specs = {e: load_spec("qwen3-1.7b-bench-h200", [f"engine={e}", *no_ckpt]) for e in ("native", "trl")}
    true_limit = {"native": 65536, "trl": 40960}

    def probe(spec, runs_dir, records_dir):
        ok = spec.train.seq_len <= true_limit[spec.engine]
        assert spec.train.max_steps == 2
        return ok, {"seq_len": spec.train.seq_len, "status": "succeeded" if ok else "failed"}

    out = find_limits(specs, grid(8192, 131072, 8192), tmp_path, tmp_path, Console(quiet=True), probe=probe)
    assert out["engines"]["native"]["measured_max_seq_len"] == 65536
    assert out["engines"]["trl"]["measured_max_seq_len"] == 40960
    assert out["native_over_trl"] == 1.6
    for row in out["engines"].values():
        assert row["search_complete"] and row["predicted_max_seq_len"]
        assert row["prediction_error"] == round((row["predicted_max_seq_len"] - row["measured_max_seq_len"])
                                                / row["measured_max_seq_len"], 4)


def test_repeat_spread_groups_runs_of_the_same_configuration():
    from runner.cli.bench import repeat_spread

    rows = [{"overrides": ["engine=native"], "status": "succeeded", "tokens_per_s": 100.0},
            {"overrides": ["engine=trl"], "status": "succeeded", "tokens_per_s": 80.0},
            {"overrides": ["engine=native"], "status": "succeeded", "tokens_per_s": 110.0},
            {"overrides": ["engine=trl"], "status": "failed"},
            {"overrides": ["engine=native"], "status": "succeeded", "tokens_per_s": 104.0}]
    assert repeat_spread(rows) == [{"overrides": ["engine=native"], "tokens_per_s": [100.0, 110.0, 104.0],
                                    "spread": round(10 / 104, 4)}]


def _row(engine, loss, step=13, seq_len=8192, model="m", status="succeeded", precision=None):
    return {"engine": engine, "model": model, "seq_len": seq_len, "overrides": [f"engine={engine}"],
            "status": status, "last_step": step, "last_loss": loss,
            "choices": {"optimizer_precision": precision} if precision else {}}


def test_rows_whose_losses_after_the_same_steps_differ_by_more_than_5_percent_are_flagged():
    from runner.cli.bench import loss_gaps

    rows = [_row("native", 8.14, precision="bf16"), _row("trl", 5.70), _row("native", 5.90),
            _row("native", 5.99, seq_len=32768), _row("trl", 5.70, step=12), _row("trl", 2.0, status="failed")]
    gaps = loss_gaps(rows)
    # 8.14 vs 5.70 and vs 5.90 are apart; 5.70 vs 5.90 is 3.5%, within 5%. Another block length, another step
    # count or a failed row is never paired.
    assert [g["rows"] for g in gaps] == [[1, 2], [1, 3]]
    assert gaps[0]["step"] == 13 and gaps[0]["losses"] == [8.14, 5.70] and gaps[0]["gap"] == round(2.44 / 5.70, 4)
    # The edge: just under 5% is equal learning, just above is not.
    assert loss_gaps([_row("native", 1.0499), _row("trl", 1.0)]) == []
    assert len(loss_gaps([_row("native", 1.0501), _row("trl", 1.0)])) == 1
    # A diverged run differs from every other.
    assert loss_gaps([_row("native", float("nan")), _row("trl", 1.0)])[0]["gap"] is None


def test_the_table_shows_the_last_loss_and_precision_beside_tokens_per_s_and_lists_the_unequal_pairs():
    from runner.cli.bench import loss_gaps, markdown

    rows = [_row("native", 8.14, precision="bf16"), _row("trl", 5.70)]
    for r in rows:
        r.update(tokens_per_s=23182.0, record="x")
    result = {"created": "now", "command": "runner bench", "gpu": {}, "versions": {}, "warmup_steps": 3,
              "steps": 10, "rows": rows, "loss_gaps": loss_gaps(rows)}
    text = markdown(result)
    header = next(line for line in text.splitlines() if line.startswith("| model"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[cols.index("tokens_per_s") + 1] == "last_loss" and "precision" in cols
    assert "| m | native | 8192 | bf16 | 23,182 | 8.1400 @13 |" in text
    assert "## Unequal learning" in text and "rows 1 and 2 at step 13: 8.14 vs 5.7 (42.8%)" in text
    assert "Unequal learning" not in markdown({**result, "loss_gaps": []})


def test_a_precision_sweep_gives_one_trl_row_beside_both_native_ones():
    """TRL keeps fp32 master weights whatever is asked: one trl row, run at `auto`, in the same table."""
    rows = combos(["native", "trl"], [("train.optimizer_precision", ["auto", "bf16"])])
    assert rows == [["engine=native", "train.optimizer_precision=auto"],
                    ["engine=native", "train.optimizer_precision=bf16"],
                    ["engine=trl", "train.optimizer_precision=auto"]]


def _has_precision_field() -> bool:
    from runner.spec import load_spec

    return "optimizer_precision" in load_spec("tiny-cpu", []).to_dict()["train"]


@pytest.mark.skipif(not _has_precision_field(), reason="this version has no train.optimizer_precision")
def test_trl_row_runs_at_its_own_precision_and_says_the_native_one_was_left_out():
    over = ["train.optimizer_precision=bf16", "model.dtype=bfloat16"]
    native, dropped = row_spec("tiny-cpu", over, ["engine=native"], 5)
    assert native.train.optimizer_precision == "bf16" and dropped == []
    trl, dropped = row_spec("tiny-cpu", over, ["engine=trl"], 5)
    assert dropped == ["train.optimizer_precision"] and trl.train.optimizer_precision == "fp32_master"
