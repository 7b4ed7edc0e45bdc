"""Process lifetime on Linux: a signal when the parent dies, so no rank or torchrun outlives its launcher."""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1


def signal_on_parent_death(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """prctl(PR_SET_PDEATHSIG): `sig` reaches this process when its parent dies, even by SIGKILL. If the parent
    (`parent`, else whichever it was) is already gone, the signal is sent now. A no-op off Linux."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    libc.prctl(PR_SET_PDEATHSIG, int(sig))
    ppid = os.getppid()
    if ppid == 1 or (parent is not None and ppid != parent):
        os.kill(os.getpid(), sig)
