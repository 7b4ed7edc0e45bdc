"""On a GPU: launch short runs of a bench recipe on both engines and check that every rank obeyed the decisions made
before launch (each rank's `train_begin` echoes `runs/<id>/decisions.json` whole, and the attention, loss, wrapping
and levers it reports are the file's), and that the record keeps the same decisions.

    python3 benchmarks/decisions_gpu_check.py --out $OUT          # a few minutes on an H100 or H200

Writes `decisions-gpu-check.json` to --out (per run: status, decisions, what the ranks reported, the losses) and
exits 1 when a rank's echo differs from the file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def obeyed(run_dir: Path) -> dict:
    written = json.loads((run_dir / "decisions.json").read_text())
    ranks = {}
    for path in sorted((run_dir / "events").glob("rank*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        begin = next((e for e in events if e.get("event") == "train_begin"), None)
        ranks[path.stem] = {
            "echo_equals_file": begin is not None and begin.get("decisions") == written,
            "reported": None if begin is None else {k: begin.get(k) for k in ("attn", "loss_impl", "fsdp_sharded",
                                                                              "levers", "liger_kernels")},
            "losses": [e.get("loss") for e in events if "event" not in e and e.get("loss") is not None],
        }
    return {"decisions": written, "ranks": ranks,
            "obeyed": bool(ranks) and all(r["echo_equals_file"] for r in ranks.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--recipe", default="llama-3.2-3b-bench-h200")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/decisions-runs"))
    ap.add_argument("--engines", default="native,trl", help="comma-separated (default native,trl)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for engine in args.engines.split(","):
        argv = [sys.executable, "-m", "runner", "run", args.recipe, "--set", f"engine={engine}",
                "--set", f"train.max_steps={args.steps}", "--set", f"train.seq_len={args.seq_len}",
                "--set", "hardware.gpu=auto", "--runs-dir", str(args.runs_dir),
                "--records-dir", str(args.runs_dir / "records"), "--json", "--plain"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        last = next((json.loads(line) for line in reversed(done.stdout.splitlines()) if line.startswith("{")), {})
        row = {"engine": engine, "exit": done.returncode, "status": last.get("status"),
               "tail": (done.stdout + done.stderr)[-3000:]}
        if last.get("record"):
            record = json.loads(Path(last["record"]).read_text())
            run_dir = Path(record["run_dir"])
            row.update(obeyed(run_dir))
            row["record_keeps_them"] = record.get("decisions") == row["decisions"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("tail", "decisions")}, default=str)[:2000])
    (args.out / "decisions-gpu-check.json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows},
                                                                  indent=1))
    return 0 if all(r.get("obeyed") and r.get("record_keeps_them") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
