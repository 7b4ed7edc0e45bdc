"""QLoRA against LoRA on one GPU for a real-width model: peak memory and tokens/s of each, the estimate beside each row.

The model is Llama-3.1-70B's width (hidden 8192, 64 heads over 8 KV heads, MLP 28672, vocabulary 128,256) with its
80 layers reduced to --layers (4 by default: 5.5B parameters, 11 GB in bf16, so LoRA fits one H100 beside QLoRA),
random init from a config-only folder (no hub), trained on the embedded long conversations with the embedded ChatML
tokenizer (ids below 512, all inside the vocabulary). Both rows go through `runner bench` (the real `runner run`
path: preflight, the planner's levers, torchrun, the record); this script then reads each row's record for what was
predicted before launch (per-GPU memory, allocated peak, step time) and writes qlora-<gpu>.json and .md into --out,
beside the bench's own files.

    python3 benchmarks/qlora_gpu.py --out $OUT                        # one H100 or H200: LoRA and QLoRA at 8k
    python3 benchmarks/qlora_gpu.py --out $OUT --layers 8 --seq-len 16384
    python3 benchmarks/qlora_gpu.py --out /tmp/q --cpu-smoke          # the script itself, on 2 CPU ranks in a minute

On the GPU machine (torch, transformers, peft, accelerate preinstalled) first install what benchmarks/device_wheels.sh
downloaded (trl, datasets, torchao, ...), as its header says, and run from the repository root with PYTHONPATH set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LLAMA_70B_WIDTH = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 28672,
                   "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False,
                   "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
SMOKE_WIDTH = {**LLAMA_70B_WIDTH, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 32, "intermediate_size": 256, "vocab_size": 512}
TOKENIZER = REPO / "recipes" / "embedded" / "tokenizer"


def model_folder(out: Path, width: dict[str, Any], layers: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**width, "num_hidden_layers": layers}, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (out / f).write_bytes((TOKENIZER / f).read_bytes())
    return out


def run_spec(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    smoke = args.cpu_smoke
    data = "embedded:data/chat.jsonl" if smoke else "embedded:data/long-chat.jsonl.gz"
    return {
        "name": "qlora-gpu",
        "description": f"Llama-3.1-70B width, {args.layers} layers, random init: LoRA against QLoRA",
        "model": {"id": f"bench/llama-3.1-70b-width-{args.layers}l", "path": str(folder), "init": "random",
                  "dtype": "float32" if smoke else "bfloat16"},
        "dataset": {"id": "sft-tui/long-chat" if not smoke else "sft-tui/tiny-chat", "path": data},
        "engine": "native",
        "method": {"kind": "lora", "lora": {"r": args.rank, "alpha": 2 * args.rank, "target_modules": "all-linear"}},
        "hardware": {"device": "cpu" if smoke else "cuda", "nproc_per_node": 2 if smoke else 1,
                     "gpu": "auto"},
        "train": {"seq_len": args.seq_len, "lr": 1e-4, "schedule": "constant", "warmup_steps": 0,
                  "max_steps": args.warmup + args.steps, "log_every": 1, "seed": 0,
                  **({} if smoke else {"data_workers": 1})},
        "output": {"save": "none"},
    }


def estimate_json(spec_path: Path, method: str) -> dict[str, Any]:
    """`runner estimate --json` for the row's spec, as a user would run it before launch (the planner's levers)."""
    out = subprocess.run([sys.executable, "-m", "runner", "estimate", str(spec_path), "--json", "--set",
                          f"method.kind={method}"], cwd=REPO, capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (out.stderr or out.stdout).strip()[-500:]}


def estimate_of(est: dict[str, Any]) -> dict[str, Any]:
    """The estimate in the columns the table compares."""
    step_s, tokens = est.get("step_s"), est.get("tokens_per_step")
    return {"per_gpu_gib": est.get("per_gpu_gib"), "allocated_gib": est.get("per_gpu_allocated_gib"),
            "reserved_gib": est.get("per_gpu_reserved_gib"), "step_s": step_s,
            "tokens_per_s": round(tokens / step_s, 1) if step_s and tokens else None,
            "fits": est.get("fits"), "levers": est.get("levers"), "breakdown": est.get("breakdown"),
            **({"error": est["error"]} if est.get("error") else {})}


def rows_with_estimates(bench: dict[str, Any], spec_path: Path) -> list[dict[str, Any]]:
    rows = []
    for r in bench.get("rows", []):
        try:
            record = json.loads(Path(r["record"]).read_text())
        except (OSError, KeyError, json.JSONDecodeError):
            record = {}
        quant = (record.get("decisions") or {}).get("quantization")
        rows.append({"method": r.get("method"), "engine": r.get("engine"), "model": r.get("model"),
                     "seq_len": r.get("seq_len"), "status": r.get("status"), "tokens_per_s": r.get("tokens_per_s"),
                     "peak_alloc_gib": r.get("peak_alloc_gib"), "peak_reserved_gib": r.get("peak_reserved_gib"),
                     "last_loss": r.get("last_loss"), "last_step": r.get("last_step"),
                     "step_s_median": r.get("step_s_median"), "doc_tokens": r.get("doc_tokens"),
                     "quantization": quant, "failure": r.get("failure"),
                     "estimate": estimate_of(estimate_json(spec_path, r.get("method"))),
                     "record": r.get("record")})
    return rows


def _cell(v: Any, fmt: str = "") -> str:
    if v is None:
        return "-"
    return format(v, fmt) if fmt else str(v)


def markdown(result: dict[str, Any]) -> str:
    gpu = result.get("gpu") or {}
    lines = [f"# QLoRA against LoRA, {result['model']}", "",
             f"- command: `{result['command']}`",
             f"- GPU: {gpu.get('name')} × {gpu.get('count')}, driver {gpu.get('driver')}",
             f"- versions: {', '.join(f'{k} {v}' for k, v in (result.get('versions') or {}).items() if v)}",
             f"- {result['warmup']} warm-up steps, then {result['steps']} measured; tokens/s per GPU; "
             "est. = `runner estimate` of the same spec", "",
             "| method | seq_len | tokens/s | est. tokens/s | peak allocated GiB | est. allocated | peak reserved GiB "
             "| est. needed | loss (step) | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        e = r["estimate"]
        loss = f"{r['last_loss']:.4f} ({r['last_step']})" if r.get("last_loss") is not None else "-"
        lines.append(f"| {r['method']} | {_cell(r['seq_len'], ',')} | {_cell(r['tokens_per_s'], ',.0f')} | "
                     f"{_cell(e['tokens_per_s'], ',.0f')} | {_cell(r['peak_alloc_gib'], '.2f')} | "
                     f"{_cell(e['allocated_gib'], '.2f')} | {_cell(r['peak_reserved_gib'], '.2f')} | "
                     f"{_cell(e['per_gpu_gib'], '.2f')} | {loss} | {r['status']} |")
    for r in result["rows"]:
        if r.get("quantization"):
            q = r["quantization"]
            lines += ["", f"QLoRA base: {q.get('type')} block {q.get('block_size')}, {q.get('library')}, "
                          f"{q.get('quantized_layers')} Linear layers ({q.get('quantized_params'):,} weights); "
                          f"estimate's parts (GiB): " + ", ".join(f"{k} {v}" for k, v in
                                                                 (r["estimate"].get("breakdown") or {}).items())]
        if r.get("failure"):
            lines += ["", f"{r['method']} failed: {r['failure']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for qlora-<gpu>.json/.md and the bench files")
    p.add_argument("--layers", type=int, default=4, help="decoder layers of the 70B width (default 4)")
    p.add_argument("--seq-len", type=int, default=8192, help="tokens per block (default 8192)")
    p.add_argument("--steps", type=int, default=10, help="measured steps per row (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="steps before measuring (default 3)")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 × rank)")
    p.add_argument("--methods", default="lora,qlora", help="method.kind values, comma-separated (default lora,qlora)")
    p.add_argument("--work", type=Path, default=None, help="model folder, runs, records (default: a temp folder)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="a tiny width on 2 CPU ranks, 256-token blocks, 2 + 2 steps: checks the script, not QLoRA")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.seq_len, args.steps, args.warmup, args.layers = 256, 2, 2, 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = args.work or Path(tempfile.mkdtemp(prefix="qlora-gpu-"))
    args.out.mkdir(parents=True, exist_ok=True)
    folder = model_folder(work / "model", SMOKE_WIDTH if args.cpu_smoke else LLAMA_70B_WIDTH, args.layers)
    spec_path = work / "qlora-gpu.json"
    spec_path.write_text(json.dumps(run_spec(args, folder), indent=2))
    suffix = "cpu-smoke" if args.cpu_smoke else "gpu"
    stem = f"qlora-bench-{suffix}"
    cmd = [sys.executable, "-m", "runner", "bench", str(spec_path), "--engines", "native",
           "--sweep", f"method.kind={args.methods}", "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--runs-dir", str(work / "runs"), "--records-dir", str(work / "records"), "--out", str(args.out),
           "--name", stem]
    print("+", " ".join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=REPO).returncode
    bench_file = args.out / f"{stem}.json"
    if not bench_file.is_file():
        print(f"runner bench wrote no results (exit {code})", file=sys.stderr)
        return code or 1
    bench = json.loads(bench_file.read_text())
    gpu = (bench.get("gpu") or {}).get("name") or "cpu"
    name = "qlora-" + ("cpu-smoke" if args.cpu_smoke else gpu.lower().replace("nvidia ", "").replace(" ", "-"))
    result = {"command": " ".join(["python3", "benchmarks/qlora_gpu.py", *(argv or sys.argv[1:])]),
              "model": f"Llama-3.1-70B width, {args.layers} of 80 layers, random init", "gpu": bench.get("gpu"),
              "versions": bench.get("versions"), "warmup": args.warmup, "steps": args.steps,
              "rows": rows_with_estimates(bench, spec_path), "bench": bench_file.name}
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {args.out / name}.json and .md")
    return 0 if all(r["status"] == "succeeded" for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
