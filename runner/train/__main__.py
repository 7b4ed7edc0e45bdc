"""Entry point of one rank: `python -m runner.train --spec runs/<id>/spec.json` (started by torchrun), which obeys\nthe decisions file beside the spec (runs/<id>/decisions.json)."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import socket
import sys
import traceback
from pathlib import Path

from runner.decide.decisions import Decisions
from runner.events.paths import RunPaths
from runner.events.lines import EventWriter
from runner.events.failure import classify_exception
from runner.engines import engine_for, require_resolved
from runner.spec import RunSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.train", description=__doc__)
    parser.add_argument("--spec", required=True, type=Path, help="resolved spec written by the launcher")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest complete checkpoint in the spec's run directory")
    args = parser.parse_args(argv)

    run_dir = args.spec.parent
    spec = RunSpec.model_validate(json.loads(args.spec.read_text()))
    paths = RunPaths(run_dir)
    rank = int(os.environ["RANK"])

    from runner.train import runtime

    runtime.redirect_output(paths.rank_log(rank))
    events = EventWriter(paths.rank_events(rank), rank)
    events.start(local_rank=int(os.environ["LOCAL_RANK"]), node_rank=int(os.environ.get("GROUP_RANK", 0)),
                 world_size=int(os.environ["WORLD_SIZE"]), pid=os.getpid(), host=socket.gethostname(),
                 max_steps=spec.train.max_steps)
    step = 0
    try:
        rt = runtime.init(spec.hardware.device)
        runtime.hold_to(spec.hardware.memory_gib, rt.device, rt.local_rank)
        require_resolved(spec)
        decisions = Decisions.read(paths.decisions)  # made before launch; the rank obeys them (runner.decide)
        runtime.set_determinism(spec.train.seed, spec.train.deterministic, rt.device)
        train = importlib.import_module(engine_for(spec.engine).entry).train
        summary = train(spec, rt, events, decisions, run_dir=run_dir, resume=args.resume)
        step = summary["steps"]
        events.end(step=step, **summary)
        loss = summary["final_loss"]  # 4 decimals, as the dashboard's rank table and the summary give it
        print(f"[rank {rank}] {summary['reason']} after {step} steps, final loss "
              f"{f'{loss:.4f}' if isinstance(loss, float) else loss}", flush=True)
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the event file before we exit
        traceback.print_exc()
        cause, message = classify_exception(e)
        events.error(step=step, cause=cause, message=message)
        return 1
    finally:
        events.close()
        _teardown()


def _teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a dead peer can make teardown fail; the run is over anyway
            pass
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    # Everything the run owes the disk is written and flushed by now (events closed, checkpoints and exports are
    # synchronous, output flushed in _teardown). Leave without the interpreter's teardown: a library's C++ thread
    # still joinable at exit aborts the process ("terminate called without an active exception", seen once after
    # a TRL run had finished), and the launcher would count a finished rank as failed.
    os._exit(code)
