"""The wizard's steps and the spec fields each one shows, with the keys that tell which checks an edit makes stale."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from tui.widgets.fields import Kind

STEPS = (("model", "Model"), ("dataset", "Dataset"), ("hardware", "Hardware"), ("method", "Method"),
         ("plan", "Plan"), ("launch", "Launch"))
STEP_IDS = [s for s, _ in STEPS]

# (dotted path, label, kind) per step; options of selects come from the schema's Literal types (field_choices).
FIELDS: dict[str, list[tuple[str, str, Kind]]] = {
    "model": [
        ("model.id", "hub id / name", "text"),
        ("model.path", "local path", "optional"),
        # random for a folder of config.json and tokenizer alone (proposed when the path holds no weights)
        ("model.init", "init weights", "select"),
        ("model.revision", "revision", "optional"),
        ("model.dtype", "dtype", "select"),
        ("model.attn_implementation", "attention", "select"),
        ("model.loader", "loader", "select"),
        ("model.trust_remote_code", "trust remote code", "switch"),
    ],
    "dataset": [
        ("dataset.id", "hub id / name", "optional"),
        ("dataset.path", "local path", "optional"),
        ("dataset.revision", "revision", "optional"),
        ("dataset.split", "split", "text"),
        # How rows read, as the Dataset step's own errors ask: the conversation column goes in columns
        # (messages=...), so no "messages column" shows for alpaca or ShareGPT data.
        ("dataset.format", "format", "select"),
        ("dataset.columns", "columns", "mapping"),
        ("dataset.roles", "role names", "mapping"),
        ("dataset.train_on", "train on", "select"),
    ],
    "hardware": [
        ("hardware.device", "device", "select"),
        ("hardware.gpu", "GPU type", "select"),
        ("hardware.nproc_per_node", "ranks per node", "int_or_auto"),
        ("hardware.nodes", "nodes", "int"),
        ("hardware.memory_gib", "memory cap GiB", "optional_float"),
        ("hardware.sequence_parallel", "sequence parallel", "int"),
        ("hardware.rdzv_endpoint", "rendezvous host:port", "text"),
    ],
    "method": [
        ("engine", "engine", "select"),
        ("method.kind", "method", "select"),
        ("method.lora.r", "LoRA r", "int"),
        ("method.lora.alpha", "LoRA alpha", "int"),
        ("method.lora.target_modules", "LoRA targets", "modules"),
        ("train.seq_len", "tokens per block", "int"),
        ("train.micro_batch", "micro batch", "int"),
        ("train.grad_accum", "grad accumulation", "int"),
        ("train.lr", "learning rate", "float"),
        ("train.schedule", "schedule", "select"),
        ("train.warmup_steps", "warmup steps", "int"),
        ("train.max_steps", "max steps", "optional_int"),
        ("train.epochs", "epochs (no max)", "float"),
        ("train.activation_checkpointing", "act. checkpointing", "select"),
        ("train.recompute_layers", "recompute layers", "optional_int"),
        ("train.offload_activations", "offload activations", "select"),
        ("train.compile", "compile layers", "select"),
        ("train.tiled_mlp", "tiled MLP", "select"),
        ("train.optimizer_precision", "optimizer precision", "select"),
        ("train.loss_impl", "loss", "select"),
        ("train.packing_strategy", "packing", "select"),
        ("dataset.eval_fraction", "eval fraction", "float"),
        ("dataset.eval_split", "eval split", "optional"),
        ("train.eval_every", "eval every (steps)", "int"),
        ("train.early_stop_patience", "early stop patience", "int"),
        ("report.to", "trackers", "list"),
        ("output.save", "save at end", "select"),
    ],
    "launch": [
        ("name", "run name", "text"),
        ("description", "description", "text"),
    ],
}
ALL_FIELDS = [p for fields in FIELDS.values() for p, _, _ in fields]
STEP_OF_FIELD = {p: step for step, fields in FIELDS.items() for p, _, _ in fields}
STEP_OF_SECTION = {"model": "model", "dataset": "dataset", "hardware": "hardware", "method": "method",
                   "train": "method", "output": "method", "engine": "method", "name": "launch", "description": "launch"}
LORA_FIELDS = ("method.lora.r", "method.lora.alpha", "method.lora.target_modules")
# Which panes' background work an edit makes stale.
ARCH_INPUTS = ("model.",)
DATA_INPUTS = ("model.", "dataset.", "train.seq_len", "train.packing_strategy")
# The data and model are named after a new local path unless their id was typed (runner.naming, as the CLI does).
FOLLOWED_IDS = {"model.path": "model.id", "dataset.path": "dataset.id"}
MAPPING_HINT = "; typed as name=value pairs separated by commas, e.g. instruction=question, output=answer"
DEBOUNCE_S = 0.4
HELP_HINT = "tab/shift+tab: fields · ^n/^p: next/previous step · a focused field's meaning shows here"
STEP_HELP = {
    "plan": "↑/↓, PgUp/PgDn, Home/End: scroll the plan (the torchrun command is at its end) · ^n: on to Launch",
    "launch": "^l: launch · ^s: save these choices as a recipe · ^o: load a recipe · tab: run name, description",
}


# The run's labels: the plan and preflight are the same whatever they say, so saving a recipe under a new name
# (Ctrl+S sets both) leaves what preflight found standing.
LABELS = ("name", "description")


HELP_LINES = 5  # the help line's rows (app.tcss: #help max-height)
MORE_HELP = " (F1: the rest)"


def fit_help(text: str, width: int, lines: int = HELP_LINES) -> str:
    """`text` as the help line shows it in `lines` rows of `width`: whole when it fits, else up to the end of the
    last sentence (or clause) that fits, never mid-sentence, and where F1 shows the rest."""
    if width < 20 or len(textwrap.wrap(text, width)) <= lines:
        return text
    # Ends of sentences and clauses: ". ", "; ", ": " (a field's path and default end with the first ": ").
    cuts = [m.end() for m in re.finditer(r"[.;:](?=\s)", text)]
    for cut in reversed(cuts):
        head = text[:cut].rstrip()
        if len(textwrap.wrap(head + MORE_HELP, width)) <= lines:
            return head + MORE_HELP
    words = text.split()  # one sentence longer than the rows: whole words, then the way to the rest
    while words and len(textwrap.wrap(" ".join(words) + " …" + MORE_HELP, width)) > lines:
        words.pop()
    return " ".join(words) + " …" + MORE_HELP


def spec_key(data: dict[str, Any], prefixes: tuple[str, ...] = ("",)) -> str:
    """What the checks of `prefixes` depend on, as a string to compare; the default (everything) leaves the labels
    out."""
    flat = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            flat[prefix[:-1]] = node

    walk(data, "")
    if prefixes == ("",):
        flat = {k: v for k, v in flat.items() if k not in LABELS}
    return json.dumps({k: v for k, v in flat.items() if any(k.startswith(p) for p in prefixes)}, sort_keys=True,
                      default=str)

