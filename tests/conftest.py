"""Shared fixtures: temporary runs/records folders and one finished tiny run that several tests read."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from runner.cli.main import main as runner_main

REPO = Path(__file__).resolve().parents[1]

# Tests never reach the hub; code that would is tested on local paths.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The packing check's verdicts go to a cache of this test session (subprocesses inherit it), never the user's.
os.environ.setdefault("SFT_TUI_CACHE_DIR", tempfile.mkdtemp(prefix="sft-tui-cache-"))


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
