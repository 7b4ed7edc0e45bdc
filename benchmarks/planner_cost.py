"""What the planner's pricing costs in CPU: every candidate of the autotune test's matrix priced once (6 catalog
architectures × 3 GPU types × 3 block lengths × 1 and 8 ranks, as tests/unit/test_autotune.py's brute force does),
the cost behind the wizard's plan, `runner estimate` and the planner's tests.

    python benchmarks/planner_cost.py [--repeats 5] [--baseline PATH] [--out benchmarks/planner-cost-cpu]

Each measurement runs in a fresh interpreter (`time.process_time` around the pricing; the specs and the catalog's
architectures are loaded before it). `--baseline PATH`: another checkout of this repository (e.g. a `git worktree`
of an earlier commit), measured alternately with this one so that both see the same machine: a shared 2-core
machine's speed drifts by a fifth within the hour.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from tui_dashboard import machine  # noqa: E402 (this folder is no package)

MEASURE = r"""
import json, os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, sys.argv[1])
from runner.facts import catalog
catalog._from_cache = lambda model_id, revision: None  # the catalog's own configs, never a local hub cache
from tests.unit.test_autotune import ARCHS, ATTN_LEN, DOC_LEN, GPUS, LENGTHS, WORLDS, gpu_spec
from runner.plan import autotune
assert autotune.__file__.startswith(sys.argv[1]), autotune.__file__  # that checkout's runner, not the installed one
setups = [autotune.setup(gpu_spec(a, g, n, w), DOC_LEN, ATTN_LEN)
          for a in ARCHS for g in GPUS for n in LENGTHS for w in WORLDS]
t = time.process_time()
priced = sum(len([pricer.price(c, i) for i, c in enumerate(space.candidates())]) for space, pricer, _ in setups)
print(json.dumps({"cpu_s": time.process_time() - t, "candidates": priced, "setups": len(setups)}))
"""


def measure(repo: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(repo)], cwd=repo, capture_output=True, text=True,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def commit(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "?"


def to_markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = ["# The planner's pricing on CPU (every candidate of the autotune test's matrix)", "",
             f"Command: `{result['command']}`", "",
             f"Machine: {m['cores']} CPU cores ({m['cpu']}), {m['ram_gib']} GiB RAM, no GPU ({m['os']}).", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
             f"Median of {result['repeats']} fresh interpreters each, measured alternately.", "",
             "| checkout | candidates | CPU s | µs a candidate |", "| --- | --- | --- | --- |"]
    for name, runs in result["runs"].items():
        cpu = statistics.median(r["cpu_s"] for r in runs)
        n = runs[0]["candidates"]
        lines.append(f"| {name} | {n:,} | {cpu:.2f} | {cpu / n * 1e6:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another checkout, measured alternately with this one")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "planner-cost-cpu")
    a = ap.parse_args()
    repos = {f"this ({commit(REPO)})": REPO}
    if a.baseline:
        repos = {f"baseline ({commit(a.baseline)})": a.baseline.resolve(), **repos}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in repos}
    for i in range(a.repeats):
        for name, repo in repos.items():
            print(f"{i + 1}/{a.repeats} {name} ...", file=sys.stderr, flush=True)
            runs[name].append(measure(repo))
    result = {"command": " ".join(["python", "benchmarks/planner_cost.py", *sys.argv[1:]]), "repeats": a.repeats,
              "machine": machine(), "runs": runs,
              "versions": {"python": sys.version.split()[0], "pydantic": metadata.version("pydantic")}}
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a.out.with_suffix(".md").write_text(to_markdown(result))
    print(to_markdown(result))


if __name__ == "__main__":
    main()
