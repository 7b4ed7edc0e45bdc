"""What the runner writes to disk: whole or not at all (atomic writes), and never a secret (redaction)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

# Whole name parts (HF_TOKEN, OPENAI_API_KEY, AUTH) but not TOKENIZERS_PARALLELISM or KEYBOARD.
SECRET_NAME = re.compile(r"(?:^|_)(?:TOKEN|KEY|AUTH|CREDENTIALS?|PAT)(?:$|_)|SECRET|PASSW", re.I)
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@", re.I)
TOKEN_LIKE = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|ghp_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16})\b")
REDACTED = "<redacted>"


def redact_text(text: str) -> str:
    """Remove credentials inside URLs and token-shaped strings."""
    text = URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return TOKEN_LIKE.sub(REDACTED, text)


def redact(value: Any, key: str = "") -> Any:
    """Recursively redact a JSON-like value: secret-named keys lose their value, strings lose embedded secrets."""
    if key and SECRET_NAME.search(key) and value not in (None, "", False):
        return REDACTED
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def current_umask() -> int:
    """The process umask, read without changing it where Linux tells it (/proc), else by setting it back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary dot-file in the same folder, fsync, then rename: readers see the old or the new file,
    and a killed writer leaves at most a hidden `.<name>.*.tmp` that nothing reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600; a record is shared with a team, so it gets what open() would give (the umask's).
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    """`obj` as indented, key-sorted JSON (NaN refused), written atomically."""
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False).encode() + b"\n")
