"""Shared fixtures: temporary runs/records folders and one finished tiny run that several tests read; the guard that
keeps tests not marked `launches` from starting a process."""

from __future__ import annotations

import _posixsubprocess
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.cli.main import main as runner_main

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist (`make test`, `make test-fast`: -n 2) each worker keeps to its share of the cores: torch's
# threads spinning past them slow every worker. Set before anything imports torch.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
# Tests never reach the hub; code that would is tested on local paths.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The packing check's verdicts go to a cache of this test session (subprocesses inherit it), never the user's.
os.environ.setdefault("SFT_TUI_CACHE_DIR", tempfile.mkdtemp(prefix="sft-tui-cache-"))


# -- the fast tier starts no process -----------------------------------------------------------------
# `make test-fast` is `-m "not launches"`: a test not marked `launches` (or `dist`, which implies it) that starts a
# process (a subprocess, torchrun, tmux, a fork) at setup or call fails here, so the fast tier stays free of them.
# Not at teardown: a module's or the session's shared launch (the SLURM cluster) ends in whichever test's teardown
# comes last, launching or not.
_SPAWNERS = [(os, "fork"), (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"),
             (_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec")]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`dist` implies `launches`. Under `--dist loadgroup` the launching tests of one file run in one worker, so a
    module's shared launch runs once; those sharing `tiny_run` (or the SLURM cluster) run in one worker too."""
    for item in items:
        if item.get_closest_marker("dist") and not item.get_closest_marker("launches"):
            item.add_marker(pytest.mark.launches)
        if item.get_closest_marker("launches") and not item.get_closest_marker("xdist_group"):
            shared = {"tiny_run", "slurm"} & set(getattr(item, "fixturenames", ()))
            item.add_marker(pytest.mark.xdist_group("tiny_run" if shared else item.nodeid.split("::")[0]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _no_process(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _no_process(item))


def _no_process(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("launches"):
        return (yield)
    started: list[str] = []
    saved = [(mod, name, getattr(mod, name)) for mod, name in _SPAWNERS if hasattr(mod, name)]

    def refuse(what: str):
        def refused(*args, **kwargs):
            started.append(what)
            raise RuntimeError(f"{item.nodeid} starts a process ({what}): mark it @pytest.mark.launches")
        return refused

    for mod, name, _ in saved:
        setattr(mod, name, refuse(f"{mod.__name__}.{name}"))
    try:
        result = yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
    # A caller that swallows the error (a probe that treats any failure as "absent") still fails the test.
    if started:
        pytest.fail(f"{item.nodeid} starts a process ({', '.join(sorted(set(started)))}): mark it "
                    "@pytest.mark.launches", pytrace=False)
    return result


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str, str]:
    code = runner_main(args)
    if capsys is None:
        return code, "", ""
    out = capsys.readouterr()
    return code, out.out, out.err


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    return {"runs": tmp_path / "runs", "records": tmp_path / "records"}


def dir_args(d: dict[str, Path]) -> list[str]:
    return ["--runs-dir", str(d["runs"]), "--records-dir", str(d["records"])]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A finished 2-rank CPU run of the embedded default (12 steps), shared read-only by the tests."""
    base = tmp_path_factory.mktemp("tiny_run")
    d = {"runs": base / "runs", "records": base / "records"}
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = runner_main(["run", "tiny-cpu", "--set", "train.max_steps=12", "--json", "--plain", *dir_args(d)])
    assert code == 0, buf.getvalue()
    result = last_json(buf.getvalue())
    return {"code": code, "result": result, "record": Path(result["record"]), **d}


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A real SLURM cluster on localhost with two nodes (`slurmd -N`; one-node jobs take one of them): Debian's
    slurm-wlm and munge, installed when missing where that is allowed, else the tests skip and say why."""
    from tests.slurm_cluster import Cluster, install_or_reason

    reason = install_or_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = Cluster(tmp_path_factory.mktemp("slurm"), nodes=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
