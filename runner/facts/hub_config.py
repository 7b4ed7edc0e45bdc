"""config.json of a hub model: from the local HF cache, or one direct request to the hub (planning never waits)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

HUB_TIMEOUT_S = 2.0
"""One attempt, no retries: planning must not wait on a network that is not there."""


def config_from_cache(model_id: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(model_id, "config.json", revision=revision)
    except Exception:  # a malformed id or cache layout is simply a miss
        return None
    return Path(hit) if isinstance(hit, str) and Path(hit).is_file() else None


@functools.lru_cache(maxsize=32)
def config_from_hub(model_id: str, revision: str) -> dict[str, Any] | None:
    # A direct request, not hf_hub_download: that one retries for ~20 s when the hub is unreachable.
    import urllib.error
    import urllib.parse
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{model_id}/resolve/{urllib.parse.quote(revision, safe='')}/config.json"
    headers = {"User-Agent": "sft-tui-estimate"}
    try:
        from huggingface_hub import get_token

        token = get_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
    except Exception:
        pass
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=HUB_TIMEOUT_S) as r:
            data = json.loads(r.read().decode())
    except Exception:
        return None
    return data if isinstance(data, dict) else None
