"""The largest block that trains on one H200, for the Llama-3.1-8B and Qwen3-4B layouts, with everything that grows
with the block length bounded: fused chunked loss, varlen attention, every layer recomputed with its input in
page-locked host memory (train.offload_activations), the MLP in tiles (train.tiled_mlp), and bf16 weights,
gradients and AdamW states with stochastic rounding (8 bytes per parameter). Random init from config-only folders,
full fine-tune, on the bench recipes' conversations (recipes/embedded/data/long-chat.jsonl.gz).

Each layout is one `runner bench --max-seq-len` search (2-step probes, bisection started at the estimator's limit);
this prints, per layout, the largest block that trained, its tokens/s (from the probe's run record) and the
estimator's prediction beside it, and writes the bench results to --out (JSON and Markdown, as `runner bench`
does). Run on the GPU node itself, from the repository root:

    python3 benchmarks/long_blocks_h200.py                       # both layouts
    python3 benchmarks/long_blocks_h200.py --only llama-3.1-8b --grid 262144:1048576:32768

The Llama-3.1-8B folder is written from its published config (hidden 4,096, 32 layers, 32 heads / 8 KV heads,
MLP 14,336, vocabulary 128,256, RoPE θ 500,000 with llama3 scaling) beside the embedded tokenizer; the Qwen3-4B one
ships as recipes/embedded/qwen3-4b. Each probe's run record and each bench result name the settings they ran.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "recipes" / "embedded" / "tokenizer"

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "torch_dtype": "bfloat16",
    "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}

LONG_BLOCKS = ["train.compile=false", "train.activation_checkpointing=true", "train.recompute_layers=null",
               "train.offload_activations=true", "train.tiled_mlp=true", "train.loss_impl=fused",
               "train.optimizer_precision=bf16_stochastic", "model.dtype=bfloat16", "model.init=random",
               "method.kind=full", "hardware.nproc_per_node=1", "hardware.gpu=auto", "train.data_workers=1"]
"""What every probe runs with (over the qwen3-4b-bench-h200 recipe)."""

LAYOUTS = {
    # name: (model folder or None to write Llama's, model.id, default grid)
    "llama-3.1-8b": (None, "sft-tui/llama-3.1-8b-random", "262144:1048576:32768"),
    "qwen3-4b": (ROOT / "recipes" / "embedded" / "qwen3-4b", "sft-tui/qwen3-4b-random", "393216:1572864:32768"),
}


def llama_folder(out: Path) -> Path:
    """A config-only Llama-3.1-8B folder with the embedded ChatML tokenizer (its 512 ids are all in the vocabulary)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(LLAMA_31_8B, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (out / f).write_bytes((TOKENIZER / f).read_bytes())
    return out


def tokens_per_s(record: str) -> float | None:
    path = Path(record)
    if not path.is_file():
        return None
    return (json.loads(path.read_text()).get("metrics") or {}).get("tokens_per_s")


def search(name: str, folder: Path, model_id: str, grid: str, out: Path, runs: Path, records: Path,
           host_gib: float | None) -> dict:
    sets = [f"model.path={folder}", f"model.id={model_id}", *LONG_BLOCKS]
    if host_gib:
        sets.append(f"hardware.host_memory_gib={host_gib:g}")
    cmd = [sys.executable, "-m", "runner", "bench", "qwen3-4b-bench-h200", "--engines", "native",
           "--max-seq-len", grid, "--out", str(out), "--name", f"long-blocks-{name}",
           "--runs-dir", str(runs), "--records-dir", str(records)]
    for s in sets:
        cmd += ["--set", s]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    row = json.loads((out / f"long-blocks-{name}.json").read_text())["limits"]["engines"]["native"]
    measured = row.get("measured_max_seq_len")
    fit = [p for p in row["probes"] if p.get("seq_len") == measured and p.get("status") == "succeeded"]
    return {"layout": name, "largest_block": measured, "predicted": row.get("predicted_max_seq_len"),
            "prediction_error": row.get("prediction_error"), "search_complete": row.get("search_complete"),
            "tokens_per_s": tokens_per_s(fit[0]["record"]) if fit else None, "note": row.get("note")}


def budget(folders: dict[str, Path], host_gib: float) -> None:
    """The estimator's side, no GPU needed: per layout and block length, where the bytes go on one H200, and the
    largest block it predicts on the GPU alone and with a node of `host_gib` of host memory (layer inputs the host
    cannot hold are regenerated in backward, one per hosted layer, and the rest stay on the GPU:
    runner.facts.gpus.offloaded_layers, regenerated_layers)."""
    from runner.cli.bench_limit import grid, predicted_limit
    from runner.plan import estimate
    from runner.spec import load_spec

    print("| layout, tokens per block | host GiB | GPU total | states | activations | fragmentation | "
          "host: offloaded inputs | inputs regenerated | inputs kept on the GPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    limits = []
    for name, folder in folders.items():
        for host in (None, host_gib):
            sets = [f"model.path={folder}", f"model.id={LAYOUTS[name][1]}",
                    *[s.replace("hardware.gpu=auto", "hardware.gpu=H200") for s in LONG_BLOCKS]]
            if host:
                sets.append(f"hardware.host_memory_gib={host:g}")
            spec = load_spec("qwen3-4b-bench-h200", sets)
            at = predicted_limit(spec, grid(32768, 1572864, 32768))
            limits.append((name, host, at))
            for n in sorted({524288, 1048576, at or 32768}):
                e = estimate(spec.model_copy(update={"train": spec.train.model_copy(update={"seq_len": n})}),
                             suggest=False)
                b = e.breakdown
                why = e.approximate_reason
                regenerated = why.split(" more regenerated")[0].rsplit(" ", 1)[-1] if " more regenerated" in why else "0"
                kept = why.split("the other ")[1].split(")")[0] if "stay on the GPU" in why else "0"
                print(f"| {name}, {n:,} | {host or 'unlimited'} | {e.per_gpu_gib:.1f} | "
                      f"{b['params'] + b['grads'] + b['optimizer']:.1f} | {b['activations'] + b['logits_loss']:.1f} | "
                      f"{b['fragmentation']:.1f} | {e.host_offload_gib:.1f} | {regenerated} | {kept} |")
    for name, host, at in limits:
        print(f"{name}: largest predicted block {at:,} ({'host ' + format(host, 'g') + ' GiB' if host else 'host unlimited'})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(LAYOUTS), help="one layout (default: both)")
    ap.add_argument("--grid", help="LO:HI:STEP for --max-seq-len (default: per layout)")
    ap.add_argument("--host-memory-gib", type=float, default=0.0,
                    help="the node's host memory, for the estimator, where the OS reports too little (a VM whose "
                         "memory grows with use); default: what the OS reports (125.8 GiB on the H200 machine)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "bench-h200")
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/long-blocks/runs"))
    ap.add_argument("--records-dir", type=Path, default=Path("/tmp/long-blocks/records"))
    ap.add_argument("--budget", action="store_true",
                    help="print the estimator's table and predicted limits (no GPU), host from --host-memory-gib "
                         "(default 125.8)")
    args = ap.parse_args()
    rows = []
    if args.budget:
        with tempfile.TemporaryDirectory() as tmp:
            budget({name: folder or llama_folder(Path(tmp) / name) for name, (folder, _, _) in LAYOUTS.items()
                    if not args.only or name == args.only}, args.host_memory_gib or 125.8)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (folder, model_id, grid) in LAYOUTS.items():
            if args.only and name != args.only:
                continue
            folder = folder or llama_folder(Path(tmp) / name)
            rows.append(search(name, folder, model_id, args.grid or grid, args.out, args.runs_dir, args.records_dir,
                               args.host_memory_gib or None))
    print("\n| layout | largest block that trains | tokens/s | estimator | error | search complete |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        err = r["prediction_error"]
        tps = r["tokens_per_s"]
        print(f"| {r['layout']} | {r['largest_block'] or '-'} | {'-' if tps is None else f'{tps:,.0f}'} | "
              f"{r['predicted'] or '-'} | {'-' if err is None else f'{100 * err:+.1f}%'} | "
              f"{'yes' if r['search_complete'] else 'no'} |")
        if r["note"]:
            print(f"  {r['layout']}: {r['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
