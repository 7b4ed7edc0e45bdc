"""The launch gate: everything checked before a run starts (hub, estimate, disk, preflight, the packing check, library
versions), as one `check(spec, force) -> Gate` that both faces call."""

from runner.gate.prelaunch import Gate, Note, check

__all__ = ["Gate", "Note", "check"]
