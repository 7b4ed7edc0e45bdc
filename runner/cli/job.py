"""`runner job SPEC --to slurm|skypilot|kubeflow`: write the job file for a scheduler (and `runner slurm`, its
shorthand), and the lines `runner replay` prints to rerun a record's job where it ran."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from runner.errors import UserError
from runner.facts.targets import TARGETS, Target
from runner.launch.jobs import JobOptions, check_job, check_paths, job_warnings, render_job
from runner.writes import atomic_write_text

if TYPE_CHECKING:  # the spec module (pydantic) loads only when a job is written
    from runner.spec import RunSpec

# Options that shape the job file, as (flag, attribute): what `runner replay` passes again to write the same job.
RERUN_OPTIONS = (("--image", "image"), ("--time", "time"), ("--warn-s", "warn_s"), ("--volume", "volume"),
                 ("--mount", "mount"), ("--repo", "repo"), ("--commit", "commit"), ("--accelerator", "accelerator"),
                 ("--port", "port"), ("--runner", "runner"), ("--runs-dir", "runs_dir"),
                 ("--records-dir", "records_dir"))


def add_job_args(p: argparse.ArgumentParser, with_target: bool) -> None:
    p.add_argument("spec", metavar="SPEC", help="recipe name, YAML/JSON spec, or a record (path or id) to run again")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a spec field, e.g. --set hardware.nodes=2 (repeatable)")
    if with_target:
        p.add_argument("--to", required=True, metavar="TARGET", help=f"the scheduler: {', '.join(TARGETS)}")
    p.add_argument("-o", "--out", type=Path, help="job file path (default: <runs-dir>/<id>/<target's file name>)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"),
                   help="SLURM: the shared run folder, made absolute; elsewhere: where the local copy goes")
    p.add_argument("--records-dir", type=Path, default=Path("records"),
                   help="SLURM: the shared records folder, made absolute (default: records)")
    p.add_argument("--image", help="container image with the project installed (SLURM: pyxis/enroot "
                                   "--container-image; required for kubeflow)")
    p.add_argument("--time", default="24:00:00", help="SLURM time limit, [D-]HH:MM:SS (default 24:00:00)")
    p.add_argument("--warn-s", type=int, default=300,
                   help="SLURM: seconds before the time limit when USR1 asks the run to checkpoint (default 300)")
    p.add_argument("--volume", help="the shared run folder: kubeflow, a PersistentVolumeClaim name; skypilot, a bucket "
                                    "URI (s3://, gs://, ...) or a SkyPilot volume name")
    p.add_argument("--mount", default="/sft-tui",
                   help="skypilot/kubeflow: where the volume is mounted on every node (default /sft-tui)")
    p.add_argument("--repo", help="skypilot: git URL each node installs the project from (default: the origin remote)")
    p.add_argument("--commit", help="skypilot: the commit to install (default: this checkout's HEAD)")
    p.add_argument("--accelerator", help="skypilot: accelerator name (default: from hardware.gpu, e.g. H100)")
    p.add_argument("--port", type=int, default=29500, help="rendezvous port on node 0 (SLURM, SkyPilot; default 29500)")
    p.add_argument("--runner", help="how a node starts runner (default: this venv's python -m runner; with an image "
                                    "or on kubeflow, the image's python -m runner)")


def record_spec(ref: str, overrides: list[str], records_dir: Path) -> RunSpec | None:
    """When SPEC is a record (a path or an id), its own resolved spec (a record's job runs it again); else None."""
    from runner.record.records import load, verify
    from runner.record.replay import spec_from_record
    from runner.spec import apply_override, validate

    path = Path(ref) if Path(ref).suffix == ".json" else records_dir / f"{ref}.json"
    if not path.is_file() or not _is_record(path):
        return None
    ok, reason = verify(path)
    if not ok:
        raise UserError(f"refusing to write a job from {path}: {reason}")
    data = spec_from_record(load(path)).to_dict()
    for assignment in overrides:
        apply_override(data, assignment)
    return validate(data)


def _is_record(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "lock" in data and "spec" in data and "pins" in data


def _git(*args: str) -> str | None:
    import subprocess

    from runner.launch.run import REPO_DIR

    try:
        out = subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _source(args: argparse.Namespace, target: Target) -> tuple[str, str]:
    """Where the nodes install the project from (`Target.venv`): a git URL and a commit (pushed: the nodes fetch
    it)."""
    repo = args.repo or _git("remote", "get-url", "origin")
    commit = args.commit or _git("rev-parse", "HEAD")
    if not repo:
        raise UserError(f"--to {target.name} installs the project from git on every node: give --repo URL (this "
                        "checkout has no `origin` remote), or --image IMAGE with the project installed")
    if not commit:
        raise UserError(f"--to {target.name} needs the commit to install: give --commit SHA (no git checkout here)")
    from runner.launch.skypilot import pip_git_url

    pip_git_url(repo)  # refuses a remote the nodes cannot install from, before anything is written
    if not args.commit and _git("status", "--porcelain"):
        print("warning: this checkout has uncommitted changes; the nodes install the commit without them",
              file=sys.stderr)
    return repo, commit


def _runner_cmd(args: argparse.Namespace, target: Target) -> str:
    if args.runner:
        return args.runner
    if args.image or target.needs_image:
        return "python -m runner"
    if target.venv:
        return f"{target.venv}/bin/python -m runner"
    # The venv that writes the job runs it (the shared filesystem has it at the same path): never a bare `runner`.
    return shlex.join([os.path.abspath(sys.executable), "-m", "runner"])


def job_options(args: argparse.Namespace, target: Target, run_id: str) -> JobOptions:
    if target.shared_filesystem:
        runs, records = PurePosixPath(args.runs_dir.resolve()), PurePosixPath(args.records_dir.resolve())
    else:
        base = PurePosixPath(args.mount)
        if target.bucket_volumes and "://" in (args.volume or ""):
            from runner.launch.skypilot import bucket_layout

            base = base / bucket_layout(args.volume)[1]  # the bucket is mounted whole: its prefix is a folder
        runs, records = base / "runs", base / "records"
    rerun = ["--to", target.name]
    for flag, attr in RERUN_OPTIONS:
        if attr in ("runs_dir", "records_dir"):  # only a shared filesystem's are the nodes' folders
            value = str(runs if attr == "runs_dir" else records) if target.shared_filesystem else None
        else:
            value = getattr(args, attr)
        if value is not None and value != _DEFAULTS.get(attr):
            rerun += [flag, str(value)]
    return JobOptions(target=target.name, run_id=run_id, runs_dir=runs, records_dir=records,
                      runner=_runner_cmd(args, target), port=args.port, image=args.image, time=args.time,
                      warn_s=args.warn_s, volume=args.volume, mount=PurePosixPath(args.mount), repo=args.repo,
                      commit=args.commit, accelerator=args.accelerator, rerun_args=tuple(rerun))


_DEFAULTS: dict[str, Any] = {"time": "24:00:00", "warn_s": 300, "mount": "/sft-tui", "port": 29500}


def write_job(args: argparse.Namespace, spec: RunSpec) -> int:
    """`runner job` once SPEC is loaded: check everything, then allocate the run id, write its spec and the file."""
    from runner.events.paths import RunPaths
    from runner.launch.command import new_run_id, write_spec
    from runner.machine import Machine
    from runner.spec import resolve

    name = getattr(args, "to", None) or "slurm"  # `runner slurm` has no --to
    check_job(spec, name, args.image, args.volume, args.time, args.warn_s, args.port)
    target = TARGETS[name]
    if target.shared_filesystem:
        check_paths(args.runs_dir.resolve(), args.records_dir.resolve())
    if target.venv and not args.image:
        args.repo, args.commit = _source(args, target)
    nproc = int(spec.hardware.nproc_per_node)
    # The nodes, not this machine, decide what `auto` means: GPUs unless the spec asks for CPU ranks.
    spec = resolve(spec, machine=Machine(nproc, declared=True) if spec.hardware.device != "cpu" else Machine())
    if target.names_accelerator and spec.hardware.device == "cuda" and spec.hardware.gpu == "auto" \
            and not args.accelerator:
        raise UserError(f"--to {name} needs the GPU type for resources.accelerators: --set hardware.gpu=H100-80GB "
                        "or --accelerator H100")
    for warning in job_warnings(spec, name):
        print(f"warning: {warning}", file=sys.stderr)
    run_id = new_run_id(spec.name, args.runs_dir, args.records_dir)
    options = job_options(args, target, run_id)
    paths = RunPaths(args.runs_dir / run_id)
    write_spec(paths, spec)
    out = args.out or paths.run_dir / target.file
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render_job(spec, options, paths.spec))  # whole or not at all (a full disk)
    print(f"wrote {out}: run {run_id}, {spec.hardware.nodes} node(s) x {spec.hardware.nproc_per_node} rank(s); "
          f"submit with `{target.submit} {out}`")
    return 0


def rerun_lines(rec: dict[str, Any], record_path: Path) -> list[str] | None:
    """For a record a generated job wrote: the commands that write the same job again and submit it; else None."""
    launch = rec.get("launch") or {}
    job = launch.get("job")
    if not isinstance(job, dict) or job.get("target") not in TARGETS:
        return None
    target = TARGETS[job["target"]]
    out = f"{rec['id']}-rerun{target.suffix}"
    return [shlex.join(["runner", "job", str(record_path), *job.get("rerun_args", ["--to", target.name]), "-o", out]),
            f"{target.submit} {out}"]
