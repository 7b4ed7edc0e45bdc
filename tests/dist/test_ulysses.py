"""Ulysses sequence parallelism through real torchrun (gloo): one packed block split over 2 and 4 ranks, documents
crossing the splits, gives the loss and the gradients of the documents run one by one in one process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("ranks", [2, 4])
def test_ulysses_gives_one_rank_s_loss_and_gradients(ranks):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(torchrun), "--nproc_per_node", str(ranks), "--master_port", str(_free_port()),
                          str(ROOT / "tests" / "dist" / "ulysses_ranks.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=220)
    assert out.returncode == 0 and f"ulysses ok ranks={ranks}" in out.stdout, (out.stdout + out.stderr)[-3000:]
