"""Thread-safe access to transformers' lazily imported names.

transformers resolves `from transformers import AutoConfig` through a lazy module; two threads doing that at once
(the wizard's workers: preview, preflight, launch) can see a half-initialised submodule and fail with
"cannot import name 'AutoConfig'". One lock around the lookup makes the first import happen once.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()


def from_transformers(*names: str) -> Any:
    """`from transformers import a, b` under the lock: one object for one name, a tuple for several."""
    with _LOCK:
        import transformers

        found = tuple(getattr(transformers, n) for n in names)
    return found[0] if len(found) == 1 else found
