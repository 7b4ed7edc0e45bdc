"""The SkyPilot task YAML: num_nodes x accelerators, the project installed at its commit, the run folder on a
bucket or volume every node mounts."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from runner.launch.jobs import JOB_ENV, NODE_SPEC_FILE, SPEC_ENV, JobOptions, gpus_per_node, node_script
from runner.errors import UserError
from runner.facts.targets import SKYPILOT
from runner.spec import RunSpec

# A bucket is mounted with rclone's write cache (SkyPilot's MOUNT_CACHED): the run folder appends to event files
# and renames checkpoint folders, which MOUNT (goofys/gcsfuse straight to the bucket) does not support, and SkyPilot
# mounts only a whole bucket, never a prefix inside it, in either mode.
STORAGE_MODE = "MOUNT_CACHED"
# SkyPilot's accelerator names where they differ from the GPU names of runner/facts/gpus.py.
ACCELERATORS = {"H100-80GB": "H100", "A100-40GB": "A100"}
VENV = SKYPILOT.venv


def accelerator(spec: RunSpec, override: str | None) -> str | None:
    gpu = override or spec.hardware.gpu
    if gpu == "auto":
        return None
    return ACCELERATORS.get(gpu, gpu)


def bucket_layout(volume: str) -> tuple[str, PurePosixPath]:
    """A bucket URI as SkyPilot mounts it: (the bucket alone, the prefix inside it that holds runs/ and records/).
    `s3://my-bucket/sft` -> (`s3://my-bucket`, `sft`)."""
    scheme, _, rest = volume.partition("://")
    bucket, _, prefix = rest.strip("/").partition("/")
    return f"{scheme}://{bucket}", PurePosixPath(prefix or ".")


_SCP_LIKE = re.compile(r"^(?:(?P<user>[\w.-]+)@)?(?P<host>[\w.-]+):(?P<path>(?!/)[^\s]+)$")


def pip_git_url(repo: str) -> str:
    """A git remote as pip installs it on a node: `git+https://...` or `git+ssh://git@host/path`, from a URL or
    scp-like remote (`git@github.com:you/x.git`). A local folder is refused: the nodes cannot reach it."""
    if repo.startswith("git+"):
        return repo
    if re.match(r"^(https?|ssh|git)://", repo):
        return f"git+{repo}"
    m = _SCP_LIKE.match(repo)
    if m and not Path(repo).exists():
        return f"git+ssh://{m.group('user') or 'git'}@{m.group('host')}/{m.group('path')}"
    where = repo.removeprefix("file://")
    raise UserError(f"the project's git remote '{where}' (--repo, default the origin remote) is a folder on this "
                    "machine, which the nodes cannot install from: pass "
                    "--repo with a URL they can clone (e.g. --repo https://github.com/you/sft-tui.git, pushed at the "
                    "commit), or --image IMAGE with the project installed")


def setup_script(o: JobOptions) -> str:
    """Installs the project at the commit the job was written from, into a venv of its own, on every node."""
    src = shlex.quote(f"sft-tui @ {pip_git_url(o.repo or '')}@{o.commit}")
    return (f"set -e\n"
            f"python3 -m venv {VENV}\n"
            f"{VENV}/bin/pip install --quiet {src}\n")


def build_skypilot(spec: RunSpec, spec_json: dict[str, Any], o: JobOptions) -> str:
    """The task YAML for spec under run o.run_id. Pure: same inputs, same text."""
    gpus = gpus_per_node(spec)
    resources: dict[str, Any] = {}
    if gpus:
        resources["accelerators"] = f"{accelerator(spec, o.accelerator)}:{gpus}"
    if o.image:
        resources["image_id"] = f"docker:{o.image}"
    endpoint = f'"$MASTER_ADDR:{o.port}"'
    sets = ('hardware.nproc_per_node="$SKYPILOT_NUM_GPUS_PER_NODE"',) if gpus else ()
    run = (
        "set -e\n"
        # SKYPILOT_NODE_IPS lists the nodes one per line, the head node (rank 0) first.
        'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | sed -n 1p)\n'
        f"mkdir -p {shlex.quote(str(o.runs_dir))} {shlex.quote(str(o.records_dir))}\n"
        f'printf "%s" "${SPEC_ENV}" > {NODE_SPEC_FILE}\n'
        + node_script(NODE_SPEC_FILE, o, '"$SKYPILOT_NODE_RANK"', endpoint, sets) + "\n"
    )
    task: dict[str, Any] = {
        "name": spec.name,
        "num_nodes": spec.hardware.nodes,
        "resources": resources,
        "envs": {SPEC_ENV: json.dumps(spec_json, sort_keys=True, separators=(",", ":")),
                 JOB_ENV: o.job_env(spec.name)},
    }
    volume = o.volume or ""
    if "://" in volume:
        task["file_mounts"] = {str(o.mount): {"source": bucket_layout(volume)[0], "mode": STORAGE_MODE}}
    else:
        task["volumes"] = {str(o.mount): volume}
    if not o.image:
        task["setup"] = setup_script(o)
    task["run"] = run
    header = (f"# Written by `runner job --to skypilot` for run {o.run_id}: {spec.hardware.nodes} node(s) x "
              f"{spec.hardware.nproc_per_node} rank(s).\n# Launch with `sky jobs launch <this file>` (recovers from "
              f"preemption, resuming from the latest checkpoint) or `sky launch`.\n")
    return header + dump_yaml(task)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (scripts) as `|` blocks, so the file reads as the shell it runs."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, width=1000)
