"""Autotune on one H200: specs that name only model, data, hardware and tokens per block, against a manual sweep and
against the bench recipes' hand-tuned rows. Runs `runner bench` and checks the rows.

Two parts, each per model and block length (8,192 and 32,768 tokens), native engine, random init, the bench's
long-conversation data (recipes/embedded/data/long-chat.jsonl.gz), 3 warm-up + 10 timed steps:

  * layouts: two dense layouts the project does not ship, written as config.json from transformers' config classes
    with their published sizes (Mistral-7B-v0.3: MistralConfig; Qwen2.5-7B: Qwen2Config) into a temporary folder
    with the embedded tokenizer. The spec sets model, dataset, hardware and train.seq_len only: every speed lever is
    auto. Then a small manual sweep of the same spec: no recompute, and recompute of 1/4, 1/2, 3/4 and all of the
    layers, each with compiled layers and the fused loss. Acceptance: auto does not run out of memory, and its
    tokens/s is within 5% of the fastest manual row that ran (or faster).
  * recipes: each bench recipe (recipes/*-bench-h200.yaml) with its levers auto, and with the hand-tuned values it
    was measured with before (recompute 24 of 28 layers for the 1.72B, 30 of 36 for the 4B, 20 of 28 with attention
    outputs kept for the Llama-3.2-3B layout; 8 layers at 8k; compiled layers, fused loss). Acceptance: auto's
    tokens/s within 2% of the hand-tuned row (or faster).

Run from the repository root on the GPU machine (wheels: benchmarks/device_wheels.sh), one part or case per device
call if the 10-minute limit bites; rows already in --out are not measured again:

    python3 benchmarks/autotune_h200.py --out $OUT                        # everything, then the summary
    python3 benchmarks/autotune_h200.py --only layouts:mistral-7b:8192 --out $OUT
    python3 benchmarks/autotune_h200.py --only recipes:llama-3.2-3b:32768 --out $OUT
    python3 benchmarks/autotune_h200.py --check-only --out DIR             # the summary of rows already measured

The bench JSON/Markdown files and autotune-summary.md land in --out; commit them under benchmarks/bench-h200/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LENGTHS = (8192, 32768)
WARMUP, STEPS = 3, 10
LAYOUT_WITHIN, RECIPE_WITHIN = 0.05, 0.02
DATA = "embedded:data/long-chat.jsonl.gz"
TOKENIZER = REPO / "recipes" / "embedded" / "llama-3.2-3b"  # the embedded ChatML tokenizer and template

# Published sizes (the models' config.json on the hub), through transformers' own config classes.
LAYOUTS = {
    "mistral-7b": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                         vocab_size=32768, rope_theta=1e6, max_position_embeddings=32768,
                                         sliding_window=None, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen2.5-7b": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                       rope_theta=1e6, max_position_embeddings=32768, use_sliding_window=False,
                                       rms_norm_eps=1e-6, tie_word_embeddings=False)),
}
RECIPES = {"qwen3-1.7b": ("qwen3-1.7b-bench-h200", 28, 24, True),
           "qwen3-4b": ("qwen3-4b-bench-h200", 36, 30, True),
           "llama-3.2-3b": ("llama-3.2-3b-bench-h200", 28, 20, False)}
"""name: (recipe, layers, layers recomputed at 32k as hand-tuned, recompute_attention as hand-tuned)."""


def layout_folder(name: str, root: Path) -> Path:
    """config.json from the config class, beside the embedded tokenizer files."""
    import transformers

    cls_name, sizes = LAYOUTS[name]
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    getattr(transformers, cls_name)(**sizes).save_pretrained(folder)
    for f in TOKENIZER.iterdir():
        if f.name != "config.json":
            shutil.copy(f, folder / f.name)
    return folder


def layout_spec(name: str, folder: Path, root: Path) -> Path:
    """The spec a new user writes: model, data, hardware, tokens per block; nothing else."""
    import yaml

    spec = {"name": f"autotune-{name}", "model": {"id": f"autotune/{name}-random", "path": str(folder),
                                                  "init": "random"},
            "dataset": {"id": "sft-tui/long-chat", "path": DATA},
            "hardware": {"device": "cuda", "gpu": "auto", "nproc_per_node": 1},
            "train": {"seq_len": 32768}}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def bench(spec: str, name: str, out: Path, args: list[str]) -> None:
    if (out / f"{name}.json").exists():
        print(f"have {name}", flush=True)
        return
    # hardware.gpu=auto: the planner plans for the GPU the rows run on (an H100 runs them too; each row names it).
    cmd = [sys.executable, "-m", "runner", "bench", spec, "--engines", "native", *args, "--set", "hardware.gpu=auto",
           "--warmup", str(WARMUP),
           "--steps", str(STEPS), "--runs-dir", "/tmp/runs", "--records-dir", "/tmp/records", "--out", str(out),
           "--name", name]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False)  # an out-of-memory row is a result, not a reason to stop


def manual(layers: int) -> str:
    """The manual sweep's recompute counts (beside none): a quarter, half, three quarters, all of the layers."""
    return ",".join(map(str, sorted({max(1, round(layers * f)) for f in (0.25, 0.5, 0.75)} | {layers})))


def measure_layout(name: str, seq: int, out: Path, root: Path) -> None:
    folder = layout_folder(name, root)
    spec = str(layout_spec(name, folder, root))
    layers = LAYOUTS[name][1]["num_hidden_layers"]
    length = ["--sweep", f"train.seq_len={seq}"]
    bench(spec, f"autotune-{name}-{seq}-auto", out, length)
    fixed = ["--set", "train.compile=true", "--set", "train.loss_impl=fused"]
    bench(spec, f"autotune-{name}-{seq}-manual-none", out,
          [*length, *fixed, "--set", "train.activation_checkpointing=false"])
    bench(spec, f"autotune-{name}-{seq}-manual", out,
          [*length, *fixed, "--set", "train.activation_checkpointing=true", "--set", "train.recompute_attention=true",
           "--set", "train.offload_activations=false", "--sweep", f"train.recompute_layers={manual(layers)}"])


def measure_recipe(name: str, seq: int, out: Path) -> None:
    recipe, _, at_32k, attention = RECIPES[name]
    length = ["--sweep", f"train.seq_len={seq}"]
    bench(recipe, f"autotune-recipe-{name}-{seq}-auto", out, length)
    hand = ["--set", "train.activation_checkpointing=true", "--set", f"train.recompute_layers={8 if seq == 8192 else at_32k}",
            "--set", f"train.recompute_attention={'true' if attention else 'false'}", "--set", "train.compile=true",
            "--set", "train.loss_impl=fused", "--set", "train.offload_activations=false",
            "--set", "train.fsdp_one_rank=false"]
    bench(recipe, f"autotune-recipe-{name}-{seq}-hand", out, [*length, *hand])


def rows(out: Path, stem: str) -> list[dict]:
    found = []
    for f in sorted(out.glob(f"{stem}*.json")):
        found += json.loads(f.read_text())["rows"]
    return found


def _levers(row: dict) -> str:
    t = row.get("spec", {})
    if not t.get("activation_checkpointing"):
        what = "no recompute"
    else:
        what = f"recompute {t.get('recompute_layers')}" + ("" if t.get("recompute_attention", True) else ", attn kept")
    return f"{what}, {t.get('loss_impl')}{', compiled' if t.get('compile') else ''}"


def check(part: str, name: str, seq: int, out: Path) -> dict | None:
    stem = f"autotune-{name}-{seq}" if part == "layouts" else f"autotune-recipe-{name}-{seq}"
    auto = rows(out, f"{stem}-auto")
    others = [r for r in rows(out, f"{stem}-manual" if part == "layouts" else f"{stem}-hand")]
    if not auto or not others:
        return None
    a = auto[0]
    ran = [r for r in others if r.get("status") == "succeeded" and r.get("tokens_per_s")]
    best = max(ran, key=lambda r: r["tokens_per_s"]) if ran else None
    within = LAYOUT_WITHIN if part == "layouts" else RECIPE_WITHIN
    ok_run = a.get("status") == "succeeded"
    gap = (a["tokens_per_s"] - best["tokens_per_s"]) / best["tokens_per_s"] if ok_run and best else None
    return {"part": part, "name": name, "seq_len": seq, "auto_status": a.get("status"),
            "auto_failure": (a.get("failure") or {}).get("cause"), "auto_levers": _levers(a),
            "auto_tokens_per_s": a.get("tokens_per_s"), "auto_peak_reserved_gib": a.get("peak_reserved_gib"),
            "best_levers": _levers(best) if best else None, "best_tokens_per_s": best and best["tokens_per_s"],
            "others": [(_levers(r), r.get("status"), r.get("tokens_per_s")) for r in others],
            "gap": None if gap is None else round(gap, 4), "ok": bool(ok_run and gap is not None and gap >= -within)}


def summary(results: list[dict]) -> str:
    lines = ["| part | model, tokens per block | auto: levers, tokens/s, reserved GiB | best of the sweep "
             "(layouts) or hand-tuned (recipes): levers, tokens/s | auto vs it | within bound |",
             "|" + " --- |" * 6]
    for r in results:
        auto = (f"{r['auto_levers']}, {r['auto_tokens_per_s']:,.0f}, {r['auto_peak_reserved_gib']}"
                if r["auto_status"] == "succeeded" else f"{r['auto_status']} ({r['auto_failure']})")
        best = f"{r['best_levers']}, {r['best_tokens_per_s']:,.0f}" if r["best_tokens_per_s"] else "none ran"
        gap = "-" if r["gap"] is None else f"{r['gap']:+.1%}"
        bound = LAYOUT_WITHIN if r["part"] == "layouts" else RECIPE_WITHIN
        lines.append(f"| {r['part']} | {r['name']}, {r['seq_len']:,} | {auto} | {best} | {gap} | "
                     f"{'yes' if r['ok'] else 'NO'} (±{bound:.0%}) |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/bench-h200"))
    ap.add_argument("--only", action="append", default=[],
                    help="PART:NAME:SEQ_LEN, e.g. layouts:mistral-7b:8192 or recipes:qwen3-1.7b:32768 (repeatable)")
    ap.add_argument("--check-only", action="store_true", help="summarise the rows already in --out")
    a = ap.parse_args()
    todo = [("layouts", n, s) for n in LAYOUTS for s in LENGTHS] + [("recipes", n, s) for n in RECIPES
                                                                      for s in LENGTHS]
    if a.only:
        todo = [(o.split(":")[0], o.split(":")[1], int(o.split(":")[2])) for o in a.only]
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.check_only:
        with tempfile.TemporaryDirectory(prefix="autotune-") as tmp:
            for part, name, seq in todo:
                if part == "layouts":
                    measure_layout(name, seq, a.out, Path(tmp))
                else:
                    measure_recipe(name, seq, a.out)
    results = [r for p, n, s in todo if (r := check(p, n, s, a.out))]
    (a.out / "autotune-summary.json").write_text(json.dumps(results, indent=1))
    text = summary(results)
    (a.out / "autotune-summary.md").write_text(text)
    print(text)
    return 0 if results and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
