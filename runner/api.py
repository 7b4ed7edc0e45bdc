"""The runner's door for its faces (`tui/`, `runner/cli/`): load, plan, gate, launch, attach, replay, records, the data
preview and trying a trained model, as plain functions over `RunSpec`s and records."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.errors import Problem
from runner.machine import Machine, target_machine
# The spec's naming rules, as `runner run --set` applies them and the wizard applies them field by field.
from runner.naming import follow_paths, follow_run, overridden_fields, overridden_sections, path_name
from runner.spec import RunSpec, load_spec, resolve

if TYPE_CHECKING:
    from runner.events.paths import RunPaths
    from runner.launch.replay import PreparedReplay
    from runner.launch.supervised import SupervisedRun
    from runner.gate.disk import DiskPlan
    from runner.gate import Gate
    from runner.plan.result import Estimate
    from runner.train.generate import TryModel

# Types a face names (in an annotation, an isinstance or an except), loaded on first use: importing this module
# costs no more than the spec does, so a face's first screen is drawn before the estimator or torch is imported.
_LAZY_TYPES = {
    "Gate": "runner.gate",
    "Note": "runner.gate",
    "RunHandle": "runner.launch.handle",
    "SupervisedRun": "runner.launch.supervised",
    "SupervisorFailed": "runner.launch.supervised",
    "RunPaths": "runner.events.paths",
    "RecordError": "runner.record.records",
    "PreparedReplay": "runner.launch.replay",
    "TryModel": "runner.train.generate",
}


__all__ = ["Machine", "RunSpec", "arch_summary", "attach", "dataset_name", "detect_gpus", "diff_records",
           "disk_plan", "estimate", "find_record", "follow_paths", "follow_run", "gate", "gpu_types", "has_weights",
           "hub_problems", "human_bytes", "is_live", "launch", "launch_commands", "list_records", "live_runs", "load",
           "load_for_try", "load_record", "log_tail", "origin", "overridden_fields", "overridden_sections",
           "packing_check", "path_name", "precision_advice", "preflight_problems", "prepare_replay", "preview_detect",
           "preview_tokens", "reap_lost", "recorded_decisions", "replay_result", "resolve_for", "resume_sentence", "run_paths",
           "summary_row", "sweep", "sweep_target", "verify", "warm_imports", *_LAZY_TYPES]


def __getattr__(name: str) -> Any:
    if name in _LAZY_TYPES:
        import importlib

        return getattr(importlib.import_module(_LAZY_TYPES[name]), name)
    raise AttributeError(f"module 'runner.api' has no attribute {name!r}")


# -- load --------------------------------------------------------------------------------------------------------


def save_text(path: Path, text: str) -> None:
    """Write a file whole or not at all: a full disk or a kill mid-write leaves the file as it was."""
    from runner.writes import atomic_write_text

    atomic_write_text(path, text)


def load(ref: str | Path | dict[str, Any], overrides: list[str] | tuple[str, ...] = (),
         notes: list[str] | None = None) -> RunSpec:
    """A recipe name, a YAML/JSON spec file or a raw dict, with `--set` overrides, as a validated RunSpec; `notes`
    receives a line for each id renamed after a new path (runner.naming)."""
    return load_spec(ref, overrides, notes=notes)


def load_record(path: Path) -> dict[str, Any]:
    """A run record, read and migrated to the current schema (RecordError when it is not one)."""
    from runner.record.records import load as load_rec

    return load_rec(path)


# -- plan --------------------------------------------------------------------------------------------------------


def resolve_for(spec: RunSpec, gpus: list[dict[str, Any]] | int) -> tuple[RunSpec, bool]:
    """The spec with its `auto` values filled for planning, and whether it is only a plan for other hardware:
    resolved for the machine its run will see (runner.machine.target_machine), as the launcher and the estimator
    resolve it. `gpus`: this machine's GPUs as `detect_gpus()` lists them, or their count."""
    from runner.facts.gpus import machine_from_nvml

    here = Machine(gpus) if isinstance(gpus, int) else machine_from_nvml(gpus)
    machine = target_machine(spec, here)
    return resolve(spec, machine=machine), machine.declared


def sweep_target(spec: RunSpec, resolved: RunSpec) -> RunSpec:
    """What a what-if sweep plans: the resolved run; for a CPU run (the what-if is about GPUs) the same run on as
    many GPUs per node as it has ranks, resolved by the same rule as any run."""
    if resolved.hardware.device != "cpu":
        return resolved
    n = resolved.hardware.nproc_per_node
    d = spec.to_dict()
    d["hardware"].update(device="cuda", nproc_per_node=n)
    return resolve(RunSpec.model_validate(d), machine=Machine(n, declared=True))


def estimate(spec: RunSpec) -> Estimate:
    """Per-GPU memory, verdict and time for a resolved spec (runner.plan; `.to_dict()` is `runner estimate --json`)."""
    from runner.plan import estimate as plan_estimate

    return plan_estimate(spec)


def sweep(spec: RunSpec, axes: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """The estimate over the product of the axes' values (field path, values), one dict per combination."""
    from runner.plan import sweep as plan_sweep

    return plan_sweep(spec, axes)


def disk_plan(spec: RunSpec, runs_dir: Path, steps: int | None) -> DiskPlan | None:
    """The run's checkpoints and export against the free space of runs_dir, or None where the model's size cannot
    be read."""
    from runner.errors import UserError
    from runner.gate.disk import disk_plan as plan_disk

    try:
        return plan_disk(spec, runs_dir, steps)
    except UserError:
        return None


def human_bytes(n: float) -> str:
    """A byte count as `runner estimate` prints it (`1.5 GiB`)."""
    from runner.gate.disk import human

    return human(n)


def arch_summary(spec: RunSpec) -> dict[str, Any]:
    """The model's architecture summary, where its config came from, and why it is approximate (if it is)."""
    from runner.facts.catalog import load_arch

    loaded = load_arch(spec)
    out = dict(loaded.arch.summary())
    out["source"] = loaded.source
    if loaded.arch.approximate_reasons:
        out["approximate"] = "; ".join(loaded.arch.approximate_reasons)
    return out


def detect_gpus() -> list[dict[str, Any]]:
    """This machine's GPUs as NVML lists them (empty without NVML or GPUs)."""
    from runner.facts.nvml import detect_gpus as nvml_gpus

    return nvml_gpus()


def gpu_types() -> list[str]:
    """The GPU type names a spec may plan for (hardware.gpu)."""
    from runner.facts.gpus import gpu_names

    return gpu_names()


def launch_commands(resolved: RunSpec) -> list[str]:
    """The torchrun command line of each node, as the launcher would build it (run id and folder left as `<id>`)."""
    from runner.launch.command import build_command, command_line

    return [command_line(build_command(resolved, Path("runs/<id>/spec.json"), "<id>", n))
            for n in range(resolved.hardware.nodes)]


def has_weights(model_dir: Path) -> bool:
    """Whether a local model folder holds weights (a folder with config.json and a tokenizer alone has none)."""
    from runner.decide.loader import has_weights as folder_has_weights

    return folder_has_weights(model_dir)


# -- gate --------------------------------------------------------------------------------------------------------


def gate(spec: RunSpec, force: bool = False, runs_dir: Path | None = None, from_step: int = 0) -> Gate:
    """Everything checked before a resolved run starts, printing nothing: the hub, the estimate (PredictedNotToFit
    for a run predicted not to fit, unless forced), the disk under runs_dir (after `from_step`, a resume's
    checkpoint), preflight (SpecError listing every problem); the Gate holds the estimate the record keeps, the
    packing check's verdict and the notes a face shows."""
    from runner.gate import check

    return check(spec, force, runs_dir, from_step)


def preflight_problems(spec: RunSpec) -> list[Problem]:
    """What would fail early (hub, data columns, chat template, packing, LoRA targets, GPUs), without raising."""
    from runner.gate.hub import hub_problems
    from runner.gate.preflight import preflight_problems as problems

    return hub_problems(spec) + problems(spec)


def hub_problems(spec: RunSpec) -> list[Problem]:
    """The hub model and dataset a run would download, when the hub cannot be reached and they are not cached."""
    from runner.gate.hub import hub_problems as unreachable

    return unreachable(spec)


def packing_check(spec: RunSpec) -> str | None:
    """The packing check's verdict line for a spec preflight passed (cached by that preflight), or None."""
    from runner.gate.preflight import packing_check as check

    verdict = check(spec)
    return None if verdict is None else verdict.describe()


def precision_advice(spec: RunSpec) -> str | None:
    """A warning when the spec's precision would round most optimizer updates away, else None."""
    from runner.gate.preflight import precision_advice as advice

    return advice(spec)


# -- launch, attach ----------------------------------------------------------------------------------------------


def launch(spec: RunSpec, runs_dir: Path, records_dir: Path, estimate: dict[str, Any] | None = None,
           replay_of: str | None = None, node_rank: int = 0, run_id: str | None = None,
           resume: bool = False, decisions: Any = None) -> SupervisedRun:
    """Start a gated, resolved run under its own supervisor (apart from this process and its terminal: closing a
    face never stops it) and return its RunHandle once torchrun started; SupervisorFailed when it could not.
    `decisions`: a replay's recorded ones (`PreparedReplay.decisions`), which its ranks get whole."""
    from runner.launch.supervised import spawn

    return spawn(spec, runs_dir, records_dir, estimate=estimate, replay_of=replay_of, node_rank=node_rank,
                 run_id=run_id, resume=resume, decisions=decisions)


def attach(run_ref: str | Path, runs_dir: Path) -> SupervisedRun:
    """A RunHandle on a run started elsewhere: a run id under runs_dir, or a run folder."""
    from runner.launch.supervised import attach as attach_run

    return attach_run(str(run_ref), runs_dir)


def live_runs(records_dir: Path) -> list[dict[str, Any]]:
    """Records whose run still goes under a supervisor (the lost ones finished first, as failed)."""
    from runner.launch.supervised import live_runs as going

    return going(records_dir)


def is_live(rec: dict[str, Any]) -> bool:
    """Whether a record's run still goes under a supervisor (one on another host is taken as going)."""
    from runner.launch.supervised import is_live as going

    return going(rec)


def reap_lost(records_dir: Path) -> list[str]:
    """Finish, as failed, every running record whose supervisor on this host is gone; their ids."""
    from runner.launch.supervised import reap_lost as reap

    return reap(records_dir)


def run_paths(run_dir: Path) -> RunPaths:
    """The files of a run folder (spec, events, logs, checkpoints)."""
    from runner.events.paths import RunPaths

    return RunPaths(run_dir)


def log_tail(path: Path, max_bytes: int = 20_000) -> str:
    """The end of a rank's log, at most max_bytes, from a line start."""
    from runner.events.failure import log_tail as tail

    return tail(path, max_bytes)


# -- replay ------------------------------------------------------------------------------------------------------


def prepare_replay(path: Path, gpu_count: int | None = None, trust_remote_code: bool = False) -> PreparedReplay:
    """A record's replay, ready to launch: its lock verified, its spec rebuilt with the recorded decisions pinned and
    resolved for this machine (`gpu_count` GPUs; None: ask torch), and the pins that differ from the record's."""
    from runner.launch.replay import prepare_replay as prepare

    return prepare(path, gpu_count, trust_remote_code)


def recorded_decisions(rec: dict[str, Any]) -> Any:
    """The decisions a record's replay gives its ranks whole (a schema-3 record's); None for a record written before,
    whose replay decides again with its recorded choices pinned in the spec."""
    from runner.record.replay import recorded_decisions as whole

    return whole(rec)


def replay_result(original: dict[str, Any], replayed: dict[str, Any], spec: RunSpec) -> dict[str, Any]:
    """The replay's loss curves compared with the record's, within the tolerance the pins that differ allow."""
    from runner.record.replay import compare, drift, tolerance

    rows = drift(original.get("pins") or {}, replayed.get("pins") or {})
    return compare(original, replayed, tolerance(spec, rows))


# -- records -----------------------------------------------------------------------------------------------------


def list_records(records_dir: Path) -> list[dict[str, Any]]:
    """Every record in the folder, migrated to the current schema (unreadable files left out)."""
    from runner.record.records import list_records as listed

    return listed(records_dir)


def find_record(ref: str, records_dir: Path) -> Path:
    """A record's file from its id or path (UserError when there is no such record)."""
    from runner.record.records import find_record as find

    return find(ref, records_dir)


def verify(path: Path) -> tuple[bool, str]:
    """Whether the record's lock matches its content, and a one-line reason."""
    from runner.record.records import verify as check

    return check(path)


def diff_records(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The fields two records differ in (flattened paths), as `runner diff` lists them."""
    from runner.record.compare import diff_records as differ

    return differ(a, b)


def summary_row(rec: dict[str, Any]) -> dict[str, Any]:
    """A record's one-line summary (id, status, model, dataset, method, steps, loss, ...), as `runner list`."""
    from runner.record.compare import summary_row as row

    return row(rec)


def origin(row: dict[str, Any]) -> str:
    """How a run came to be (`replay of <id>`, `resumed ×N`), from its summary row."""
    from runner.record.compare import origin as came

    return came(row)


def dataset_name(spec: dict[str, Any]) -> str | None:
    """A record's dataset as its user named it: the hub id, else the local file or folder's name."""
    from runner.record.compare import dataset_name as name

    return name(spec)


def resume_sentence(rec: dict[str, Any] | None) -> str | None:
    """Whether a cancelled run (or one whose supervisor was lost) can be resumed, and how; None otherwise."""
    from runner.record.compare import resume_sentence as sentence

    return sentence(rec)


# -- the data preview --------------------------------------------------------------------------------------------


def preview_detect(spec: RunSpec) -> dict[str, Any]:
    """A local dataset's file, type, columns and row format (or why none fits); {"hub": id} without a local path."""
    from runner.gate.preview import detect

    return detect(spec)


def preview_tokens(spec: RunSpec) -> dict[str, Any]:
    """One conversation as the trainer tokenises it ((text, trained?) per token) and packing stats on a sample."""
    from runner.gate.preview import tokenizer_preview

    return tokenizer_preview(spec)


# -- after training ----------------------------------------------------------------------------------------------


def load_for_try(record: dict[str, Any], base: bool = False, device: str | None = None) -> TryModel:
    """A trained run's model (or, with base, its base model) loaded to generate and chat with."""
    from runner.train.generate import load_for_try as load_model

    return load_model(record, base, device)


def warm_imports() -> None:
    """Import torch and transformers' config and tokenizer classes (seconds on 2 cores) ahead of their first use."""
    import torch  # noqa: F401

    from runner.imports import from_transformers

    from_transformers("AutoConfig", "AutoTokenizer")

