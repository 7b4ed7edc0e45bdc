"""`runner bench` row planning: engines × sweeps, and native-only levers left out of trl rows."""

from __future__ import annotations

import pytest

from runner.bench import combos, parse_sweeps, row_spec
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


def test_bad_sweep_is_a_user_error():
    with pytest.raises(UserError, match="field=v1,v2"):
        parse_sweeps(["train.seq_len"])
