"""The learning-rate schedule both engines follow: one rule, so the same spec trains at the same lr at every step."""

from __future__ import annotations

import math

from runner.spec import RunSpec


def warmup_steps(spec: RunSpec, total_steps: int | None) -> int:
    """train.warmup_steps, or train.warmup_ratio of the run when the step count is known (rounded up)."""
    t = spec.train
    if t.warmup_steps or not t.warmup_ratio or not total_steps:
        return t.warmup_steps
    return math.ceil(t.warmup_ratio * total_steps)


def lr_at(spec: RunSpec, step: int, total_steps: int | None) -> float:
    """Learning rate for optimizer step `step` (1-based): linear warmup to the peak, then the schedule.

    Warmup counts from step 1 (its first step already learns: transformers' own schedulers start at 0), the
    warmup's last step reaches the peak, the first step after it runs at the peak too, and the decay reaches 0 one
    step after the last, so no step is spent at a zero learning rate. `total_steps` is train.max_steps on both
    engines (None: constant after warmup), not a count the trainer derives from the data.
    """
    t = spec.train
    warmup = warmup_steps(spec, total_steps)
    if warmup and step <= warmup:
        return t.lr * step / warmup
    if t.schedule == "constant" or not total_steps:
        return t.lr
    progress = min(1.0, (step - 1 - warmup) / max(1, total_steps - warmup))
    if t.schedule == "cosine":
        return t.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return t.lr * (1.0 - progress)
