"""Replay rules that need no run: trust_remote_code consent, drift rows, tolerance; calibration rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.record import records
from runner.cli.calibrate import calibration_rows
from runner.errors import UserError
from runner.record.replay import drift, spec_from_record, tolerance
from runner.spec import load_spec


def test_trust_remote_code_needs_consent():
    rec = {"id": "r", "spec": load_spec("tiny-cpu", ["model.trust_remote_code=true"]).to_dict()}
    with pytest.raises(UserError, match="--trust-remote-code"):
        spec_from_record(rec)
    assert spec_from_record(rec, trust_remote_code=True).model.trust_remote_code


def test_records_from_before_unwrapped_single_rank_replay_wrapped():
    """A record without train.fsdp_one_rank ran its one rank in FSDP2; replay keeps that, newer records keep theirs."""
    data = load_spec("tiny-cpu").to_dict()
    assert spec_from_record({"id": "new", "spec": data}).train.fsdp_one_rank is False
    del data["train"]["fsdp_one_rank"]
    assert spec_from_record({"id": "old", "spec": data}).train.fsdp_one_rank is True


@pytest.mark.parametrize("sharded", [True, False])
def test_one_rank_replays_as_it_ran_whatever_its_spec_says(sharded):
    """A one-rank record says whether its model was wrapped (the end event's fsdp_sharded): replay follows that,
    so a TRL record from when one GPU process always ran FSDP2 replays wrapped."""
    data = load_spec("tiny-cpu", ["engine=trl", f"train.fsdp_one_rank={str(not sharded).lower()}"]).to_dict()
    rec = {"id": "r", "spec": data, "metrics": {"per_rank": {"0": {"fsdp_sharded": sharded}}}}
    assert spec_from_record(rec).train.fsdp_one_rank is sharded
    two = {**rec, "metrics": {"per_rank": {"0": {"fsdp_sharded": True}, "1": {"fsdp_sharded": True}}}}
    assert spec_from_record(two).train.fsdp_one_rank is (not sharded)  # more ranks always shard: spec kept


def test_drift_rows_mark_strict_pins():
    a = {"python": "3.11.7", "torch": "2.13.0", "packages": {"trl": "1.16.0", "rich": "15"},
         "model": {"content_sha256": "a"}, "git": {"commit": "c1"}}
    b = {"python": "3.11.7", "torch": "2.13.0", "packages": {"trl": "1.17.0", "rich": "15"},
         "model": {"content_sha256": "b"}, "git": {"commit": "c2"}}
    rows = {r["pin"]: r for r in drift(a, b)}
    assert set(rows) == {"package trl", "model content_sha256", "git commit"}
    assert rows["package trl"]["strict"] and rows["model content_sha256"]["strict"]
    assert not rows["git commit"]["strict"]


def test_cpu_tolerance_is_exact():
    assert tolerance(load_spec("tiny-cpu")) == 0.0


def test_calibration_rows_compare_estimate_and_measured(tmp_path: Path):
    rec = records.new_record("g1", load_spec("tiny-cpu").to_dict(), {}, {}, {
        "per_gpu_gib": 12.0, "per_gpu_allocated_gib": 9.0, "breakdown": {"cuda_context_nccl": 1.0}}, tmp_path)
    rec["status"] = "succeeded"
    rec["metrics"] = {"per_rank": {"0": {"peak_mem": {"allocated": 10.0, "reserved": 10.5}},
                                   "1": {"peak_mem": {"allocated": 9.5, "reserved": 11.0}}}}
    records.save(tmp_path / "g1.json", rec)
    cpu = records.new_record("c1", load_spec("tiny-cpu").to_dict(), {}, {}, {"per_gpu_gib": 1.0}, tmp_path)
    cpu["metrics"] = {"per_rank": {"0": {"peak_mem": {"rss": 0.5}}}}
    records.save(tmp_path / "c1.json", cpu)
    rows = calibration_rows(tmp_path)
    assert len(rows) == 1
    r = rows[0]
    assert r["allocated_gib"] == 10.0 and r["reserved_gib"] == 11.0 and r["est_reserved_gib"] == 11.0
    assert r["error_allocated"] == pytest.approx(-0.1) and r["error_reserved"] == 0.0


def _rec(status: str, steps: int, curve: dict | None = None, failure: dict | None = None) -> dict:
    return {"status": status, "metrics": {"steps": steps, "loss_curve": curve or {}}, "failure": failure}


OOM = {"cause": "oom", "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "last_step": 0, "rank": 0}


def test_replay_of_a_failed_run_compares_the_failures():
    from runner.record.replay import compare

    r = compare(_rec("failed", 0, failure=OOM), _rec("failed", 0, failure=dict(OOM)), 0.0)
    assert r["reproduced"] and r["message"] == (
        "the original failed at step 0 with oom (CUDA out of memory. Tried to allocate 2.00 GiB); the replay failed "
        "at step 0 with oom (CUDA out of memory. Tried to allocate 2.00 GiB): same failure")
    r = compare(_rec("failed", 0, failure=OOM), _rec("succeeded", 3, {"0": [[1, 2.0], [2, 1.9], [3, 1.8]]}), 0.0)
    assert not r["reproduced"] and r["message"].endswith("the replay succeeded after 3 steps: a different outcome")
    other = {**OOM, "cause": "nccl", "message": "timeout"}
    assert not compare(_rec("failed", 0, failure=OOM), _rec("failed", 0, failure=other), 0.0)["reproduced"]


def test_no_steps_is_never_reproduced_and_a_cancelled_replay_is_not_compared():
    from runner.record.replay import compare

    r = compare(_rec("succeeded", 0), _rec("succeeded", 0), 0.0)
    assert not r["reproduced"] and "no loss curve to compare" in r["message"] and "Δloss" not in r["message"]
    curve = {"0": [[1, 2.0], [2, 1.9]], "1": [[1, 2.1], [2, 2.0]]}
    r = compare(_rec("succeeded", 2, curve), _rec("cancelled", 1, {"0": [[1, 2.0]], "1": [[1, 2.1]]}), 0.0)
    assert not r["reproduced"] and not r["compared"] and r["message"] == \
        "the replay was cancelled after 1 steps; not compared"


def test_a_cancelled_original_is_compared_over_the_steps_it_ran():
    from runner.record.replay import compare

    ran = {"0": [[1, 2.0], [2, 1.9]]}
    longer = {"0": [[1, 2.0], [2, 1.9], [3, 1.7]]}
    r = compare(_rec("cancelled", 2, ran), _rec("succeeded", 3, longer), 0.0)
    assert r["reproduced"] and "over the 2 steps the original ran before it was cancelled" in r["message"]
    r = compare(_rec("cancelled", 2, ran), _rec("succeeded", 3, {"0": [[1, 2.0], [2, 1.8], [3, 1.7]]}), 0.0)
    assert not r["reproduced"] and r["first_divergence"]["step"] == 2


def test_replay_preparation_refuses_a_broken_lock_and_missing_gpus_and_resolves_for_this_machine(tmp_path: Path,
                                                                                                 monkeypatch):
    """One preparation for `runner replay` and the TUI: the lock is checked, a CUDA record on a machine without GPUs
    is refused with where to replay it, a CPU record comes back resolved with the drift rows of its pins."""
    from runner.launch import replay as replay_prep
    from runner.launch.replay import prepare_replay

    # Capturing this machine's pins takes seconds (packages, git); what is compared with them is drift's own test.
    monkeypatch.setattr(replay_prep, "current_pins", lambda spec, repo_dir: {"python": "3.12.1"})

    cpu = records.new_record("c1", load_spec("tiny-cpu", ["hardware.nproc_per_node=auto"]).to_dict(),
                             {"python": "0.0"}, {}, None, tmp_path)
    cpu["status"] = "succeeded"
    records.save(tmp_path / "c1.json", cpu)
    prepared = prepare_replay(tmp_path / "c1.json", gpu_count=0)
    assert prepared.original["id"] == "c1"
    assert prepared.spec.hardware.device == "cpu" and prepared.spec.hardware.nproc_per_node == 2  # auto resolved
    assert prepared.drift == [{"pin": "python", "recorded": "0.0", "current": "3.12.1", "strict": True}]

    gpu = records.new_record("g1", load_spec("tiny-cpu", ["hardware.device=cuda"]).to_dict(), {}, {}, None, tmp_path)
    records.save(tmp_path / "g1.json", gpu)
    with pytest.raises(UserError, match="g1 ran on GPUs and this machine has none visible"):
        prepare_replay(tmp_path / "g1.json", gpu_count=0)
    assert prepare_replay(tmp_path / "g1.json", gpu_count=2).spec.hardware.device == "cuda"  # the same record, GPUs

    text = (tmp_path / "c1.json").read_text()
    (tmp_path / "c1.json").write_text(text.replace('"succeeded"', '"failed"'))
    with pytest.raises(UserError, match="refusing to replay: .*lock mismatch"):
        prepare_replay(tmp_path / "c1.json", gpu_count=0)
