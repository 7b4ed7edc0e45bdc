"""What one short run of the embedded default costs in CPU, by process, and what a rank spends importing: the floor
under every test that launches a run (the full suite starts about 90 of them on two cores).

    python benchmarks/launch_cost.py [--steps 12] [--repeats 3] [--out benchmarks/launch-cost-cpu]  # .json and .md

Part 1 runs `python -m runner run tiny-cpu --set train.max_steps=STEPS` (the CLI as a subprocess, as the fault and
SLURM tests start it) `--repeats` times and samples its whole process tree every 50 ms (psutil: user+system CPU of
each process at its last sample, so a process's last 50 ms may be missed). Part 2 times, in fresh interpreters, the
imports a rank makes before its first step, in four groups, each timed after the groups before it
(`time.process_time` around each; what a group shares with an earlier one is counted there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tui_dashboard import machine  # noqa: E402 (this folder is no package)

REPO = Path(__file__).resolve().parent.parent
IMPORT_GROUPS = [  # (name, statement): what a rank imports, timed in this order
    ("torch, DTensor and FSDP2", "import torch, torch.distributed.tensor, torch.distributed.fsdp"),
    ("transformers' modeling", "from transformers import PreTrainedModel, AutoModelForCausalLM"),
    ("the runner's rank modules", "import runner.train.runtime, runner.train.native, runner.train.data"),
    ("datasets", "import datasets"),
]


def role(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    if "torch.distributed.run" in text:
        return "torchrun"
    if "runner.launch.supervisor" in text:
        return "supervisor"
    if "runner.train" in text:
        return "rank"
    return "cli" if "runner" in text else "other"


def one_launch(steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="launch-cost-") as tmp:
        argv = [sys.executable, "-m", "runner", "run", "tiny-cpu", "--set", f"train.max_steps={steps}", "--plain",
                "--runs-dir", f"{tmp}/runs", "--records-dir", f"{tmp}/records"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        root, seen = psutil.Process(proc.pid), {}
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                tree = [root]
            for p in tree:
                try:
                    with p.oneshot():
                        c = p.cpu_times()
                        seen[p.pid] = (role(p.cmdline()), c.user + c.system)
                except psutil.Error:
                    continue
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"the run failed with exit code {proc.returncode}: {' '.join(argv)}")
    by_role: dict[str, float] = {}
    for r, cpu in seen.values():
        by_role[r] = by_role.get(r, 0.0) + cpu
    ranks = sum(1 for r, _ in seen.values() if r == "rank")
    return {"wall_s": wall, "cpu_s": sum(by_role.values()), "by_role": by_role, "ranks": ranks}


def import_times() -> dict[str, float]:
    code = ("import json, time\nout = {}\n" + "".join(
        f"t = time.process_time()\n{stmt}\nout[{name!r}] = time.process_time() - t\n" for name, stmt in IMPORT_GROUPS)
        + "print(json.dumps(out))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def to_markdown(result: dict[str, Any]) -> str:
    m, launches = result["machine"], result["launches"]
    med = lambda xs: statistics.median(xs)  # noqa: E731
    roles = [r for r in ("cli", "supervisor", "torchrun", "rank", "other")
             if med([x["by_role"].get(r, 0.0) for x in launches]) >= 0.05]
    lines = [f"# The CPU one short run costs ({result['steps']} steps of the embedded default on 2 CPU ranks)", "",
             f"Command: `{result['command']}`", "",
             f"Machine: {m['cores']} CPU cores ({m['cpu']}), {m['ram_gib']} GiB RAM, no GPU ({m['os']}).", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
             f"## One launch (median of {len(launches)})", "",
             "| process | CPU s |", "| --- | --- |"]
    lines += [f"| {r}{' (each of 2)' if r == 'rank' else ''} | "
              f"{med([x['by_role'].get(r, 0.0) / (x['ranks'] if r == 'rank' else 1) for x in launches]):.1f} |"
              for r in roles]
    lines += [f"| **all** | **{med([x['cpu_s'] for x in launches]):.1f}** |", "",
              f"Wall time {med([x['wall_s'] for x in launches]):.1f} s.", "",
              f"## What a rank imports before its first step (median of {len(result['imports'])} fresh interpreters)",
              "", "| imports | CPU s |", "| --- | --- |"]
    lines += [f"| {name} | {med([x[name] for x in result['imports']]):.2f} |" for name, _ in IMPORT_GROUPS]
    total = med([sum(x.values()) for x in result["imports"]])
    lines += [f"| **all** | **{total:.2f}** |", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "launch-cost-cpu")
    a = ap.parse_args()
    launches, imports = [], []
    for i in range(a.repeats):
        print(f"launch {i + 1}/{a.repeats} ...", file=sys.stderr, flush=True)
        launches.append(one_launch(a.steps))
        imports.append(import_times())
    result = {"command": " ".join(["python", "benchmarks/launch_cost.py", *sys.argv[1:]]), "steps": a.steps,
              "machine": machine(), "launches": launches, "imports": imports,
              "versions": {"python": sys.version.split()[0],
                           **{p: metadata.version(p) for p in ("torch", "transformers", "datasets", "torchao")}}}
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a.out.with_suffix(".md").write_text(to_markdown(result))
    print(to_markdown(result))


if __name__ == "__main__":
    main()
