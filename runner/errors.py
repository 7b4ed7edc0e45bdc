"""User-facing errors: bad input that the CLI reports in a sentence and exit code 2, never a traceback."""

from __future__ import annotations

from dataclasses import dataclass


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
    """The estimate says the run does not fit: the one refusal that `--force` (or the wizard's confirmation)
    overrides."""


class RunFailed(Exception):
    """A run ended with a failed rank (exit code 1)."""

    exit_code = 1
