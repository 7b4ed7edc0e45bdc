"""Native `auto` precision against pure bf16 and TRL's best at equal learning, on one H200: runs and checks the rows.

What it measures, for the Llama-3.2-3B layout and the 1.72B Qwen3 (the bench recipes, on their long-chat data), at
8,192 and 32,768 tokens per block, 30 steps (3 warm-up + 27 timed) at constant lr 1e-5 from the same random init,
seed and blocks:
  * one `runner bench` call with `--engines native,trl --sweep train.optimizer_precision=auto,bf16`: native `auto`
    (bf16 weights: bf16_stochastic), native plain `bf16` (the old rows' policy) and TRL's plain module (fp32 master
    weights; a trl row ignores the native precision and says so) in one table, whose loss at step 30 is compared
    (the table lists a pair more than 5% apart as unequal learning);
  * at 32,768 a second call for TRL wrapped in FSDP2 on its one GPU (`train.fsdp_one_rank=true`), its best there;
  * then the acceptance, per model and length: native auto's loss at step 30 within 3% of TRL's best (the faster of
    its rows), its tokens/s within 2% of pure bf16's, and its peak allocated memory no higher than TRL's best.
`hardware.gpu=auto` lets the same rows run on an H100 (80 GB) as on the H200 they were planned for; each row names
the GPU it ran on. Native runs as its recipe says (compiled layers, fused loss; at 8k `train.recompute_layers=8` as in
throughput-h200.md's latest rows).

Run on one H200 (or H100) from the repository root, with the wheels the image lacks installed first (downloaded by
benchmarks/device_wheels.sh, whose header has the install line), one model and length per device call if the
10-minute limit bites (PRECISION_SKIP_WRAPPED=1 leaves out the wrapped TRL row):

    python3 benchmarks/precision_h200.py --only llama-3.2-3b:32768 --out $OUT
    python3 benchmarks/precision_h200.py --out $OUT          # all four, then the summary
    python3 benchmarks/precision_h200.py --check-only --out DIR   # the summary of rows already measured

The bench JSON/Markdown files and precision-summary.md land in --out; commit them under benchmarks/bench-h200/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MODELS = {"llama-3.2-3b": "llama-3.2-3b-bench-h200", "qwen3-1.7b": "qwen3-1.7b-bench-h200"}
LENGTHS = (8192, 32768)
WARMUP, STEPS = 3, 27  # the last timed step is step 30
LOSS_WITHIN, SPEED_WITHIN = 0.03, 0.02


VARLEN_KERNEL = ["--set", "model.varlen_kernel=auto"]
"""Set from --varlen-kernel: `torch` keeps rows comparable with rows measured where flash-attn-4 was not installed
(the committed precision-h200/ rows), whatever this machine has."""


def bench(recipe: str, name: str, out: Path, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "runner", "bench", recipe, *args, *VARLEN_KERNEL, "--set", "train.lr=1e-5",
           "--set", "train.schedule=constant", "--warmup", str(WARMUP), "--steps", str(STEPS),
           "--set", "hardware.gpu=auto", "--runs-dir", "/tmp/runs", "--records-dir", "/tmp/records", "--out", str(out), "--name", name]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def measure(model: str, seq: int, out: Path, engines: str = "native,trl") -> None:
    recipe = MODELS[model]
    extra = ["--set", "train.recompute_layers=8"] if seq == 8192 else []
    name = f"precision-{model}-{seq}" + ("-native" if engines == "native" else "")
    bench(recipe, name, out, ["--engines", engines, "--sweep", f"train.seq_len={seq}",
                              "--sweep", "train.optimizer_precision=auto,bf16", *extra])
    if seq == 32768 and "trl" in engines and not os.environ.get("PRECISION_SKIP_WRAPPED"):
        bench(recipe, f"precision-{model}-{seq}-trl-wrapped", out,
              ["--engines", "trl", "--sweep", f"train.seq_len={seq}", "--set", "train.fsdp_one_rank=true"])
    # Native plans for the whole GPU and spends what TRL leaves unused on speed; the same pair held to TRL's best
    # peak (hardware.memory_gib) is the comparison at equal memory.
    trl = [r for r, _ in _rows(model, seq, out) if r["engine"] == "trl"]
    if trl:
        cap = max(trl, key=lambda r: r["tokens_per_s"])["peak_alloc_gib"]
        bench(recipe, f"precision-{model}-{seq}-native-at-trl-memory", out,
              ["--engines", "native", "--sweep", f"train.seq_len={seq}", "--sweep",
               "train.optimizer_precision=auto,bf16", "--set", f"hardware.memory_gib={cap:.1f}", *extra])


def _rows(model: str, seq: int, out: Path) -> list[tuple[dict, bool]]:
    """The succeeded rows in `out` for a model and length, each with whether it was held to TRL's memory. A "-native"
    file re-measured the native rows after a native change: its rows come later and win over the first file's."""
    rows = []
    for f in sorted(out.glob(f"precision-{model}-{seq}*.json"), key=lambda f: ("-native" in f.name, f.name)):
        rows += [(r, "-at-trl-memory" in f.name) for r in json.loads(f.read_text())["rows"]
                 if r.get("status") == "succeeded"]
    return rows


def _precision(row: dict) -> str | None:
    return (row.get("choices") or {}).get("optimizer_precision")


def check(model: str, seq: int, out: Path) -> dict | None:
    """The acceptance for one model and length from the rows in `out`; None while they are not all there."""
    rows = _rows(model, seq, out)
    native = {_precision(r): r for r, capped in rows if r["engine"] == "native" and not capped}
    at_trl = {_precision(r): r for r, capped in rows if r["engine"] == "native" and capped}
    trl = [r for r, _ in rows if r["engine"] == "trl"]
    auto, pure = native.get("bf16_stochastic") or native.get("fp32_master"), native.get("bf16")
    if not (auto and pure and trl):
        return None
    best = max(trl, key=lambda r: r["tokens_per_s"])
    loss_gap = (auto["last_loss"] - best["last_loss"]) / best["last_loss"]
    speed_gap = (auto["tokens_per_s"] - pure["tokens_per_s"]) / pure["tokens_per_s"]
    capped = at_trl.get(_precision(auto))
    # Memory: native's own plan, or else the same precision held to TRL's peak.
    memory_row = auto if auto["peak_alloc_gib"] <= best["peak_alloc_gib"] or not capped else capped
    return {"model": model, "seq_len": seq, "auto": _precision(auto), "step": auto["last_step"],
            "loss": [auto["last_loss"], pure["last_loss"], best["last_loss"]],
            "tokens_per_s": [auto["tokens_per_s"], pure["tokens_per_s"], best["tokens_per_s"]],
            "peak_alloc_gib": [auto["peak_alloc_gib"], pure["peak_alloc_gib"], best["peak_alloc_gib"]],
            "trl_best": "wrapped" if best["spec"].get("fsdp_one_rank") is True else "plain",
            "at_trl_memory": [capped["tokens_per_s"], capped["peak_alloc_gib"], capped["last_loss"]] if capped else None,
            "loss_ok": abs(loss_gap) <= LOSS_WITHIN, "speed_ok": speed_gap >= -SPEED_WITHIN,
            "memory_ok": memory_row["peak_alloc_gib"] <= best["peak_alloc_gib"],
            "loss_gap": round(loss_gap, 4), "speed_gap": round(speed_gap, 4)}


def _held(row: list | None) -> str:
    return "not run" if row is None else f"{row[0]:,.0f}, {row[1]:.1f}, {row[2]:.3f}"


def summary(results: list[dict]) -> str:
    lines = ["| model, tokens per block | loss at the last step: native auto / pure bf16 / TRL's best | tokens/s: "
             "auto / pure bf16 / TRL's best | peak alloc GiB: auto / pure bf16 / TRL's best | auto within 3% of "
             "TRL's loss | within 2% of pure bf16's speed | memory ≤ TRL's | auto held to TRL's peak: tokens/s, "
             "peak GiB, loss |", "|" + " --- |" * 8]
    for r in results:
        def trio(k: str, fmt: str, r: dict = r) -> str:
            return " / ".join(fmt.format(v) for v in r[k])
        lines.append(f"| {r['model']}, {r['seq_len']:,} ({r['auto']}; TRL {r['trl_best']}; step {r['step']}) "
                     f"| {trio('loss', '{:.3f}')} | {trio('tokens_per_s', '{:,.0f}')} "
                     f"| {trio('peak_alloc_gib', '{:.1f}')} | {'yes' if r['loss_ok'] else 'NO'} "
                     f"({r['loss_gap']:+.1%}) | {'yes' if r['speed_ok'] else 'NO'} ({r['speed_gap']:+.1%}) "
                     f"| {'yes' if r['memory_ok'] else 'NO'} | {_held(r['at_trl_memory'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/bench-h200"))
    ap.add_argument("--only", action="append", default=[], help="MODEL:SEQ_LEN, e.g. llama-3.2-3b:32768 (repeatable)")
    ap.add_argument("--check-only", action="store_true", help="summarise the rows already in --out")
    ap.add_argument("--native-only", action="store_true",
                    help="measure the native rows only (after a native change: TRL's rows already in --out stand)")
    ap.add_argument("--varlen-kernel", choices=("auto", "torch", "flash-attn-4"), default="auto",
                    help="model.varlen_kernel for every row (torch: as the committed precision-h200/ rows ran)")
    a = ap.parse_args()
    VARLEN_KERNEL[-1] = f"model.varlen_kernel={a.varlen_kernel}"
    todo = [(m, s) for m in MODELS for s in LENGTHS]
    if a.only:
        todo = [(o.split(":")[0], int(o.split(":")[1])) for o in a.only]
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.check_only:
        for model, seq in todo:
            measure(model, seq, a.out, "native" if a.native_only else "native,trl")
    results = [r for m, s in todo if (r := check(m, s, a.out))]
    text = summary(results)
    (a.out / "precision-summary.md").write_text(text)
    print(text)
    return 0 if results and all(r["loss_ok"] and r["speed_ok"] and r["memory_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
