"""The packing check (runner.gate.packcheck) on one GPU: six registry families and six the registry does not list,
each on the varlen (torch), flex and flash-attn-4 (varlen through FA4) paths, in bf16 as GPU runs compute; prints the
table with each verdict, its measures against the bf16 tolerances, and the seconds per model; writes
packcheck-<gpu>.json and .md into --out.

    python benchmarks/packcheck_gpu.py --out benchmarks          # one H200 (or H100): 12 models x 3 paths
    python benchmarks/packcheck_gpu.py --out /tmp/pc --quick     # two models, to see it run
    python benchmarks/packcheck_gpu.py --out /tmp/pc --fresh --paths flex_attention --flex-shapes dynamic \
        --models llama,qwen3_moe,gemma3_text,cohere2    # each cell in a new process with a cold compile cache

Each cell is uncached (run_check, not checked) and timed from building the shrunk copy to the verdict, so the
seconds are what a first launch of that model pays; a path the family cannot take (attention_refusal: sinks,
soft-capping, a class without flex) or a kernel not installed is a row that says so. Acceptance: every model under
10 s on every path it can take, and no registry family refused. In one process the later cells reuse what the
earlier ones compiled; --fresh runs each cell in its own process with an empty inductor cache, as a first launch
on a new machine pays it. --flex-shapes sets how the check compiles flex (runner.gate.packcheck.FLEX_SHAPES).

flash-attn-4 compiles a kernel per head layout at its first call, and keeps it on disk (runner.train.fa4.keep_kernels):
the table starts with an empty kernel cache; with --fresh a flash-attn-4 cell runs a second time in a new process
with the kernels the first kept ("s, kernels kept": a later launch on that machine). After each flash-attn-4 check
the cell calls the kernel once with the run's own heads on an 8k block of 1,300-token documents, as the run's
first step does ("run's first call"): its seconds and the kernels it compiled that the check had not (their compile
keys in the JSON: `compiled_in_check`, `compiled_in_run_call`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REGISTRY = ("llama", "qwen3", "qwen3_moe", "gemma3_text", "gpt_oss", "qwen3_5")
UNLISTED = ("cohere2", "glm4_moe", "exaone4", "olmoe", "llama4_text", "ministral")
PUBLISHED = {"ministral": {"head_dim": 128}}
"""Where transformers' default config of a family builds no model, the value its published checkpoints set
(Ministral's default head_dim is None, which its attention cannot take; Ministral-8B's config says 128)."""
PATHS = (("varlen", "torch"), ("flex_attention", ""), ("varlen", "flash-attn-4"))
SEQ_LEN = 8192
LIMIT_S = 10.0


def cell(model_type: str, path: str, kernel: str, seq_len: int) -> dict[str, Any]:
    from transformers import AutoConfig

    from runner.decide.rules import FA4_KERNEL, attention_refusal, choose_loss, head_dim, varlen_kernel_refusal
    from runner.facts.families import family_of
    from runner.gate.packcheck import Setup, run_check
    from runner.train import fa4
    from runner.train.attention import available_kernels, concrete_model_class, supported_attention
    from runner.decide.loader import is_vlm_config
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    # The family's own default sizes (the check shrinks them).
    config = AutoConfig.for_model(model_type, **PUBLISHED.get(model_type, {}))
    auto = AutoModelForImageTextToText if is_vlm_config(config) else AutoModelForCausalLM
    supported = supported_attention(concrete_model_class(auto, config))
    row: dict[str, Any] = {"model_type": model_type, "known": family_of(config).known,
                           "path": path + (f" ({kernel})" if kernel else "")}
    if kernel == "flash-attn-4" and not fa4.available():
        return {**row, "status": "not run", "message": "flash-attn-4 is not installed for this GPU"}
    if kernel == "flash-attn-4":  # only where a run would take it (the head size rule), as preflight decides
        why = varlen_kernel_refusal(FA4_KERNEL, available_kernels("cuda"), head_dim(config))
        if why is not None:
            return {**row, "status": "not this family's path", "message": why}
    refusal = attention_refusal(path, "cuda", config, supported, available_kernels("cuda"))
    if refusal is not None:
        return {**row, "status": "not this family's path", "message": refusal[0]}
    setup = Setup("native", path, kernel, choose_loss("native", "auto", config)[0], "cuda", "bfloat16", seq_len)
    compiled = record_compiles() if kernel == "flash-attn-4" else []
    start = time.perf_counter()
    verdict = run_check(config, setup)
    seconds = time.perf_counter() - start
    row = {**row, "status": verdict.status, "ce_nats": verdict.ce_nats, "loss_rel": verdict.loss_rel,
           "grad_rel": verdict.grad_rel, "seconds": round(seconds, 2), "shrunk": verdict.shrunk,
           "message": verdict.message}
    if kernel != "flash-attn-4":
        return row
    in_check = list(compiled)
    row.update(run_shapes_call(config, seq_len))
    return {**row, "compiled_in_check": in_check, "compiled_in_run_call": compiled[len(in_check):]}


COMPILED: list[str] = []
"""flash-attn-4's compile keys, as `record_compiles` collects them in this process."""


def record_compiles() -> list[str]:
    """The compile keys flash-attn-4 builds a kernel for from now on in this process (each cache's folder name and
    the key), in the returned list (emptied first): what the check compiled, and what the run's first call added.
    Its kernels are kept on disk (runner.train.fa4.keep_kernels), so each new one is exported once compiled; the
    export is wrapped once per process."""
    from flash_attn.cute import cache_utils

    COMPILED.clear()
    cache = cache_utils.JITPersistentCache
    if not getattr(cache, "_recorded", False):
        original = cache._try_export_to_storage  # after a compile only, not a load from disk

        def export(self: Any, key: Any, fn: Any) -> None:
            COMPILED.append(f"{self.cache_path.name}: {key!r}"[:600])
            original(self, key, fn)

        cache._try_export_to_storage, cache._recorded = export, True
    return COMPILED


RUN_DOC = 1300
"""Tokens per document of run_shapes_call's block (LIMA's median conversation)."""


def _kernel_files() -> int:
    from runner.train import fa4

    folder = Path(os.environ.get(fa4.KERNELS_DIR, "/nonexistent"))
    return sum(1 for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock")


def run_shapes_call(config: Any, seq_len: int) -> dict[str, Any]:
    """After the check: one flash-attn-4 forward and backward with the run's own heads (full size, not the shrunk
    copy's) on a packed block of seq_len tokens, as the run's first step calls it. Its seconds, and the kernels it
    compiled that the check had not (files added to flash-attn-4's kernel cache): none means the check's compile
    served the run."""
    import torch

    from runner.decide.rules import head_dim
    from runner.train import fa4

    text = config.get_text_config()
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    size, before = head_dim(config), _kernel_files()
    cu = torch.tensor([*range(0, seq_len, RUN_DOC), seq_len], dtype=torch.int32, device="cuda")
    torch.manual_seed(0)
    q, k, v = (torch.randn(seq_len, n, size, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for n in (heads, kv, kv))
    torch.cuda.synchronize()
    start = time.perf_counter()
    fa4.varlen_attn(q, k, v, cu, cu, RUN_DOC, RUN_DOC, window_size=(-1, 0)).float().square().sum().backward()
    torch.cuda.synchronize()
    return {"run_heads": f"{heads}/{kv}x{size}", "run_call_s": round(time.perf_counter() - start, 2),
            "run_new_kernels": _kernel_files() - before}


def fresh_cell(model_type: str, path: str, kernel: str, seq_len: int, flex_shapes: str) -> dict[str, Any]:
    """One cell in a new python process with empty inductor, Triton and flash-attn-4 kernel caches. Its seconds are
    timed inside that process, as in one process: whatever the check compiles, none of it cached, and not python's
    start. A flash-attn-4 cell runs again in a second new process with the kernels the first one kept
    (`seconds_kernels_kept`: a later launch on the same machine)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
               "SFT_TUI_CACHE_DIR": os.path.join(cache, "sft-tui")}
        cmd = [sys.executable, __file__, "--cell", model_type, path, kernel, "--seq-len", str(seq_len),
               "--flex-shapes", flex_shapes, "--out", cache]
        row = _cell_process(cmd, env, model_type, path)
        if kernel == "flash-attn-4" and "seconds" in row:
            again = _cell_process(cmd, env, model_type, path)
            row.update(seconds_kernels_kept=again.get("seconds"), run_call_s_kept=again.get("run_call_s"))
    return row


def _cell_process(cmd: list[str], env: dict[str, str], model_type: str, path: str) -> dict[str, Any]:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"model_type": model_type, "known": None, "path": path, "status": "error",
                "message": (done.stderr or done.stdout)[-300:]}
    return json.loads(lines[-1])


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.1e}" if isinstance(x, float) else str(x)


def table(rows: list[dict[str, Any]]) -> str:
    head = "| model type | registry | path | verdict | ce nats | loss rel | grad rel | s | s, kernels kept | " \
           "run's first call: heads, s, new kernels | note |\n" + "| --- " * 11 + "|\n"
    return head + "\n".join(
        f"| {r['model_type']} | {'yes' if r['known'] else 'no'} | {r['path']} | {r['status']} | {_fmt(r.get('ce_nats'))}"
        f" | {_fmt(r.get('loss_rel'))} | {_fmt(r.get('grad_rel'))} | {r.get('seconds', '-')} | "
        f"{r.get('seconds_kernels_kept', '-')} | {_run_call(r)} | "
        f"{'' if r['status'] == 'exact' else r.get('message', '')[:120]} |" for r in rows)


def _run_call(r: dict[str, Any]) -> str:
    return f"{r['run_heads']}, {r['run_call_s']}, {r['run_new_kernels']}" if "run_heads" in r else "-"


def main() -> int:
    import torch
    import transformers

    from runner.gate.packcheck import TOLERANCES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="llama and cohere2 only")
    ap.add_argument("--seq-len", type=int, default=SEQ_LEN)
    ap.add_argument("--models", help="comma-separated model types (default: the twelve)")
    ap.add_argument("--paths", help="comma-separated paths: varlen, flex_attention, flash-attn-4 (default: all)")
    ap.add_argument("--flex-shapes", choices=("static", "dynamic", "eager"), default=None,
                    help="how the check compiles flex (default: runner.gate.packcheck.FLEX_SHAPES)")
    ap.add_argument("--fresh", action="store_true", help="each cell in a new process with a cold compile cache")
    ap.add_argument("--cell", nargs=3, metavar=("MODEL_TYPE", "PATH", "KERNEL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("packcheck_gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from runner.gate import packcheck

    packcheck.FLEX_SHAPES = args.flex_shapes or packcheck.FLEX_SHAPES
    if not args.cell:  # the table starts with no kernels kept from an earlier run (a first launch on this machine)
        os.environ["SFT_TUI_CACHE_DIR"] = tempfile.mkdtemp(prefix="packcheck-")
    if args.cell:
        mt, path, kernel = args.cell
        print(json.dumps(cell(mt, path, "" if kernel == "-" else kernel, args.seq_len)), flush=True)
        return 0
    models = ("llama", "cohere2") if args.quick else \
        tuple(args.models.split(",")) if args.models else REGISTRY + UNLISTED
    wanted = set(args.paths.split(",")) if args.paths else None
    paths = [(p, k) for p, k in PATHS if wanted is None or (k if k == "flash-attn-4" else p) in wanted]
    rows = []
    for mt in models:
        for path, kernel in paths:
            try:
                row = fresh_cell(mt, path, kernel or "-", args.seq_len, packcheck.FLEX_SHAPES) if args.fresh \
                    else cell(mt, path, kernel, args.seq_len)
            except Exception as e:  # noqa: BLE001 - a broken cell is a row, the table goes on
                row = {"model_type": mt, "known": None, "path": path, "status": "error", "message": repr(e)[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    gpu = torch.cuda.get_device_name(0)
    timed = [r for r in rows if "seconds" in r]
    summary = {"models": len(models), "cells_run": len(timed),
               "max_seconds": max((r["seconds"] for r in timed), default=None),
               "over_limit": [f"{r['model_type']} {r['path']}" for r in timed if r["seconds"] > LIMIT_S],
               "over_limit_kernels_kept": [f"{r['model_type']} {r['path']}" for r in timed
                                           if (r.get("seconds_kernels_kept") or r["seconds"]) > LIMIT_S],
               "run_new_kernels": sum(r.get("run_new_kernels") or 0 for r in timed),
               "registry_refused": [f"{r['model_type']} {r['path']}" for r in timed
                                    if r["known"] and r["status"] != "exact"]}
    result = {"command": " ".join(sys.argv), "gpu": gpu, "seq_len": args.seq_len, "tolerances": TOLERANCES,
              "flex_shapes": packcheck.FLEX_SHAPES, "fresh_processes": args.fresh,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": platform.python_version()}, "summary": summary, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "packcheck-" + gpu.lower().replace("nvidia ", "").replace(" ", "-") + \
        (f"-flex-{packcheck.FLEX_SHAPES}" if args.flex_shapes else "") + ("-fresh" if args.fresh else "")
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
    text = f"# Packing check on {gpu}\n\n`{result['command']}`; seq_len {args.seq_len}, bf16.\n\n{table(rows)}\n\n" \
           f"Summary: {json.dumps(summary)}\n"
    (args.out / f"{name}.md").write_text(text)
    print(text)
    return 0 if not summary["over_limit"] and not summary["registry_refused"] else 1


if __name__ == "__main__":
    sys.exit(main())
