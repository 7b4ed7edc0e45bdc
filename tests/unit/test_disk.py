"""Disk a run needs: the export's bytes for every output.save value, the checkpoints' count, and the figures
`runner estimate` prints against the free space of the runs folder."""

from __future__ import annotations

import json

from runner.plan.choices import make_plan
from runner.gate.disk import checkpoint_count, export_bytes, export_kind
from runner.plan.lora import lora_params
from runner.spec import load_spec
from tests.conftest import run_cli


def _with(spec, save: str, kind: str = "full"):
    # model_copy does not validate: `auto` and `merged` are priced by name whether or not the spec takes them yet.
    method = spec.method.model_copy(update={"kind": kind})
    return spec.model_copy(update={"output": spec.output.model_copy(update={"save": save}), "method": method})


def test_export_bytes_for_every_output_save_value():
    spec = load_spec("tiny-cpu")
    arch = make_plan(spec).arch
    adapter = lora_params(arch, spec.method.lora)[0] * 4
    whole = arch.params_total * 4
    assert export_bytes(_with(spec, "none"), arch, 2, 4) == 0
    assert export_bytes(_with(spec, "full"), arch, 2, 4) == whole
    assert export_bytes(_with(spec, "auto"), arch, 2, 4) == whole and export_kind(_with(spec, "auto")) == "full"
    assert export_bytes(_with(spec, "adapter", "lora"), arch, 2, 4) == adapter > 0
    assert export_bytes(_with(spec, "auto", "qlora"), arch, 2, 4) == adapter
    assert export_kind(_with(spec, "auto", "lora")) == "adapter"
    assert export_bytes(_with(spec, "merged", "lora"), arch, 2, 4) == arch.params_total * 2
    assert export_bytes(_with(spec, "full", "lora"), arch, 2, 4) == arch.params_total * 2 + adapter


def test_checkpoint_count_includes_the_last_step():
    spec = load_spec("tiny-cpu")
    every = spec.model_copy(update={"train": spec.train.model_copy(update={"checkpoint_every": 4})})
    assert checkpoint_count(spec, 12) == 0
    assert checkpoint_count(every, 12) == 3 and checkpoint_count(every, 13) == 4


def test_estimate_reports_disk_needed_and_free(tmp_path, capsys):
    runs = tmp_path / "not-yet" / "runs"
    args = ["estimate", "tiny-cpu", "--set", "train.checkpoint_every=50", "--set", "output.save=full",
            "--runs-dir", str(runs)]
    code, out, _ = run_cli([*args, "--json"], capsys)
    disk = json.loads(out)["disk"]
    assert code == 0 and disk["folder"] == str(tmp_path) and disk["checkpoints"] == 3 and disk["fits"]
    assert disk["needed_bytes"] >= 3 * disk["checkpoint_bytes"] + disk["export_bytes"] > 0 and disk["free_bytes"]
    code, out, _ = run_cli(args, capsys)
    assert code == 0 and "3 checkpoint(s)" in out and f"free in {tmp_path}" in out


def test_refusal_names_folder_bytes_and_fix_and_a_resume_counts_only_what_is_left(tmp_path, monkeypatch):
    import pytest

    from runner.errors import PredictedNotToFit
    from runner.gate import disk

    spec = load_spec("tiny-cpu", ["train.checkpoint_every=4", "train.max_steps=12"])
    need = disk.disk_plan(spec, tmp_path, 12)
    monkeypatch.setattr(disk, "free_bytes", lambda _: (tmp_path, need.needed_bytes - 1))
    with pytest.raises(PredictedNotToFit) as e:
        disk.check_disk(spec, tmp_path, 12, force=False)
    assert str(e.value).startswith(f"not enough disk in {tmp_path}: ") and f"{need.needed_bytes} bytes" in str(e.value)
    assert "--force" in str(e.value) and disk.check_disk(spec, tmp_path, 12, force=True) is None
    left = disk.check_disk(spec, tmp_path, 12, force=False, from_step=8)  # two of three checkpoints written
    assert left.checkpoints == 1 and left.needed_bytes == need.needed_bytes - 2 * need.checkpoint_bytes
