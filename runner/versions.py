"""Installed versions of named packages (stdlib only, so GPU scripts can use it without the runner's dependencies)."""

from __future__ import annotations

import platform
from importlib import metadata


def package_versions(names: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """{"python": ..., name: version or None when not installed}."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
