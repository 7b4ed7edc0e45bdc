"""Which rank a failed run blames, from torchrun's report and the ranks' error events (runner.launch.run.diagnose)."""

from __future__ import annotations

from pathlib import Path

from runner.events.lines import EventWriter
from runner.events.failure import classify_exception
from runner.events.paths import RunPaths
from runner.launch.run import diagnose

GLOO_PEER_RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:10130: "
                   "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the "
                   "application.")


def _report(failures: list[tuple[int, int]], root: tuple[int, int]) -> str:
    """torchrun's ChildFailedError text: other failures, then the root cause (first observed)."""
    def entry(rank: int, code: int) -> str:
        return (f"[{rank}]:\n  time      : 2026-12-03_15:10:25\n  host      : localhost\n"
                f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {100 + rank})\n")
    return ("runner.train FAILED\nFailures:\n" + "".join(entry(*f) for f in failures)
            + "Root Cause (first observed failure):\n" + entry(*root))


def _run(tmp_path: Path, report: str, errors: dict[int, BaseException]) -> RunPaths:
    paths = RunPaths(tmp_path)
    paths.logs.mkdir(parents=True)
    paths.launcher_log.write_text(report)
    for rank in (0, 1):
        events = EventWriter(paths.events / f"rank{rank}.jsonl", rank)
        events.write(step=3, loss=1.0)
        if rank in errors:
            cause, message = classify_exception(errors[rank])
            events.write(event="error", step=3, cause=cause, message=message)
        events.close()
    return paths


def test_a_killed_rank_is_blamed_when_its_peer_only_lost_the_connection(tmp_path):
    """The survivor exits fast after its collective fails, so torchrun may observe it first: still the killed rank."""
    paths = _run(tmp_path, _report([(1, -9)], root=(0, 1)), {0: RuntimeError(GLOO_PEER_RESET)})
    failure = diagnose(paths, world_size=2, exit_code=1)
    assert (failure["rank"], failure["cause"]) == (1, "signal") and "SIGKILL" in failure["message"]


def test_a_rank_that_failed_for_its_own_reason_is_blamed_before_a_peer_killed_after_it(tmp_path):
    paths = _run(tmp_path, _report([(1, -6)], root=(0, 1)), {0: TypeError("'NoneType' object is not iterable")})
    failure = diagnose(paths, world_size=2, exit_code=1)
    assert (failure["rank"], failure["cause"]) == (0, "exception") and "TypeError" in failure["message"]


def test_lost_peer_is_its_own_cause():
    assert classify_exception(RuntimeError(GLOO_PEER_RESET))[0] == "peer_lost"


def test_a_cpu_allocation_refused_is_host_memory():
    """A CPU rank past hardware.memory_gib (or the machine's memory) is out of memory, not a crash: `runner bench
    --max-seq-len` reads it as 'does not fit'."""
    from runner.events.failure import classify_text

    text = ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1310720 bytes. Error code 12 (Cannot allocate memory)")
    cause, message = classify_text(text)
    assert cause == "host_oom" and message.startswith("DefaultCPUAllocator: can't allocate memory")


LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
# Real logs of a run whose torchrun was killed by SLURM's USR1: the rank's log as it stood then (the model loaded,
# a progress bar drawn with \r, nothing since) and a torchrun stopped by SIGTERM (its own traceback).
LOADED = (LOGS / "rank0-loaded.log").read_text(encoding="utf-8")
LAUNCHER_SIGTERM = (LOGS / "launcher-sigterm.log").read_text(encoding="utf-8")


def _traceback_after_progress() -> str:
    """A real Python traceback between progress bars, as a rank's log holds it."""
    import traceback

    try:
        {}["labels"]
    except KeyError:
        tb = traceback.format_exc()
    return LOADED + tb + "\rMap: 100%|██████████| 40/40 [00:00<00:00, 812.55 examples/s]\n"


def test_a_progress_bar_is_never_the_error():
    from runner.events.failure import classify_text

    assert "Loading weights: 100%" in LOADED
    assert classify_text(LOADED) == ("unknown", "no exception or known error in the log")


def test_the_exception_is_the_tracebacks_last_line_not_the_log_s():
    from runner.events.failure import classify_text

    assert classify_text(_traceback_after_progress()) == ("exception", "KeyError: 'labels'")
    assert classify_text(LAUNCHER_SIGTERM) == (
        "exception", "torch.distributed.elastic.multiprocessing.api.SignalException: Process 11354 got signal: 15")
    # torchrun's prefix on a rank's lines is not part of the exception.
    prefixed = "".join(f"[rank1]: {ln}\n" for ln in _traceback_after_progress().splitlines())
    assert classify_text(prefixed) == ("exception", "KeyError: 'labels'")


def test_a_killed_launcher_is_named_with_its_signal_not_a_log_line(tmp_path):
    """torchrun killed by SIGUSR1 (exit -10), no report from it, the ranks stopped without an error: the failure is
    the launcher's signal, blamed on no rank, with the furthest step any rank logged and torchrun's log."""
    paths = RunPaths(tmp_path)
    paths.logs.mkdir(parents=True)
    paths.launcher_log.write_text("W1207 04:12:52.113000 Received 10 death signal\n")
    for rank, last in ((0, 5), (1, 6)):
        (paths.logs / f"rank{rank}.log").write_text(LOADED, encoding="utf-8")
        events = EventWriter(paths.events / f"rank{rank}.jsonl", rank)
        for step in range(1, last + 1):
            events.write(step=step, loss=1.0)
        events.close()
    failure = diagnose(paths, world_size=2, exit_code=-10)
    assert failure["rank"] is None and failure["cause"] == "signal" and failure["last_step"] == 6
    assert failure["message"] == "torchrun (the launcher) killed by signal 10 (SIGUSR1); no rank reported an error"
    assert failure["log"] == str(paths.launcher_log)
    # A rank that stopped without an error and a launcher that exited with an error of its own: its traceback.
    paths.launcher_log.write_text(LAUNCHER_SIGTERM, encoding="utf-8")
    failure = diagnose(paths, world_size=2, exit_code=1)
    assert (failure["rank"], failure["cause"]) == (0, "exception") and "SignalException" in failure["message"]


def test_a_rank_that_took_steps_without_a_loss_fails_the_run(tmp_path):
    from runner.events.failure import missing_loss

    def ranks(name: str, lines: dict[int, list[dict]]) -> RunPaths:
        paths = RunPaths(tmp_path / name)
        for rank, rows in lines.items():
            events = EventWriter(paths.events / f"rank{rank}.jsonl", rank)
            for row in rows:
                events.write(**row)
            events.close()
        return paths

    end = {"event": "end", "steps": 4}
    logged = ranks("logged", {0: [{"step": 4, "loss": 2.0}, end], 1: [{"step": 4, "loss": None, "global_loss": 2.0},
                                                                       end]})
    assert missing_loss(logged, 2, 0) is None  # rank 1 had no target of its own: the global loss is its loss
    silent = ranks("silent", {0: [{"step": 4, "loss": 2.0}, end], 1: [end]})
    f = missing_loss(silent, 2, 0)
    assert f is not None and f["rank"] == 1 and f["cause"] == "no_loss"
    assert f["message"].startswith("rank 1 took 4 steps but logged no loss")
    assert missing_loss(ranks("none", {0: [{"event": "end", "steps": 0}]}), 1, 0) is None  # no step, nothing owed
    early = ranks("early", {0: [{**end, "stopped_early": 4}]})
    assert missing_loss(early, 1, 0) is None  # stopped by its eval before a line was due
