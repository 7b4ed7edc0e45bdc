"""Every family of the matrix on 2 CPU ranks (gloo, FSDP2) with both engines, in ONE torchrun launch: the family
matrix script's CPU mode (benchmarks/families_gpu.py --device cpu --quick), whose ranks loop over the cells through
the engines' own train functions. Every cell trains, both ranks agree on the global loss, and the two engines give
the same first-step loss on the same packed blocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.facts.families import MATRIX

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
# Same blocks, same fp32 cross-entropy over the same targets: the engines differ only in summation order (~1e-7);
# one document seeing another moves the loss by ~1e-2 (tests/dist/test_engines_agree.py).
LOSS_TOL = 1e-5


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("families")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "families_gpu.py"), "--out", str(out),
                           "--work", str(out / "work"), "--device", "cpu", "--quick", "--nproc", "2"], cwd=ROOT,
                          capture_output=True, text=True)
    report = json.loads((out / "families-cpu.json").read_text())
    return {"proc": proc, "rows": report["rows"], "meta": report["meta"], "out": out}


def test_every_family_trains_with_both_engines_on_two_ranks(matrix):
    rows = matrix["rows"]
    assert {(r["family"], r["engine"]) for r in rows} == {(f, e) for f in MATRIX for e in ("native", "trl")}
    failed = [(r["family"], r["engine"], r["reason"]) for r in rows if r["status"] != "trained"]
    assert not failed, (failed, matrix["proc"].stdout[-3000:], matrix["proc"].stderr[-3000:])
    assert matrix["proc"].returncode == 0
    for r in rows:
        run_dir = matrix["out"] / "work" / "runs" / f"{r['family']}-{r['engine']}-{r['seq_len']}"
        ends = [json.loads(line) for rank in (0, 1)
                for line in (run_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()
                if '"event":"end"' in line]
        assert len(ends) == 2 and all(e["fsdp_sharded"] and e["steps"] == 2 for e in ends), (r["family"], ends)
        assert r["attn"] in ("sdpa", "eager") and r["tokens_per_s"]


def test_both_ranks_see_one_global_loss_and_the_engines_agree_on_the_first_step(matrix):
    by = {(r["family"], r["engine"]): r for r in matrix["rows"]}
    for family in MATRIX:
        native, trl = by[family, "native"]["global_loss"], by[family, "trl"]["global_loss"]
        assert len(native) == len(trl) == 2 and all(x is not None for x in native + trl), family
        assert native[0] == pytest.approx(trl[0], abs=LOSS_TOL), (family, native, trl)
    for family in MATRIX:
        run_dir = matrix["out"] / "work" / "runs" / f"{family}-native-256"
        losses = [[json.loads(line)["global_loss"] for line in (run_dir / "events" / f"rank{rank}.jsonl")
                   .read_text().splitlines() if '"global_loss"' in line] for rank in (0, 1)]
        assert losses[0] == losses[1], family


def test_what_a_plan_from_config_json_says_is_what_each_engine_chose(matrix):
    """runner.decide.rules.plan_attention (the estimator's call, config.json only) against train_begin's attn."""
    from runner.decide.rules import plan_attention
    from runner.spec import RunSpec

    for r in matrix["rows"]:
        run_dir = matrix["out"] / "work" / "runs" / f"{r['family']}-{r['engine']}-{r['seq_len']}"
        spec = RunSpec.model_validate(json.loads((run_dir / "spec.json").read_text()))
        config = json.loads((Path(spec.model.path) / "config.json").read_text())
        assert plan_attention(spec, config, "cpu").impl == r["attn"], r


def test_the_report_names_command_machine_and_versions(matrix):
    meta = matrix["meta"]
    assert "--device cpu --quick" in meta["command"] and meta["versions"]["transformers"]
    md = (matrix["out"] / "families-cpu.md").read_text()
    assert "| family | model_type | engine |" in md and md.count("| trained |") == 2 * len(MATRIX)


def test_every_rank_of_every_cell_began_with_its_decisions_file_and_the_estimator_priced_it(matrix):
    """Each cell was decided once before its launch (runs/<cell>/decisions.json): every rank's train_begin echoes
    the file whole, and the estimator's plan of the cell's spec holds the same decisions."""
    from runner.plan import make_plan
    from runner.spec import RunSpec
    from tests.unit.test_decide import assert_ranks_obeyed

    for r in matrix["rows"]:
        run_dir = matrix["out"] / "work" / "runs" / f"{r['family']}-{r['engine']}-{r['seq_len']}"
        spec = RunSpec.model_validate(json.loads((run_dir / "spec.json").read_text()))
        assert make_plan(spec).decisions == assert_ranks_obeyed(run_dir), r
