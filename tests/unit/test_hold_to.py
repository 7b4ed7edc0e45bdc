"""A CPU rank held to hardware.memory_gib (runner.train.runtime.hold_to): the data limit it sets is not spent on
memory nobody uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

HELD = """
import pyarrow
from runner.train.runtime import hold_to
hold_to(2.0, "cpu", 0)
print(pyarrow.default_memory_pool().backend_name)
"""


@pytest.mark.launches
def test_a_held_cpu_rank_gives_pyarrow_the_system_allocator():
    """pyarrow's default pool (mimalloc) reserves its first arena as 1 GiB of untouched writable memory, which the
    data limit counts whole: half of a 2 GiB cap went to it before the first step."""
    out = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "system", (out.stdout, out.stderr[-2000:])
