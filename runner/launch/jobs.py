"""Job files for schedulers (SLURM, SkyPilot, Kubeflow Trainer): what every target shares, and the checks that run
before anything is written.

Every job runs one resolved spec under one run id chosen when the file is written; every node runs the same
`runner run` (torchrun inside) with the target's rendezvous variables, and all of them write into one shared run
folder, where node 0 writes the record. A node that finds a complete checkpoint in that folder (a requeued or
restarted job) resumes the run instead of starting it again.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from runner.errors import UserError
from runner.events.paths import CHECKPOINT_LAYOUTS
from runner.facts.targets import TARGETS, target_for

if TYPE_CHECKING:  # the spec module (pydantic) loads only when a job is written
    from runner.spec import RunSpec

# The environment variable through which the job tells the run how it was written (the record keeps it: replay
# prints the command that writes the job again).
JOB_ENV = "SFT_TUI_JOB"
# SkyPilot and Kubeflow nodes share no filesystem with the machine that writes the job: the spec travels inline.
SPEC_ENV = "SFT_TUI_SPEC"
NODE_SPEC_FILE = "/tmp/sft-tui-spec.json"
SLURM_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")


@dataclass(frozen=True)
class JobOptions:
    """How a job is written. Paths are as the nodes see them (absolute)."""

    target: str
    run_id: str
    runs_dir: PurePosixPath
    records_dir: PurePosixPath
    runner: str
    """How a node starts `runner`: shell words (a venv's absolute python, or the image's)."""
    port: int = 29500
    image: str | None = None
    time: str = "24:00:00"
    warn_s: int = 300
    volume: str | None = None
    mount: PurePosixPath = PurePosixPath("/sft-tui")
    repo: str | None = None
    commit: str | None = None
    accelerator: str | None = None
    rerun_args: tuple[str, ...] = ()
    """The `runner job` options that write this job again (kept in the record through JOB_ENV)."""

    @property
    def run_dir(self) -> PurePosixPath:
        return self.runs_dir / self.run_id

    def job_env(self, name: str) -> str:
        return json.dumps({"target": self.target, "name": name, "rerun_args": list(self.rerun_args)},
                          separators=(",", ":"))


def node_script(spec_file: str, o: JobOptions, node_rank: str, endpoint: str, extra_sets: tuple[str, ...] = (),
                start: str = "exec ") -> str:
    """The shell lines every node runs. node_rank and endpoint are shell words the node expands (its scheduler's
    variables); everything else is quoted. `start` precedes runner: `exec ` makes runner the process the scheduler
    signals; "" keeps the shell, for lines after runner that read its exit code."""
    q = shlex.quote
    sets = "".join(f" --set {s}" for s in (f"hardware.rdzv_endpoint={endpoint}", *extra_sets))
    tail = f"--node-rank {node_rank} --records-dir {q(str(o.records_dir))}{sets} --plain"
    run_dir = q(str(o.run_dir))
    # A restart before the first checkpoint starts the run again: node 0 sets the attempt's rank events aside
    # first (ranks write none before every node has joined), so the record counts each step once.
    # A complete checkpoint of either engine (runner.events.paths.CHECKPOINT_LAYOUTS) means resume.
    done = " ".join(f"{run_dir}/checkpoints/{prefix}*/{last}" for prefix, last in CHECKPOINT_LAYOUTS)
    return (f"if ls -d {done} 2>/dev/null | grep -q .; then\n"
            f"  {start}{o.runner} run --resume {run_dir} {tail}\n"
            "else\n"
            f"  if [ {node_rank} = 0 ] && ls {run_dir}/events/rank*.jsonl >/dev/null 2>&1; then\n"
            f"    old={run_dir}/events.before-$(date +%s) && mkdir -p \"$old\" && mv {run_dir}/events/rank*.jsonl "
            "\"$old\"/\n"
            "  fi\n"
            f"  {start}{o.runner} run {q(spec_file)} --run-id {q(o.run_id)} --runs-dir {q(str(o.runs_dir))} {tail}\n"
            "fi")


def gpus_per_node(spec: RunSpec) -> int:
    return int(spec.hardware.nproc_per_node) if spec.hardware.device != "cpu" else 0


# JobSet names a TrainJob's pods `<trainjob>-<replicated job>-<job index>-<pod index>-<5 random characters>` and
# refuses a TrainJob whose longest pod name would pass 63 characters (a DNS label). The torch-distributed runtime's
# replicated job is `node`, its job index 0 and its pod index the node's; the tail below leaves room for 9999
# nodes and a two-digit job index.
POD_NAME_TAIL = "-node-99-9999-abcde"
TRAINJOB_NAME_MAX = 63 - len(POD_NAME_TAIL)


def job_name(spec: RunSpec, run_id: str, target: str) -> str:
    """SLURM and SkyPilot take the spec's name; a TrainJob's name is a DNS label short enough that every pod name
    JobSet makes from it is one too: `sft-<run id>`, cut and suffixed with a hash of the whole when too long."""
    if not target_for(target).dns_job_name:
        return spec.name
    label = re.sub(r"[^a-z0-9-]+", "-", f"sft-{run_id}".lower()).strip("-")
    if len(label) <= TRAINJOB_NAME_MAX:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:6]
    return f"{label[:TRAINJOB_NAME_MAX - 7].rstrip('-')}-{digest}"


def label_value(text: str) -> str:
    """text as a Kubernetes label value: at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")


def check_job(spec: RunSpec, target: str, image: str | None, volume: str | None, time: str, warn_s: int,
              port: int = 29500) -> None:
    """Every reason not to write the job, as one line with the fix; runs before any file or folder is made."""
    if target not in TARGETS:
        raise UserError(f"--to expects one of {', '.join(TARGETS)}, got '{target}'")
    if spec.hardware.nproc_per_node == "auto":
        raise UserError(f"runner job --to {target} needs hardware.nproc_per_node (ranks per node): the nodes are not "
                        "visible from here; e.g. --set hardware.nproc_per_node=8")
    t = TARGETS[target]
    if t.needs_image and not image:
        raise UserError(f"--to {target} needs --image IMAGE: {t.needs_image} (e.g. --image "
                        "ghcr.io/you/sft-tui:<commit>)")
    if t.volume and not volume:
        raise UserError(f"--to {target} needs --volume: the nodes share the run folder through it; give {t.volume}")
    if t.time_limit and not SLURM_TIME.match(time):
        raise UserError(f"--time expects SLURM's [D-]HH:MM:SS (or MM, HH:MM), got '{time}'; e.g. --time 24:00:00")
    if warn_s <= 0:
        raise UserError(f"--warn-s expects seconds > 0 before the time limit, got {warn_s}; e.g. --warn-s 300")
    if not 0 < port < 65536:
        raise UserError(f"--port expects a TCP port (1-65535) for the rendezvous, got {port}; e.g. --port 29500")


def check_paths(*paths: Path) -> None:
    for p in paths:
        if re.search(r"\s", str(p)):
            raise UserError(f"{p}: a path with spaces cannot go into an #SBATCH line; use a folder without spaces")


def job_warnings(spec: RunSpec, target: str) -> list[str]:
    if not target_for(target).time_limit and spec.train.checkpoint_every == 0:
        return [f"train.checkpoint_every is 0: when {target} restarts a job whose node was lost (a preempted spot "
                "node), the run starts again from step 0; e.g. --set train.checkpoint_every=200"]
    return []


def render_job(spec: RunSpec, o: JobOptions, spec_path: Path) -> str:
    """The job file of o.target for spec, by the target's builder; spec_path is the run's spec.json here."""
    import importlib

    t = target_for(o.target)
    module, func = t.builder.split(":")
    spec_ref = str(o.run_dir / "spec.json") if t.shared_filesystem else json.loads(spec_path.read_text())
    return getattr(importlib.import_module(module), func)(spec, spec_ref, o)
