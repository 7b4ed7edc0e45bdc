"""The installed versions of the libraries the engines use, checked against the supported ranges before a launch."""

from __future__ import annotations

from runner.errors import Problem
from runner.versions import SUPPORTED, imported_version, requirement


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string ("2.13.0+cpu" -> (2, 13, 0)); pre- and dev-releases count as their
    release, so a nightly of a supported version is not refused."""
    from packaging.version import Version

    return Version(version).release


def version_problems() -> list[Problem]:
    """One problem per library whose imported copy is missing or outside `runner.versions.SUPPORTED`: the version
    found, the range, and the pip command that installs a supported one."""
    out: list[Problem] = []
    for name, (low, high) in SUPPORTED.items():
        found = imported_version(name)
        fix = f"pip install '{requirement(name)}'"
        if found is None:
            out.append(Problem(name, f"not installed; supported: >={low},<{high}", fix))
            continue
        try:
            release = _release(found)
        except ValueError:
            continue  # a version string packaging cannot read (a local build): nothing to compare
        if not _release(low) <= release < _release(high):
            out.append(Problem(name, f"{found} is installed; supported: >={low},<{high}", fix))
    return out
