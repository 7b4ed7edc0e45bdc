"""User-facing errors: bad input that the CLI reports in a sentence and exit code 2, never a traceback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOT_REPRODUCED, EXIT_NOT_VERIFIED, EXIT_CANCELLED = 0, 1, 2, 3, 4, 130
"""The exit codes of `runner` and `sft-tui --headless` (README: Exit codes); a run's supervisor exits with
EXIT_CANCELLED when the run was cancelled."""
EXIT_DETACHED, EXIT_STOPPED = 129, 143
"""A view that lost its terminal (SIGHUP) detached, the run goes on; a run stopped gracefully with a checkpoint
(SIGTERM, or SIGUSR1 as a preemption): 128 + the signal, as a shell reports a process the signal ended."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: the field it concerns, what is wrong, and how to fix it."""

    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        return f"{text} (fix: {self.fix})" if self.fix else text


class UserError(Exception):
    """Bad input. Exit code 2; the message is shown as is."""

    exit_code = 2

    def __init__(self, message: str, problems: list[Problem] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])

    def __str__(self) -> str:
        head = super().__str__()
        if not self.problems:
            return head
        if len(self.problems) == 1:  # one line: the message, the field, what is wrong and the fix
            return f"{head}: {self.problems[0]}"
        lines = [f"{head} ({len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class SpecError(UserError):
    """The run spec is invalid; lists every problem at once."""


class PredictedNotToFit(UserError):
    """The estimate says the run does not fit (in GPU memory, or its checkpoints and export on disk): the one
    refusal that `--force` (or the wizard's confirmation) overrides. The message ends with the CLI's way to force
    it; `reason` is the estimate's words alone, for a face that asks its own question."""

    def __init__(self, reason: str):
        super().__init__(f"{reason}; pass --force to launch anyway")
        self.reason = reason


_BOUNDS = (("gt", "> {}"), ("ge", ">= {}"), ("lt", "< {}"), ("le", "<= {}"))


def range_text(schema: Any, err: dict[str, Any]) -> str:
    """'in (0, 1)'-style text for the field the error is about: both bounds from its schema when the field is a
    plain one, else the bound the error names ('> 0')."""
    from pydantic import BaseModel

    model: Any = schema
    info = None
    for part in map(str, err["loc"]):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            info = None
            break
        info = model.model_fields[part]
        model = info.annotation
    bounds = {k: getattr(m, k) for m in (info.metadata if info else ()) for k, _ in _BOUNDS if hasattr(m, k)}
    bounds = bounds or {k: v for k, v in (err.get("ctx") or {}).items() if k in dict(_BOUNDS)}
    low = next(((k, bounds[k]) for k in ("gt", "ge") if k in bounds), None)
    high = next(((k, bounds[k]) for k in ("lt", "le") if k in bounds), None)
    if low and high:
        return f"in {'(' if low[0] == 'gt' else '['}{low[1]}, {high[1]}{')' if high[0] == 'lt' else ']'}"
    return " and ".join(dict(_BOUNDS)[b[0]].format(b[1]) for b in (low, high) if b) or "in range"


def shown(x: object) -> str:
    """A value as an error message quotes it: JSON where it has a JSON form."""
    import json

    try:
        return json.dumps(x)
    except TypeError:
        return repr(x)
