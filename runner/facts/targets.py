"""The job targets as data: one `Target` record per scheduler `runner job --to` writes a file for, looked up by name
once (`target_for`); the file itself is built by the row's builder in runner/launch/.

The CLI and the job checks read a target's facts from its record, so what a target needs is written once, here,
and nowhere else compares target names (`tests/unit/test_registries.py` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """What writing a job for one scheduler takes: the file, what submits it, and what its nodes share."""

    name: str
    """The `--to` value."""
    builder: str
    """'module:function' in runner/launch/ that returns the job file's text: f(spec, spec_ref, options), spec_ref
    being the spec file's path on the nodes (shared_filesystem) or the resolved spec as JSON data (it travels
    inside the file)."""
    file: str
    """The job file's default name in the run folder."""
    submit: str
    """The command that submits the file, as the messages name it."""
    shared_filesystem: bool = False
    """The nodes see this machine's run and records folders at the same absolute paths (and its venv), which go
    into the file's header lines (no spaces); False: they share a volume mounted at --mount, and the spec travels
    inside the job file."""
    volume: str | None = None
    """What --volume names for this target (required); None when the nodes share a filesystem instead."""
    bucket_volumes: bool = False
    """--volume may be a bucket URI, mounted whole: its prefix becomes a folder under the mount."""
    needs_image: str | None = None
    """Why the target runs only in a container image with the project installed (--image is required); None:
    --image is optional."""
    venv: str | None = None
    """Without --image, each node installs the project from git (--repo at --commit) into this venv; None: the
    nodes run this machine's venv or the image's python."""
    names_accelerator: bool = False
    """The file names the GPU type: hardware.gpu=auto on GPUs needs --accelerator."""
    time_limit: bool = False
    """The scheduler stops the job at --time, signalling the run --warn-s seconds before so it checkpoints; without
    it, a lost node restarts the run from its last periodic checkpoint (train.checkpoint_every)."""
    dns_job_name: bool = False
    """The job's name must be a DNS label short enough for every pod name made from it (not the spec's name)."""

    @property
    def suffix(self) -> str:
        """The job file's suffix (`.sh`, `.yaml`)."""
        return self.file[self.file.rindex("."):]


SLURM = Target(name="slurm", builder="runner.launch.slurm:build_sbatch", file="sbatch.sh", submit="sbatch",
               shared_filesystem=True, time_limit=True)
SKYPILOT = Target(name="skypilot", builder="runner.launch.skypilot:build_skypilot", file="skypilot.yaml",
                  submit="sky jobs launch", volume="a bucket URI (s3://..., gs://...) or a SkyPilot volume name",
                  bucket_volumes=True, venv="$HOME/sft-tui-venv", names_accelerator=True)
KUBEFLOW = Target(name="kubeflow", builder="runner.launch.kubeflow:build_trainjob", file="trainjob.yaml",
                  submit="kubectl apply -f", volume="a PersistentVolumeClaim name (ReadWriteMany)", needs_image="a TrainJob runs a container image with this project installed",
                  dns_job_name=True)
TARGETS: dict[str, Target] = {t.name: t for t in (SLURM, SKYPILOT, KUBEFLOW)}


def target_for(name: str) -> Target:
    """The record of job target `name` (a --to value, or a record's launch.job.target)."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"job target must be one of {', '.join(TARGETS)}, got {name!r}") from None
