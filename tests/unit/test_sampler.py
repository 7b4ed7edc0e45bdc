"""Sampler: no-NVML fallbacks, node line, NodeSampler thread, and NVML field mapping through a fake pynvml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from runner.launch import sampler
from runner.facts.nvml import GpuSampler, detect_gpus
from runner.launch.sampler import NodeSampler, sample_node
from tests.unit.events_fixtures import start, write_events

NODE_KEYS = {"t", "node", "host", "gpus", "cpu_pct", "ram_used_gib", "ram_total_gib", "rank_rss_gib"}
GPU_KEYS = {"index", "name", "uuid", "util_pct", "mem_used_gib", "mem_total_gib", "temp_c", "power_w",
            "sm_clock_mhz", "ranks"}
GIB = 1024**3


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def fake_pynvml(init_error: int | None = None) -> types.ModuleType:
    """Two GPUs; GPU 1 does not support power readings; rank pids 100 (GPU 0) and 101 (GPU 1)."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int):
            super().__init__(value)
            self.value = value

    nv.NVMLError = NVMLError
    nv.NVML_ERROR_NOT_SUPPORTED = 3
    nv.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    nv.NVML_TEMPERATURE_GPU = 0
    nv.NVML_CLOCK_SM = 1
    nv.calls = []

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        nv.calls.append("init")

    def nvmlDeviceGetPowerUsage(h: int) -> int:
        if h == 1:
            raise NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return 312_500  # mW

    def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
        assert sensor == nv.NVML_TEMPERATURE_GPU
        return 60 + h

    def nvmlDeviceGetClockInfo(h: int, clock: int) -> int:
        assert clock == nv.NVML_CLOCK_SM
        return 1980

    nv.nvmlInit = nvmlInit
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=20 * GIB, total=80 * GIB, free=60 * GIB)
    nv.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=90 + h, memory=40)
    nv.nvmlDeviceGetPowerUsage = nvmlDeviceGetPowerUsage
    nv.nvmlDeviceGetTemperature = nvmlDeviceGetTemperature
    nv.nvmlDeviceGetClockInfo = nvmlDeviceGetClockInfo
    procs = {0: [SimpleNamespace(pid=100), SimpleNamespace(pid=999)], 1: [SimpleNamespace(pid=101)]}
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: procs[h]
    return nv


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=12))


def test_real_pynvml_without_driver() -> None:
    gpu = GpuSampler()
    if gpu.available:
        gpu.close()
        pytest.skip("this machine has NVML")
    assert gpu.sample() == []
    assert detect_gpus() == []


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    gpu = GpuSampler()
    assert gpu.available is False and gpu.sample() == []
    gpu.close()


def test_nvml_init_failure(no_nvml: None) -> None:
    gpu = GpuSampler()
    assert gpu.available is False and gpu.sample() == []
    assert detect_gpus() == []


@pytest.mark.launches
def test_sample_node_without_gpus(no_nvml: None) -> None:
    me = os.getpid()
    line = sample_node(3, GpuSampler(), {0: me, 1: dead_pid()})
    assert set(line) == NODE_KEYS
    assert line["node"] == 3 and line["gpus"] == []
    assert line["host"] and abs(line["t"] - time.time()) < 60
    assert 0.0 <= line["cpu_pct"] <= 100.0 * os.cpu_count()
    assert 0.0 < line["ram_used_gib"] < line["ram_total_gib"]
    assert list(line["rank_rss_gib"]) == ["0"]  # dead pid skipped
    assert line["rank_rss_gib"]["0"] > 0.0
    json.dumps(line, allow_nan=False)  # plain JSON


def test_fake_nvml_field_mapping_and_pid_to_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    gpu = GpuSampler()
    assert gpu.available
    gpus = gpu.sample({100: 0, 101: 1})
    assert [set(g) for g in gpus] == [GPU_KEYS, GPU_KEYS]
    g0, g1 = gpus
    assert g0 == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "util_pct": 90.0, "mem_used_gib": 20.0,
        "mem_total_gib": 80.0, "temp_c": 60, "power_w": 312.5, "sm_clock_mhz": 1980, "ranks": [0],
    }
    assert g1["power_w"] is None  # NotSupported on this GPU: a placeholder, the other fields still there
    assert (g1["temp_c"], g1["util_pct"], g1["ranks"]) == (61, 91.0, [1])
    assert gpu.sample()[0]["ranks"] == []  # no pid mapping given
    gpu.close()
    assert nv.calls == ["init", "shutdown"]
    assert gpu.sample() == []


def test_fake_nvml_missing_function_is_a_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_pynvml()
    del nv.nvmlDeviceGetClockInfo  # an older nvidia-ml-py
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: (_ for _ in ()).throw(RuntimeError("version mismatch"))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    g0 = GpuSampler().sample({100: 0})[0]
    assert g0["sm_clock_mhz"] is None and g0["ranks"] == [] and g0["mem_total_gib"] == 80.0


def test_sample_node_maps_ranks_through_pids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    line = sample_node(0, GpuSampler(), {4: 100, 5: 101})
    assert [g["ranks"] for g in line["gpus"]] == [[4], [5]]
    assert line["rank_rss_gib"] == {}  # pids 100/101 are not live ranks of this machine (or not ours)


def test_detect_gpus_with_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    assert detect_gpus() == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "mem_total_gib": 80.0},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "mem_total_gib": 80.0},
    ]


def test_node_sampler_thread_writes_and_stops_promptly(tmp_path: Path, no_nvml: None) -> None:
    me = os.getpid()
    write_events(tmp_path, "rank0", [start(0, pid=me)])  # pid = me + rank
    write_events(tmp_path, "rank1", [start(1, pid=me, node_rank=1)])  # another node: not sampled here
    thread = NodeSampler(tmp_path, node=0, interval_s=0.05)
    thread.start()
    path = tmp_path / "events" / "node0.jsonl"
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (not path.exists() or path.read_text().count("\n") < 2):
        time.sleep(0.02)
    t0 = time.monotonic()
    thread.stop()
    assert time.monotonic() - t0 < 1.0
    assert not thread.is_alive()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) >= 2
    assert all(set(x) == NODE_KEYS and x["node"] == 0 for x in lines)
    assert thread.rank_pids == {0: me}
    assert "0" in lines[-1]["rank_rss_gib"]


def test_node_sampler_survives_errors(tmp_path: Path, no_nvml: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def flaky(node: int, gpu: GpuSampler, rank_pids: dict[int, int]) -> dict:
        calls.append(node)
        if len(calls) == 1:
            raise OSError("transient")
        return {"t": 0.0, "node": node}

    monkeypatch.setattr(sampler, "sample_node", flaky)
    thread = NodeSampler(tmp_path, node=0, interval_s=0.02)
    thread.start()
    deadline = time.monotonic() + 5.0
    path = tmp_path / "events" / "node0.jsonl"
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.02)
    thread.stop()
    assert len(calls) >= 2 and json.loads(path.read_text().splitlines()[0]) == {"t": 0.0, "node": 0}


@pytest.mark.launches
def test_cli_once(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runner.launch.sampler", "--once", "--node", "2"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2],
    ).stdout
    line = json.loads(out)
    assert set(line) == NODE_KEYS and line["node"] == 2
