"""The supported version range of each library the engines use, and installed versions as the importer sees them
(stdlib only, so GPU scripts can use it without the runner's dependencies)."""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

SUPPORTED: dict[str, tuple[str, str]] = {
    "torch": ("2.11", "3"),
    "transformers": ("5.24", "6"),
    "trl": ("1.16", "2"),
    "peft": ("0.19", "1"),
    "accelerate": ("1.13", "2"),
    "datasets": ("4.7", "6"),
}
"""{distribution: (lowest supported, first unsupported)}: the one table of ranges. pyproject.toml's dependencies
say the same (a test ties them), preflight refuses a version outside (runner.gate.versioncheck), and CI runs the
engine-facing tests at each lower bound (.ci/oldest.txt) and at the newest release. Lower bounds are measured:
trl before 1.15 logs no loss through the TRL engine (1.1 to 1.6 do not start it), and 1.15 packs qwen3_next
inexactly under it and fails LoRA on gpt-oss's experts at step 0 (1.16 passes both, the rest of .ci/oldest.txt the
same); datasets before 4.7 cannot be installed beside
trl 1.16; transformers 5.24 is the lowest tested (5.5 and 5.17 fail the packing check on llama4_text, gemma3 or
qwen3_5)."""

NUMERIC = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "flash-attn", "flash-attn-4",
           "flash-linear-attention", "causal-conv1d", "kernels", "liger-kernel", "triton", "tokenizers", "safetensors")
"""Distributions whose version can change a run's numbers: a replay lists their drift first."""

_MODULES = {"flash-attn": "flash_attn", "flash-attn-4": "flash_attn", "flash-linear-attention": "fla",
            "causal-conv1d": "causal_conv1d", "liger-kernel": "liger_kernel"}


def requirement(name: str) -> str:
    """The pip specifier of `name`'s supported range: "trl>=1.15,<2"."""
    low, high = SUPPORTED[name]
    return f"{name}>={low},<{high}"


def dist_name(name: str) -> str:
    """A distribution's name as pins and the table spell it (PEP 503, lower case, dashes)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def package_versions(names: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """{"python": ..., name: version or None when not installed}, each from the copy an import would load."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        out[name] = imported_version(name)
    return out


def imported_version(name: str) -> str | None:
    """The version of the copy of distribution `name` that `import` loads (or loaded): the distribution installed
    beside the module's file, so a second copy elsewhere on the path is not reported; the first on the path when the
    module cannot be located (a distribution without an importable module of its name)."""
    found = module_distribution(_MODULES.get(name, name.replace("-", "_")), name)
    if found is not None:
        return found.version
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def module_file(module: str) -> Path | None:
    """The file (a package's folder) that module `module` was or would be imported from, without importing it."""
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) if mod is not None else None
    if path is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        path = spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or []), None)
    if not path:
        return None
    p = Path(path)
    return p.parent if p.name == "__init__.py" else p


def module_distribution(module: str, name: str) -> metadata.Distribution | None:
    """Distribution `name` as installed in the folder the file of `module` is imported from; None when that folder
    holds none (a source checkout)."""
    where = module_file(module)
    if where is None:
        return None
    return next(iter(metadata.distributions(name=name, path=[str(where.parent)])), None)
