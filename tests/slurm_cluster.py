"""A real SLURM cluster on this machine for tests: Debian's munged, slurmctld and one slurmd per node (`slurmd -N`,
each with its own port and spool), configured in a temporary folder and stopped afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue")
PACKAGES = ("slurm-wlm", "munge")
SBIN = ("/usr/sbin", "/sbin")


def which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def missing_tools() -> list[str]:
    return [d for d in DAEMONS if which(d) is None]


def install_or_reason() -> str | None:
    """Install Debian's slurm-wlm and munge when missing and allowed (root with apt-get, or SFT_TUI_INSTALL_SLURM=1
    with sudo); None once the tools are there, else why they are not."""
    if not missing_tools():
        return None
    apt = shutil.which("apt-get")
    if apt is None:
        return f"SLURM tools missing ({', '.join(missing_tools())}) and no apt-get to install {' '.join(PACKAGES)}"
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"] if os.environ.get("SFT_TUI_INSTALL_SLURM") == "1" else None
    if prefix is None:
        return (f"SLURM tools missing ({', '.join(missing_tools())}); install them with `apt-get install -y "
                f"{' '.join(PACKAGES)}` (as root), or set SFT_TUI_INSTALL_SLURM=1 to let the tests use sudo")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([*prefix, apt, "update", "-qq"], [*prefix, apt, "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return None if not missing_tools() else f"still missing after install: {', '.join(missing_tools())}"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Cluster:
    """One slurmctld and `nodes` slurmd on localhost, all configured under `root`."""

    root: Path
    nodes: int
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment that points SLURM's commands at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def node_names(self) -> list[str]:
        # The job's first node (SLURM sorts them by name) is the rendezvous host every node connects to: this
        # machine's name, which resolves; the others' names sort after it.
        return [self.host, *(f"{self.host}x{i}" for i in range(1, self.nodes))]

    def write_config(self) -> None:
        r = self.root
        for d in ("state", "log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        ctld, *node_ports = free_ports(1 + self.nodes)
        self.munge_socket = r / "run" / "munge.socket"
        nodes = "\n".join(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={p} CPUs=2 "
                          "RealMemory=1000 State=UNKNOWN" for n, p in zip(self.node_names(), node_ports))
        self.conf.write_text(f"""\
ClusterName=sfttest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket},cred_expire=5
CredType=cred/munge
SlurmUser={os.environ.get("USER") or "root"}
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
MinJobAge=300
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        # The cgroup plugins stay off (processes are tracked by parentage); the file only keeps slurmd from
        # reading the system's.
        (r / "cgroup.conf").write_text("CgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\n")

    def start(self, timeout_s: float = 60) -> None:
        self.write_config()
        r = self.root
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._daemon([which("munged"), "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                      f"--pid-file={r}/run/munged.pid", f"--log-file={r}/log/munged.log",
                      f"--seed-file={r}/run/munged.seed"], "munged")
        self._wait(lambda: self.munge_socket.exists(), timeout_s, "munged")
        self._daemon([which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self._run(["scontrol", "ping"]).returncode == 0, timeout_s, "slurmctld")
        for n in self.node_names():
            (r / f"spool-{n}").mkdir(exist_ok=True)
            self._daemon([which("slurmd"), "-D", "-N", n, "-f", str(self.conf)], f"slurmd-{n}")
        self._wait(self._nodes_idle, timeout_s, "slurmd")

    def _daemon(self, argv: list, name: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        self.procs.append(subprocess.Popen([str(a) for a in argv], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()

    def _run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=30)

    def _nodes_idle(self) -> bool:
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(n) == "idle" for n in self.node_names())

    def _wait(self, cond, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}; logs in {self.root / 'log'}:\n"
                                       + self.logs())
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready within {timeout_s} s; logs in {self.root / 'log'}:\n" + self.logs())

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted((self.root / "log").glob("*")))

    def scontrol(self, *args: str) -> str:
        done = self._run(["scontrol", *args])
        assert done.returncode == 0, done.stderr
        return done.stdout

    def sbatch(self, script: Path, cwd: Path) -> str:
        done = subprocess.run(["sbatch", "--parsable", str(script)], env=self.env, cwd=cwd, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def scancel(self, *args: str) -> None:
        done = self._run(["scancel", *args])
        assert done.returncode == 0, done.stderr

    def job_state(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as key=value pairs (JobState, Restarts, ExitCode, ...)."""
        out = self._run(["scontrol", "-o", "show", "job", job_id]).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def stop(self) -> None:
        # Jobs first (their processes are the test's), then the daemons, slurmd before slurmctld before munged.
        self._run(["scancel", "--full", "--signal=KILL", "--user", str(os.getuid())])
        deadline = time.monotonic() + 30
        while self._run(["squeue", "-h"]).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
