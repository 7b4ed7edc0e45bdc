"""The SLURM batch script: one task per node, a warning signal before the time limit, requeue and resume."""

from __future__ import annotations

import shlex

from runner.launch.jobs import JOB_ENV, JobOptions, gpus_per_node, node_script
from runner.spec import RunSpec

# The batch shell gets USR1 (B:) warn_s seconds before the time limit. srun passes it on to every process of the
# step: the run checkpoints and is recorded as preempted. The job then queues itself again and the next start finds
# the checkpoint and resumes the same run id. `wait` returns early when a trapped signal lands, so it is called
# again until srun is gone. A node whose run stopped gracefully ends its task with 0 (NODE_TAIL): the batch shell
# exits with the code that node kept, unless it requeues the job.
TAIL = """\
PREEMPTED=0
rm -f {stopped}-*
trap 'PREEMPTED=1; [ -z "${{SRUN_PID:-}}" ] || kill -USR1 "$SRUN_PID" 2>/dev/null || true' USR1
srun --kill-on-bad-exit=1{container} bash -c {script} &
SRUN_PID=$!
STATUS=0
while :; do
  wait "$SRUN_PID" && STATUS=0 || STATUS=$?
  kill -0 "$SRUN_PID" 2>/dev/null || break
done
if [ "$PREEMPTED" = 1 ]; then
  echo "time limit near: the run checkpointed; requeueing job $SLURM_JOB_ID to resume it" >&2
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
if [ "$STATUS" = 0 ] && STOPPED=$(cat {stopped}-* 2>/dev/null | sort -n | tail -n 1) && [ -n "$STOPPED" ]; then
  exit "$STOPPED"
fi
exit "$STATUS"
"""
# Each node's task. USR1 reaches every process of the step: runner starts with it ignored until it has its handler.
# The shell outlives runner (a trapped TERM waits for it) to read its exit code: 130 or 143 is a graceful stop
# (cancel, SIGTERM, preemption) with a checkpoint, and srun would take it for a crash (--kill-on-bad-exit) and
# terminate the other nodes' step while they still stop and node 0 writes the record. So the task ends 0 and the
# code waits in the run folder for the batch shell.
NODE_HEAD = 'trap "" USR1\ntrap : TERM\n'
NODE_TAIL = """
code=$?
case "$code" in
  130|143) echo "$code" > {stopped}-"$SLURM_NODEID"; exit 0 ;;
esac
exit "$code"
"""


def build_sbatch(spec: RunSpec, spec_file: str, o: JobOptions) -> str:
    """The sbatch script for spec under run o.run_id. Pure: same inputs, same text. #SBATCH lines expand no shell
    variables, so every path in them is already absolute."""
    h = spec.hardware
    gpus = gpus_per_node(spec)
    header = [
        "#!/bin/bash",
        f"# Written by `runner job --to slurm` for run {o.run_id}: {h.nodes} node(s) x {h.nproc_per_node} rank(s).",
        f"# Submit with `sbatch <this file>`. Every node must see {o.runs_dir} and {o.records_dir}",
        "# (a shared filesystem): events of all nodes land in one run folder, node 0 writes the record.",
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --nodes={h.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={gpus}"] if gpus else []),
        "#SBATCH --exclusive",
        f"#SBATCH --time={o.time}",
        f"#SBATCH --signal=B:USR1@{o.warn_s}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={o.run_dir}/logs/slurm-%j.out",
        "set -euo pipefail",
        'RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "export RDZV_HOST",
        f"export {JOB_ENV}={shlex.quote(o.job_env(spec.name))}",
    ]
    container = ""
    if o.image:
        # pyxis/enroot: the shared folders are mounted at the same paths inside the container.
        mounts = ",".join(f"{p}:{p}" for p in dict.fromkeys((str(o.runs_dir), str(o.records_dir))))
        container = f" --container-image={shlex.quote(o.image)} --container-mounts={shlex.quote(mounts)}"
    stopped = shlex.quote(str(o.run_dir / "logs" / "stopped-node"))
    script = (NODE_HEAD + node_script(spec_file, o, '"$SLURM_NODEID"', f'"$RDZV_HOST:{o.port}"', start="")
              + NODE_TAIL.format(stopped=stopped))
    return "\n".join(header) + "\n" + TAIL.format(container=container, script=shlex.quote(script), stopped=stopped)
