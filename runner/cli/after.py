"""`runner export`, `runner generate` and `runner chat`: a finished run's model written out again, or tried."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from runner.errors import EXIT_OK

RECORD_HELP = "record path or id (see `runner list`)"


def add_parsers(sub: Any, add_records_dir: Any) -> None:
    p = sub.add_parser("export", help="write a finished run's weights as a merged model, its adapter or the full "
                       "model (from its export, else its last checkpoint)")
    p.add_argument("record", metavar="RECORD", help=RECORD_HELP)
    p.add_argument("--as", dest="kind", required=True, choices=("merged", "adapter", "full"),
                   help="merged: LoRA folded into the base, a standalone model; adapter: peft's files; full: the "
                   "whole model (for a LoRA run, the merged one)")
    p.add_argument("-o", "--out", type=Path, help="the new folder (default: runs/<id>/export-<kind>)")
    add_records_dir(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (dir, kind, source, files)")

    p = sub.add_parser("generate", help="answer one prompt with a run's model (greedy unless --temperature)")
    _add_try_args(p, add_records_dir)
    p.add_argument("--prompt", required=True, help="the user's message (the run's chat template wraps it)")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, token_ids, source, ...)")

    p = sub.add_parser("chat", help="talk with a run's model in the terminal; it keeps the conversation "
                       "(/reset forgets it, /exit or Ctrl+D leaves)")
    _add_try_args(p, add_records_dir)


def _add_try_args(p: argparse.ArgumentParser, add_records_dir: Any) -> None:
    p.add_argument("record", metavar="RECORD", help=RECORD_HELP)
    p.add_argument("--base", action="store_true", help="the base model the run started from, to compare")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="answer length limit (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sample at this temperature (default 0: greedy, the same answer every time)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature)")
    add_records_dir(p)


def _checked(args: argparse.Namespace) -> None:
    from runner.errors import UserError

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise UserError(f"--temperature must be 0 (greedy) or more, got {args.temperature}")


def cmd_export(args: argparse.Namespace) -> int:
    from runner.record.records import load_record
    from runner.train.weights import export_run, run_dir_of

    record = load_record(args.record, args.records_dir)
    out = args.out or run_dir_of(record) / f"export-{args.kind}"
    result = export_run(record, args.kind, out)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.kind} model from {result['source']} written to {result['dir']} ({len(result['files'])} files)")
    return EXIT_OK


def cmd_generate(args: argparse.Namespace) -> int:
    from runner.api import load_for_try
    from runner.record.records import load_record

    _checked(args)
    model = load_for_try(load_record(args.record, args.records_dir), base=args.base)
    on_text = None if args.json else (lambda piece: print(piece, end="", flush=True))
    answer = model.answer([{"role": "user", "content": args.prompt}], args.max_new_tokens, args.temperature,
                          args.seed, on_text=on_text)
    if args.json:
        print(json.dumps({"text": answer.text, "token_ids": answer.token_ids, "prompt_tokens": answer.prompt_tokens,
                          "stopped": answer.stopped, "source": model.source, "device": model.device}))
    else:
        print()
    return EXIT_OK


def cmd_chat(args: argparse.Namespace) -> int:
    from runner.api import load_for_try
    from runner.record.records import load_record

    _checked(args)
    model = load_for_try(load_record(args.record, args.records_dir), base=args.base)
    print(f"chatting with {model.source} on {model.device} (/reset forgets, /exit or Ctrl+D leaves)", flush=True)
    messages: list[dict[str, str]] = []
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print()
            return EXIT_OK
        if line.strip() in ("/exit", "/quit"):
            return EXIT_OK
        if line.strip() == "/reset":
            messages = []
            print("(conversation forgotten)", flush=True)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        print("model> ", end="", flush=True)
        try:
            answer = model.answer(messages, args.max_new_tokens, args.temperature, args.seed,
                                  on_text=lambda piece: print(piece, end="", flush=True))
        except KeyboardInterrupt:  # stop this answer, keep the chat
            messages.pop()
            print("\n(answer interrupted)", file=sys.stderr, flush=True)
            continue
        print(flush=True)
        messages.append({"role": "assistant", "content": answer.text})


COMMANDS = {"export": cmd_export, "generate": cmd_generate, "chat": cmd_chat}
