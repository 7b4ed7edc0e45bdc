"""Where the runner keeps what it works out once per machine and reuses across launches: the packing check's
verdicts and flash-attn-4's compiled kernels. $SFT_TUI_CACHE_DIR, else sft-tui under $XDG_CACHE_HOME or ~/.cache."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("SFT_TUI_CACHE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sft-tui"
