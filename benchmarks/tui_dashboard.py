"""Benchmark of the TUI under load: dashboard CPU and event-to-screen delay while 8 ranks log 10 steps/s and a node
sampler reports 8 GPUs at 2 Hz, and the time until `sft-tui` shows its first screen. Needs tmux (the real binary
runs in a pane, read back with capture-pane).

    python benchmarks/tui_dashboard.py [--seconds 20] [--out benchmarks/tui]   # writes tui.json and tui.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from runner.events.lines import is_step

REPO = Path(__file__).resolve().parent.parent
CPU_TARGET_PCT = 10.0
DELAY_TARGET_S = 1.0
FIRST_SCREEN_TARGET_S = 1.5


# -- the event writer (a separate process, so its CPU is not the TUI's) -----------------------------------------


def write_events(run_dir: Path, seconds: float, ranks: int, rate_hz: float, gpus: int, gpu_hz: float) -> None:
    """Step k of every rank is written at t0 + k / rate_hz (its `t`); a node line every 1 / gpu_hz."""
    events = run_dir / "events"
    events.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    for r in range(ranks):
        (run_dir / "logs" / f"rank{r}.log").write_text(f"[rank {r}] benchmark writer\n")
    files = [open(events / f"rank{r}.jsonl", "a", buffering=1) for r in range(ranks)]
    node = open(events / "node0.jsonl", "a", buffering=1)
    total_steps = int(seconds * rate_hz)
    t0 = time.time() + 0.5
    for r, f in enumerate(files):
        f.write(json.dumps({"event": "start", "t": time.time(), "rank": r, "local_rank": r, "node_rank": 0,
                            "world_size": ranks, "pid": os.getpid(), "host": "bench", "max_steps": total_steps}) + "\n")
    next_node = t0
    step = 1
    while step <= total_steps:
        now = time.time()
        due = t0 + step / rate_hz
        if next_node <= now:
            node.write(json.dumps(_node_line(next_node, gpus, ranks)) + "\n")
            next_node += 1.0 / gpu_hz
        elif due <= now:
            t = round(now, 3)
            for r, f in enumerate(files):
                loss = 6.0 * 0.995 ** step + 0.05 * ((step * (r + 3)) % 7) / 7
                f.write(json.dumps({"t": t, "rank": r, "step": step, "loss": loss, "lr": 1e-4, "grad_norm": 1.0,
                                    "tokens": 32768, "step_s": 1.0 / rate_hz, "mem_gib": 60.0 + r}) + "\n")
            step += 1
        else:
            time.sleep(min(due, next_node) - now)
    for r, f in enumerate(files):
        f.write(json.dumps({"event": "end", "t": time.time(), "rank": r, "step": total_steps}) + "\n")
        f.close()
    node.close()


def _node_line(t: float, gpus: int, ranks: int) -> dict[str, Any]:
    return {"t": t, "node": 0, "host": "bench", "cpu_pct": 40.0, "ram_used_gib": 300.0, "ram_total_gib": 2000.0,
            "rank_rss_gib": {str(r): 8.0 for r in range(ranks)},
            "gpus": [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "util_pct": 90.0 + (t * 7 + i) % 9,
                      "mem_used_gib": 61.0 + i, "mem_total_gib": 140.4, "temp_c": 60 + i, "power_w": 600.0,
                      "sm_clock_mhz": 1980, "ranks": [i] if i < ranks else []} for i in range(gpus)]}


# -- driving the real binary in tmux -------------------------------------------------------------------------


class Pane:
    """One detached tmux pane on a private server, running `argv` directly (the pane's pid is the program's)."""

    count = 0

    def __init__(self, argv: list[str], width: int = 120, height: int = 40) -> None:
        Pane.count += 1
        self.socket = f"sft-tui-bench-{os.getpid()}-{Pane.count}"
        cmd = " ".join(_quote(a) for a in argv)
        self._tmux("new-session", "-d", "-s", "b", "-x", str(width), "-y", str(height), "-c", str(REPO),
                   f"exec env TERM=xterm-256color {cmd}")
        self.pid = int(self._tmux("display-message", "-p", "-t", "b", "#{pane_pid}").strip())

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True).stdout

    def text(self) -> str:
        try:
            return self._tmux("capture-pane", "-p", "-t", "b")
        except subprocess.CalledProcessError:
            return ""

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def first_screen_s(binary: str, repeats: int = 3) -> list[float]:
    """Seconds from starting `sft-tui --recipe tiny-cpu` until the wizard's step list is on screen."""
    out = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            pane = Pane([binary, "--recipe", "tiny-cpu", "--runs-dir", f"{tmp}/runs", "--records-dir",
                         f"{tmp}/records"])
            try:
                while "6 Launch" not in pane.text():
                    if time.perf_counter() - t0 > 30:
                        raise RuntimeError("sft-tui showed no wizard within 30 s")
                    time.sleep(0.01)
                out.append(time.perf_counter() - t0)
            finally:
                pane.close()
    return out


def dashboard_load(binary: str, seconds: float, ranks: int, rate_hz: float, gpus: int, gpu_hz: float,
                   capture_hz: float = 20.0) -> dict[str, Any]:
    """CPU of the sft-tui process and the delay from a step being written to the screen showing it."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "runs" / "20260101-000000-bench-000000"
        (run_dir / "events").mkdir(parents=True)
        pane = Pane([binary, "--watch", str(run_dir), "--runs-dir", f"{tmp}/runs", "--records-dir", f"{tmp}/records"])
        try:
            proc = psutil.Process(pane.pid)
            time.sleep(2.0)  # startup is measured separately
            writer = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--write", str(run_dir),
                                       "--seconds", str(seconds), "--ranks", str(ranks), "--rate-hz", str(rate_hz),
                                       "--gpus", str(gpus), "--gpu-hz", str(gpu_hz)], cwd=REPO)
            shown: list[tuple[float, int]] = []
            cpu_start = None
            warmup_s = 2.0
            t_begin = time.time()
            while writer.poll() is None:
                now = time.time()
                if cpu_start is None and now - t_begin > warmup_s:
                    cpu_start = (now, sum(proc.cpu_times()[:2]))
                m = re.search(r"step (\d+)/", pane.text())
                if m:
                    shown.append((time.time(), int(m.group(1))))
                time.sleep(max(0.0, 1.0 / capture_hz - (time.time() - now)))
            cpu_end = (time.time(), sum(proc.cpu_times()[:2]))
            rss_mib = proc.memory_info().rss / 2**20
            tail_end = time.time() + 1.5  # the last steps written still have to reach the screen
            while time.time() < tail_end:
                m = re.search(r"step (\d+)/", pane.text())
                if m:
                    shown.append((time.time(), int(m.group(1))))
                time.sleep(1.0 / capture_hz)
        finally:
            pane.close()
        written = _written_times(run_dir / "events" / "rank0.jsonl")
    assert cpu_start is not None, "the writer ended before the measurement window"
    delays = []
    for step, t_written in written.items():
        first = next((t for t, s in shown if s >= step), None)
        if first is not None:
            delays.append(max(0.0, first - t_written))
    cpu_pct = 100.0 * (cpu_end[1] - cpu_start[1]) / (cpu_end[0] - cpu_start[0])
    return {"cpu_pct": round(cpu_pct, 2), "window_s": round(cpu_end[0] - cpu_start[0], 1),
            "delay_p50_s": round(statistics.median(delays), 3), "delay_p95_s": round(_pct(delays, 95), 3),
            "delay_max_s": round(max(delays), 3), "steps_seen": len(delays), "steps_written": len(written),
            "capture_period_s": round(1.0 / capture_hz, 3), "rss_mib": round(rss_mib, 1)}


def _written_times(path: Path) -> dict[int, float]:
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if is_step(rec):
            out[rec["step"]] = rec["t"]
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("textual", "rich", "sft-tui"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    out["tmux"] = subprocess.run(["tmux", "-V"], capture_output=True, text=True).stdout.strip().removeprefix("tmux ")
    return out


def machine() -> dict[str, Any]:
    return {"cpu": platform.processor() or platform.machine(), "cores": psutil.cpu_count(logical=True),
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1), "os": platform.platform(), "gpu": None}


def to_markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = ["# TUI benchmark", "", f"Command: `{result['command']}`", "",
             f"Machine: {result['machine']['cores']} CPU cores, {result['machine']['ram_gib']} GiB RAM, no GPU "
             f"({result['machine']['os']}).", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
             f"Load: {result['load']['ranks']} ranks × {result['load']['rate_hz']:g} step events/s and "
             f"{result['load']['gpus']} GPUs at {result['load']['gpu_hz']:g} Hz, replayed from files for "
             f"{result['load']['seconds']:g} s into `sft-tui --watch` (the real binary in a 120×40 tmux pane).", "",
             "| measure | value | target | ok |", "| --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['value']} {r['unit']} | {r['target']} | {'yes' if r['ok'] else 'NO'} |")
    lines += ["", "CPU is the sft-tui process's user+system time over the window (after a 2 s warm-up), as % of one "
              "core. The delay is from a step's `t` (when the writer wrote it) to the first screen capture showing the "
              "run line at that step; captures are every "
              f"{result['load']['capture_period_s'] * 1000:.0f} ms, so the delay is resolved to that.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/tui_dashboard.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rate-hz", type=float, default=10.0)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--gpu-hz", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "tui", help="writes OUT.json and OUT.md")
    p.add_argument("--binary", default=str(Path(sys.executable).with_name("sft-tui")))
    p.add_argument("--write", type=Path, metavar="RUN_DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write:
        write_events(args.write, args.seconds, args.ranks, args.rate_hz, args.gpus, args.gpu_hz)
        return 0
    if shutil.which("tmux") is None:
        print("error: this benchmark drives sft-tui in tmux; install tmux", file=sys.stderr)
        return 2
    starts = first_screen_s(args.binary)
    load = dashboard_load(args.binary, args.seconds, args.ranks, args.rate_hz, args.gpus, args.gpu_hz)
    first = statistics.median(starts)
    rows = [
        {"name": "dashboard CPU (8 ranks × 10 events/s, 8 GPUs at 2 Hz)", "value": load["cpu_pct"],
         "unit": "% of one core", "target": f"< {CPU_TARGET_PCT:g}%", "ok": load["cpu_pct"] < CPU_TARGET_PCT},
        {"name": "event written → on screen, p50", "value": load["delay_p50_s"], "unit": "s",
         "target": f"< {DELAY_TARGET_S:g} s", "ok": load["delay_p50_s"] < DELAY_TARGET_S},
        {"name": "event written → on screen, p95", "value": load["delay_p95_s"], "unit": "s",
         "target": f"< {DELAY_TARGET_S:g} s", "ok": load["delay_p95_s"] < DELAY_TARGET_S},
        {"name": "event written → on screen, max", "value": load["delay_max_s"], "unit": "s",
         "target": f"< {DELAY_TARGET_S:g} s", "ok": load["delay_max_s"] < DELAY_TARGET_S},
        {"name": "time to first screen (`sft-tui --recipe tiny-cpu`, median of 3)", "value": round(first, 3),
         "unit": "s", "target": f"< {FIRST_SCREEN_TARGET_S:g} s", "ok": first < FIRST_SCREEN_TARGET_S},
    ]
    result = {"command": " ".join(["python benchmarks/tui_dashboard.py", *(argv if argv is not None else sys.argv[1:])]),
              "gpu": None, "machine": machine(), "versions": versions(),
              "load": {"seconds": args.seconds, "ranks": args.ranks, "rate_hz": args.rate_hz, "gpus": args.gpus,
                       "gpu_hz": args.gpu_hz, **load},
              "first_screen_s": [round(s, 3) for s in starts], "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(to_markdown(result))
    print(to_markdown(result))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
