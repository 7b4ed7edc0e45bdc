"""Per-node GPU/CPU sampler: NVML (nvidia-ml-py) when present, psutil always; appends to events/node<n>.jsonl."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from runner.tail import DirTail

log = logging.getLogger(__name__)

GIB = 1024**3


class GpuSampler:
    """The node's GPUs through NVML. Without NVML (no library, no driver, no nvidia-ml-py) `available` is False and
    `sample()` returns []; a field a GPU or driver does not support is None, never an exception (nvitop style)."""

    def __init__(self) -> None:
        self.available = False
        self._handles: list[Any] = []
        try:
            # Imported here, not at module level: the module must load on machines without nvidia-ml-py, and
            # tests swap in a fake module through sys.modules.
            self._nvml = importlib.import_module("pynvml")
            self._nvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            log.debug("NVML unavailable: %s", e)
            return
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as e:
            log.warning("NVML initialised but listing GPUs failed: %s", e)
            self._shutdown()
            return
        self.available = True

    def _query(self, fn_name: str, *args: Any) -> Any:
        # Looked up by name inside the try: an older nvidia-ml-py lacks some functions (AttributeError), a newer
        # one raises NVMLLibraryMismatchError against an old driver, a GPU raises NVMLError NotSupported,
        # NoPermission, GpuIsLost... Each of these is one missing field, not a failed sample.
        try:
            return getattr(self._nvml, fn_name)(*args)
        except Exception as e:
            log.debug("NVML %s: %s", fn_name, e)
            return None

    def sample(self, pid_to_rank: dict[int, int] | None = None) -> list[dict[str, Any]]:
        """One dict per GPU; `ranks` lists the ranks (from `pid_to_rank`) with a compute context on that GPU."""
        if not self.available:
            return []
        nv, q = self._nvml, self._query
        pid_to_rank = pid_to_rank or {}
        out = []
        for index, h in enumerate(self._handles):
            mem = q("nvmlDeviceGetMemoryInfo", h)
            util = q("nvmlDeviceGetUtilizationRates", h)
            power_mw = q("nvmlDeviceGetPowerUsage", h)
            procs = q("nvmlDeviceGetComputeRunningProcesses", h) or []
            out.append(
                {
                    "index": index,
                    "name": _text(q("nvmlDeviceGetName", h)),
                    "uuid": _text(q("nvmlDeviceGetUUID", h)),
                    "util_pct": None if util is None else float(util.gpu),
                    "mem_used_gib": None if mem is None else mem.used / GIB,
                    "mem_total_gib": None if mem is None else mem.total / GIB,
                    "temp_c": q("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
                    "power_w": None if power_mw is None else power_mw / 1000.0,
                    "sm_clock_mhz": q("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM),
                    # Pids are those of NVML's PID namespace: inside a container without --pid=host they do
                    # not match the ranks' pids and the list stays empty.
                    "ranks": sorted({pid_to_rank[p.pid] for p in procs if p.pid in pid_to_rank}),
                }
            )
        return out

    def close(self) -> None:
        if self.available:
            self.available = False
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as e:
            log.debug("nvmlShutdown: %s", e)


def _text(v: Any) -> str | None:
    # Older nvidia-ml-py returns bytes for names and UUIDs, newer returns str.
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def detect_gpus() -> list[dict[str, Any]]:
    """index, name, mem_total_gib of each GPU of this machine, for `hardware.gpu=auto`; [] without NVML."""
    gpu = GpuSampler()
    try:
        return [{k: g[k] for k in ("index", "name", "mem_total_gib")} for g in gpu.sample()]
    finally:
        gpu.close()


def sample_node(node: int, gpu: GpuSampler, rank_pids: dict[int, int]) -> dict[str, Any]:
    """One node line. `rank_pids` maps global rank -> pid of the ranks on this node; ranks whose process is gone
    are left out of `rank_rss_gib`."""
    vm = psutil.virtual_memory()
    rank_rss_gib: dict[str, float] = {}
    for rank, pid in sorted(rank_pids.items()):
        try:
            rank_rss_gib[str(rank)] = psutil.Process(pid).memory_info().rss / GIB
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
            continue
    return {
        "t": time.time(),
        "node": node,
        "host": socket.gethostname(),
        "gpus": gpu.sample({pid: rank for rank, pid in rank_pids.items()}),
        # Since the previous call in this process: the first call of a process returns a meaningless 0.0.
        "cpu_pct": psutil.cpu_percent(interval=None),
        # total - available, not vm.used: what the ranks can still get before the OOM killer, as top/htop show.
        "ram_used_gib": (vm.total - vm.available) / GIB,
        "ram_total_gib": vm.total / GIB,
        "rank_rss_gib": rank_rss_gib,
    }


class NodeSampler(threading.Thread):
    """Daemon thread appending one `sample_node` line to `events/node<node>.jsonl` every `interval_s`.

    The rank pids come from the `start` events of `events/rank*.jsonl` whose node_rank is this node (a later
    start of a rank, e.g. after a restart, replaces its pid). Errors are logged, never raised out of the thread.
    """

    def __init__(self, run_dir: str | os.PathLike[str], node: int, interval_s: float = 2.0):
        super().__init__(name=f"node-sampler-{node}", daemon=True)
        self.events_dir = Path(run_dir) / "events"
        self.node = node
        self.interval_s = interval_s
        self.rank_pids: dict[int, int] = {}
        self._stop_event = threading.Event()
        self._ranks_tail = DirTail(self.events_dir, kinds=("rank",))

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout_s)

    def run(self) -> None:
        try:
            gpu = GpuSampler()
        except Exception:
            log.exception("node sampler %d: GPU sampler failed to start", self.node)
            return
        psutil.cpu_percent(interval=None)  # primes the CPU counter; the first line then covers one interval
        path = self.events_dir / f"node{self.node}.jsonl"
        try:
            while not self._stop_event.wait(self.interval_s):
                try:
                    self._discover_pids()
                    line = json.dumps(sample_node(self.node, gpu, self.rank_pids))
                    self.events_dir.mkdir(parents=True, exist_ok=True)
                    # Opened per line: cheap at this rate, and a deleted or rotated file is simply recreated.
                    with open(path, "a", encoding="utf-8") as f:
                        f.write(line + "\n")
                        f.flush()
                except Exception:
                    log.exception("node sampler %d: sample failed", self.node)
        finally:
            gpu.close()

    def _discover_pids(self) -> None:
        for _, rec in self._ranks_tail.read_new():
            if rec.get("event") != "start" or rec.get("node_rank") != self.node:
                continue
            rank, pid = rec.get("rank"), rec.get("pid")
            if isinstance(rank, int) and isinstance(pid, int):
                self.rank_pids[rank] = pid


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runner.sampler", description=__doc__)
    parser.add_argument("--once", action="store_true", help="print one node line as JSON and exit")
    parser.add_argument("--run-dir", type=Path, help="run directory to sample into (without --once)")
    parser.add_argument("--node", type=int, default=int(os.environ.get("NODE_RANK", "0")))
    parser.add_argument("--interval-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.once:
        gpu = GpuSampler()
        try:
            psutil.cpu_percent(interval=None)
            time.sleep(0.2)  # so that cpu_pct covers a real interval
            print(json.dumps(sample_node(args.node, gpu, {})))
        finally:
            gpu.close()
        return
    if args.run_dir is None:
        parser.error("--run-dir is required unless --once")
    sampler = NodeSampler(args.run_dir, args.node, args.interval_s)
    sampler.start()
    try:
        while sampler.is_alive():
            sampler.join(1.0)
    except KeyboardInterrupt:
        sampler.stop()


if __name__ == "__main__":
    main()
