"""Pins: everything about the environment, code, model and data that a run's result depends on."""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from runner.facts.nvml import driver_pins
from runner.spec import RunSpec, model_source, resolve_embedded
from runner.versions import NUMERIC, dist_name, imported_version
from runner.writes import redact, redact_text

# Environment variables that change numerics or communication; their values are recorded (redacted).
ENV_PREFIXES = ("NCCL_", "CUDA_", "PYTORCH_", "TORCH_", "HF_", "CUBLAS_", "OMP_", "MKL_", "TOKENIZERS_")


def relevant_env(env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    return redact({k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)})


def packages() -> dict[str, str]:
    """{distribution: version} of what the run imports: the first copy on the path (the one `import` finds), and for
    a distribution installed twice, or one that changes the numbers, the copy beside the module's file."""
    out: dict[str, str] = {}
    twice: set[str] = set()
    for dist in metadata.distributions():  # in sys.path order
        name = dist.metadata.get("Name")
        if not name:
            continue
        name = dist_name(name)
        if name in out:
            twice.add(name)
        else:
            out[name] = dist.version
    for name in sorted(twice | (set(NUMERIC) & set(out))):
        out[name] = imported_version(name) or out[name]
    return dict(sorted(out.items()))


def interpreter_pins(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The interpreter that runs the ranks and the PYTHONPATH they inherit (which copy of a package loads)."""
    env = dict(os.environ if env is None else env)
    return {"interpreter": sys.executable, "pythonpath": redact_text(env["PYTHONPATH"]) if env.get("PYTHONPATH")
            else None}


def torch_pins() -> dict[str, Any]:
    import torch

    pins: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None, "nccl": None}
    if torch.backends.cudnn.is_available():
        pins["cudnn"] = torch.backends.cudnn.version()
    if torch.cuda.is_available():
        try:
            pins["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - NCCL is optional in some builds
            pass
    return pins


def gpu_pins() -> dict[str, Any]:
    """Driver, names and count through NVML; empty on machines without NVIDIA GPUs."""
    return driver_pins()


def system_pins() -> dict[str, Any]:
    return {
        "os": platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "hostname_hash": hashlib.sha256(platform.node().encode()).hexdigest()[:12],
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def git_pins(repo_dir: Path) -> dict[str, Any]:
    """Commit, branch, dirty flag and the uncommitted diff (with its sha256) of the code that runs."""
    try:
        import git

        repo = git.Repo(repo_dir, search_parent_directories=True)
    except Exception:  # noqa: BLE001 - not a checkout (an installed package), or git missing
        return {"commit": None, "branch": None, "dirty": None, "diff_sha256": None, "diff": ""}
    try:
        commit = repo.head.commit.hexsha
    except ValueError:
        commit = None  # a repository without commits yet
    try:
        branch = repo.active_branch.name
    except (TypeError, ValueError):
        branch = None
    diff = repo.git.diff("HEAD") if commit else ""
    untracked = repo.untracked_files
    dirty = bool(diff) or bool(untracked)
    return {"commit": commit, "branch": branch, "dirty": dirty,
            "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
            "untracked": len(untracked), "diff": redact_text(diff)}


def hash_files(paths: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# Files that define a local model; weights are represented by their index (sharded) or the file itself when small.
_MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "model.safetensors.index.json")
_SMALL_WEIGHTS = 256 * 2**20


def local_model_pins(path: Path) -> dict[str, Any]:
    files = [path / n for n in _MODEL_FILES if (path / n).is_file()]
    weights = [p for p in path.glob("*.safetensors") if p.stat().st_size <= _SMALL_WEIGHTS]
    return {"content_sha256": hash_files(files + weights, path), "files": sorted(p.name for p in files + weights)}


def local_dataset_pins(path: Path) -> dict[str, Any]:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    root = path.parent if path.is_file() else path
    return {"content_sha256": hash_files(files, root), "bytes": sum(p.stat().st_size for p in files)}


def hub_commit(repo_id: str, revision: str | None, repo_type: str) -> str | None:
    """The commit SHA a hub revision resolves to; None offline (the record says so)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    try:
        from huggingface_hub import HfApi

        info = HfApi().repo_info(repo_id, revision=revision, repo_type=repo_type, timeout=10)
        return info.sha
    except Exception:  # noqa: BLE001 - offline, private or gone: recorded as unresolved
        return None


def source_pins(spec: RunSpec) -> dict[str, Any]:
    m, d = spec.model, spec.dataset
    model: dict[str, Any] = {"repo": m.id, "revision": m.revision, "path": m.path, "commit": None}
    if m.path:
        model.update(local_model_pins(resolve_embedded(m.path)))
    else:
        model["commit"] = hub_commit(m.id, m.revision, "model")
    dataset: dict[str, Any] = {"repo": d.id, "revision": d.revision, "path": d.path, "split": d.split, "commit": None}
    if d.path:
        dataset.update(local_dataset_pins(resolve_embedded(d.path)))
        from runner.data.formats import dataset_format

        detected = dataset_format(d)
        dataset["format"] = detected.to_dict() if detected else None
    else:
        dataset["commit"] = hub_commit(d.id, d.revision, "dataset") if d.id else None
    return {"model": model, "dataset": dataset}


def tokenizer_hash(spec: RunSpec) -> str | None:
    src, _ = model_source(spec)
    p = Path(src)
    files = [p / n for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja") if (p / n).is_file()]
    return hash_files(files, p) if files else None


def capture(spec: RunSpec, repo_dir: Path, torch: dict[str, Any] | None = None) -> dict[str, Any]:
    """All pins at launch. The git diff goes beside the record, not inside it (it can be large). `torch`: the
    torch pins taken by the process that asked for the launch (the same interpreter), so that a supervisor need not
    import torch (1.5 s of its start) for four version strings."""
    return {
        "python": sys.version.split()[0],
        **interpreter_pins(),
        "packages": packages(),
        **(torch_pins() if torch is None else torch),
        "gpus": gpu_pins(),
        "system": system_pins(),
        "git": git_pins(repo_dir),
        **source_pins(spec),
        "tokenizer_sha256": tokenizer_hash(spec),
        "seed": spec.train.seed,
    }
