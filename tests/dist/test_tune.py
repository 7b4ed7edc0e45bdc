"""A real `runner tune --probe 2` on the embedded recipe: the two best candidates run 3 steps each through the usual
launcher, the measured faster one is written as a recipe that loads and has no `auto` lever left."""

from __future__ import annotations

import json

import pytest

from runner.engines import SPEED_LEVERS as LEVERS
from runner.spec import load_spec
from tests.conftest import dir_args, run_cli

pytestmark = pytest.mark.dist


def test_tune_probes_the_two_best_candidates_and_writes_the_fastest(dirs, tmp_path, capsys):
    out = tmp_path / "tuned.yaml"
    code, stdout, _ = run_cli(["tune", "tiny-cpu", "--probe", "2", "-o", str(out),
                               "--set", "hardware.nproc_per_node=1", *dir_args(dirs)], capsys)
    assert code == 0, stdout
    records = [json.loads(p.read_text()) for p in sorted(dirs["records"].glob("*.json"))]
    assert len(records) == 2 and all(r["status"] == "succeeded" for r in records)
    assert all(r["metrics"]["steps"] == 3 for r in records)
    probed = [{f: r["spec"]["train"][f] for f in LEVERS} for r in records]
    assert probed[0] != probed[1]  # two different candidates
    tuned = load_spec(str(out)).train
    levers = {f: getattr(tuned, f) for f in LEVERS}
    assert "auto" not in levers.values() and levers in probed
    assert "measured step s" in stdout and f"wrote {out}" in stdout
