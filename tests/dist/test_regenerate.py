"""Regenerated layer inputs under FSDP2 through real torchrun (gloo, 2 ranks): the loss and gradients of layers
that keep their inputs, bit for bit (the regeneration asks FSDP2 for the layer's parameters itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dist.test_ulysses import _free_port

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


def test_fsdp2_sharded_layers_regenerate_their_inputs_exactly():
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", str(_free_port()),
                          str(ROOT / "tests" / "dist" / "regenerate_ranks.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=220)
    assert out.returncode == 0 and "regenerate ok ranks=2" in out.stdout, (out.stdout + out.stderr)[-3000:]
