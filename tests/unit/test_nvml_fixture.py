"""A node sample taken on an H200 through real NVML (tests/fixtures/nvml_h200_node0.jsonl) reads into the view model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from runner.events.monitor import RunView

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nvml_h200_node0.jsonl"


def test_real_h200_sample_has_every_field_and_reads_into_the_view(tmp_path: Path):
    line = json.loads(FIXTURE.read_text().splitlines()[0])
    gpu = line["gpus"][0]
    assert gpu["name"] == "NVIDIA H200" and gpu["mem_total_gib"] > 139
    for key in ("util_pct", "mem_used_gib", "temp_c", "power_w", "sm_clock_mhz", "uuid"):
        assert gpu[key] is not None, key
    events = tmp_path / "events"
    events.mkdir()
    shutil.copy(FIXTURE, events / "node0.jsonl")
    view = RunView(tmp_path)
    assert view.poll()
    state = view.gpus[(0, 0)]
    assert state.name == "NVIDIA H200" and state.mem_total_gib == gpu["mem_total_gib"]
    assert state.power_w == gpu["power_w"] and state.temp_c == gpu["temp_c"]
    assert view.nodes[0].ram_total_gib == line["ram_total_gib"]
