"""Per-step times and recompiles of the runs under a runs folder, for finding where slow steps come from.

    python3 benchmarks/step_times.py /tmp/runs --out $OUT/step-times.json

For each run folder: the run's spec name and levers, rank 0's step_s and tokens per step in order, the steps slower
than twice the median after the warm-up, and the dynamo recompile lines its rank logs hold (TORCH_LOGS=recompiles).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def run_rows(run_dir: Path, warmup: int) -> dict:
    events = run_dir / "events" / "rank0.jsonl"
    steps = []
    for line in events.read_text().splitlines() if events.exists() else []:
        e = json.loads(line)
        if "event" not in e and e.get("step_s") is not None:
            steps.append({"step": e["step"], "step_s": e["step_s"], "tokens": e.get("tokens"), "loss": e.get("loss")})
    spec = json.loads((run_dir / "spec.json").read_text()) if (run_dir / "spec.json").exists() else {}
    timed = [s["step_s"] for s in steps[warmup:]]
    med = statistics.median(timed) if timed else 0.0
    logs = sorted((run_dir / "logs").glob("rank*.log")) if (run_dir / "logs").exists() else []
    recompiles = [ln for f in logs for ln in f.read_text(errors="replace").splitlines()
                  if "ecompil" in ln or "guard" in ln.lower() and "fail" in ln.lower()]
    return {"run": run_dir.name, "engine": spec.get("engine"), "seq_len": spec.get("train", {}).get("seq_len"),
            "steps": steps, "median_step_s": med,
            "spread_after_warmup": (max(timed) / min(timed)) if timed else None,
            "slow_steps": [s for s in steps[warmup:] if med and s["step_s"] > 2 * med],
            "recompile_lines": recompiles[:200], "recompile_count": len(recompiles)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    rows = [run_rows(d, a.warmup) for d in sorted(a.runs.iterdir()) if d.is_dir()]
    a.out.write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(f"{r['run']}: {r['engine']} seq {r['seq_len']}: {len(r['steps'])} steps, median {r['median_step_s']:.3f} s, "
              f"max/min after warm-up {r['spread_after_warmup'] or 0:.2f}, slow {[s['step'] for s in r['slow_steps']]}, "
              f"recompile lines {r['recompile_count']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
