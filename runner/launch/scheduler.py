"""Where a node runs: the scheduler, job id and nodes read from its environment (SLURM, SkyPilot, Kubernetes), and
the job file that started it. The record keeps both in its `launch` section."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from runner.launch.jobs import JOB_ENV


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def scheduler_facts(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """{"name", "job_id", "nodes", "node_count", ...} for the scheduler this process runs under; None when none."""
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID"):
        return {"name": "slurm", "job_id": env["SLURM_JOB_ID"], "nodes": env.get("SLURM_JOB_NODELIST"),
                "node_count": _int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")),
                "restart_count": _int(env.get("SLURM_RESTART_COUNT")) or 0, "cluster": env.get("SLURM_CLUSTER_NAME")}
    if env.get("SKYPILOT_TASK_ID"):
        ips = [ip for ip in env.get("SKYPILOT_NODE_IPS", "").split() if ip]
        return {"name": "skypilot", "job_id": env["SKYPILOT_TASK_ID"], "nodes": ips,
                "node_count": _int(env.get("SKYPILOT_NUM_NODES")) or len(ips) or None}
    if env.get("KUBERNETES_SERVICE_HOST"):
        job = job_facts(env) or {}
        # The pod of node 0 (its hostname); a TrainJob's name is the job id (the job file passes it in JOB_ENV).
        return {"name": "kubernetes", "job_id": job.get("name"), "nodes": env.get("HOSTNAME"),
                "node_count": _int(env.get("PET_NNODES"))}
    return None


def job_facts(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """What `runner job` wrote into the job file it generated ({"target", "name", "rerun_args"}); None outside one."""
    env = os.environ if env is None else env
    raw = env.get(JOB_ENV)
    if not raw:
        return None
    try:
        facts = json.loads(raw)
    except ValueError:
        return None
    return facts if isinstance(facts, dict) and facts.get("target") else None
