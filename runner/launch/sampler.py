"""Per-node GPU/CPU sampler: NVML (nvidia-ml-py) when present, psutil always; appends to events/node<n>.jsonl."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from runner.events.lines import StartEvent, parse_event
from runner.events.paths import RunPaths
from runner.events.tail import DirTail
from runner.facts.nvml import GpuSampler

log = logging.getLogger(__name__)

GIB = 1024**3


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
        self.paths = RunPaths(Path(run_dir))
        self.events_dir = self.paths.events
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
        path = self.paths.node_events(self.node)
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
        for _, line in self._ranks_tail.read_new():
            ev = parse_event(line)
            if not isinstance(ev, StartEvent) or ev.node_rank != self.node:
                continue
            if ev.rank is not None and ev.pid is not None:
                self.rank_pids[ev.rank] = ev.pid


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runner.launch.sampler", description=__doc__)
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
