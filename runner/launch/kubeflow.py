"""The Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1) on the torch-distributed runtime, with the run
folder on a PersistentVolumeClaim every node mounts."""

from __future__ import annotations

import json
import shlex
from typing import Any

from runner.launch.jobs import (JOB_ENV, NODE_SPEC_FILE, SPEC_ENV, JobOptions, gpus_per_node, job_name, label_value,
                                 node_script)
from runner.launch.skypilot import dump_yaml
from runner.spec import RunSpec

API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME = "torch-distributed"
# The torch-distributed runtime's replicated job and its container are both named "node".
NODE = "node"
VOLUME_NAME = "sft-tui-shared"


def build_trainjob(spec: RunSpec, spec_json: dict[str, Any], o: JobOptions) -> str:
    """The TrainJob YAML for spec under run o.run_id. Pure: same inputs, same text. The runtime injects PET_NNODES,
    PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT and PET_NPROC_PER_NODE into every node; the node's torchrun gets
    its rank and rendezvous from them."""
    gpus = gpus_per_node(spec)
    name = job_name(spec, o.run_id, o.target)
    script = (f"mkdir -p {shlex.quote(str(o.runs_dir))} {shlex.quote(str(o.records_dir))}\n"
              f'printf "%s" "${SPEC_ENV}" > {NODE_SPEC_FILE}\n'
              + node_script(NODE_SPEC_FILE, o, '"$PET_NODE_RANK"', '"$PET_MASTER_ADDR:$PET_MASTER_PORT"'))
    trainer: dict[str, Any] = {
        "image": o.image,
        "command": ["bash", "-c", script],
        "numNodes": spec.hardware.nodes,
        "numProcPerNode": int(spec.hardware.nproc_per_node),
        "env": [{"name": SPEC_ENV, "value": json.dumps(spec_json, sort_keys=True, separators=(",", ":"))},
                {"name": JOB_ENV, "value": o.job_env(name)}],
    }
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    pod = {"volumes": [{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": o.volume}}],
           "containers": [{"name": NODE, "volumeMounts": [{"name": VOLUME_NAME, "mountPath": str(o.mount)}]}]}
    job = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        # The name may be cut to keep pod names short: the labels keep the run id and the spec's name whole.
        "metadata": {"name": name, "labels": {"sft-tui/run-id": label_value(o.run_id),
                                              "sft-tui/name": label_value(spec.name)}},
        "spec": {
            "runtimeRef": {"name": RUNTIME, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "trainer": trainer,
            "runtimePatches": [{"manager": "sft-tui", "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": NODE, "template": {"spec": {"template": {"spec": pod}}}}]}}}}],
        },
    }
    header = (f"# Written by `runner job --to kubeflow` for run {o.run_id}: {spec.hardware.nodes} node(s) x "
              f"{spec.hardware.nproc_per_node} rank(s).\n# Submit with `kubectl apply -f <this file>`; the claim "
              f"{o.volume} (ReadWriteMany) holds the run folder of every node.\n")
    return header + dump_yaml(job)
