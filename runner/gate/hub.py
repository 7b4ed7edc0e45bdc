"""Can the hub be reached, and is a hub model or dataset in the local cache? A fast answer before anything waits
on the hub client's retries (about 50 s per file when the network is down)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

from runner.errors import Problem
from runner.spec import RunSpec

PROBE_TIMEOUT_S = 3.0
PROBE_CACHE_S = 30.0
_probe: tuple[float, bool] | None = None  # (when, reachable): one probe serves the wizard's several checks


def hub_reachable() -> bool:
    """A TCP connection to the hub's endpoint within PROBE_TIMEOUT_S (HF_HUB_OFFLINE=1 means no)."""
    global _probe
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    now = time.monotonic()
    if _probe is not None and now - _probe[0] < PROBE_CACHE_S:
        return _probe[1]
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), PROBE_TIMEOUT_S):
            ok = True
    except OSError:
        ok = False
    _probe = (now, ok)
    return ok


def _cache_dir() -> Path:
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except Exception:  # noqa: BLE001 - the default location
        return Path.home() / ".cache" / "huggingface" / "hub"


def cached(repo_id: str, repo_type: str) -> bool:
    folder = _cache_dir() / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots"
    return folder.is_dir() and any(folder.iterdir())


def hub_problems(spec: RunSpec) -> list[Problem]:
    """The hub model and dataset a run would download, when the hub cannot be reached and they are not cached."""
    wanted = []
    if not spec.model.path and spec.model.id:
        wanted.append(("model.id", spec.model.id, "model", "set model.path to a local copy of the model"))
    if not spec.dataset.path and spec.dataset.id:
        wanted.append(("dataset.id", spec.dataset.id, "dataset", "set dataset.path to a local file or folder"))
    missing = [w for w in wanted if not cached(w[1], w[2])]
    if not missing or hub_reachable():
        return []
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    return [Problem(field, f"{repo_id} is not in the local cache and the hub ({host}) cannot be reached",
                    f"{fix}, or connect to the network") for field, repo_id, _, fix in missing]
