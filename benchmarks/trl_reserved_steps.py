"""Reserved GPU memory after each step of the TRL engine on one GPU (unwrapped): where its reserved peak comes from.

    python benchmarks/trl_reserved_steps.py free 32768 --out $OUT/free-32768.json
    python benchmarks/trl_reserved_steps.py keep 32768 --out $OUT/keep-32768.json   # gradients kept between steps
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \\
        python benchmarks/trl_reserved_steps.py expandable 32768 --out $OUT/expandable-32768.json

One process, no torchrun: `runner.train.trl_engine.train` on the 1.72B bench model (random init) for 5 steps. The
step events' `mem_gib` is made to report torch's peak *reserved* memory so far instead of the allocated peak, so
the events show after which step the reservation grows. `keep` replaces zero_grad(set_to_none=True) by zeroing in
place (the gradients stay allocated between steps); `expandable` is only a name for the run under expandable
segments (the allocator setting is the environment's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", choices=["free", "keep", "expandable"])
    ap.add_argument("seq_len", type=int)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")

    import torch

    from runner.events.lines import EventWriter
    from runner.plan.autotune import resolve_levers
    from runner.spec import load_spec, resolve
    from runner.train import runtime, trl_engine

    runtime.Runtime.mem_gib = lambda self: round(torch.cuda.max_memory_reserved() / 2**30, 3)
    if args.variant == "keep":
        module_zero, optim_zero = torch.nn.Module.zero_grad, torch.optim.Optimizer.zero_grad
        torch.nn.Module.zero_grad = lambda self, set_to_none=True: module_zero(self, False)
        torch.optim.Optimizer.zero_grad = lambda self, set_to_none=True: optim_zero(self, False)
    rt = runtime.init("cuda")
    # TRL's settings of the rows it explains: layers checkpointed (the bench recipe's levers before auto).
    spec = resolve(load_spec("qwen3-1.7b-bench-h200", ["engine=trl", f"train.seq_len={args.seq_len}",
                                                         "train.max_steps=5", "train.log_every=1",
                                                         "train.activation_checkpointing=true", "train.compile=true"]),
                   cuda_available=True, gpu_count=1)
    spec = resolve_levers(spec)
    work = Path(tempfile.mkdtemp())
    from runner.decide import decide_run

    summary = trl_engine.train(spec, rt, EventWriter(work / "events" / "rank0.jsonl", 0), decide_run(spec, probe=True),
                               run_dir=work)
    events = [json.loads(line) for line in (work / "events" / "rank0.jsonl").read_text().splitlines()]
    steps = [e for e in events if "event" not in e]
    out = {"variant": args.variant, "seq_len": args.seq_len,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
           "reserved_after_step": [e["mem_gib"] for e in steps], "peak": summary["peak_mem_gib"],
           "step_s": [e["step_s"] for e in steps]}
    print(json.dumps(out))
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
