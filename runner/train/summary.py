"""The end-of-rank summary: what a rank's `end` event says (`EndEvent` of runner.events.lines), built the same way
by both engines so a record reads the same fields whichever trained."""

from __future__ import annotations

from typing import Any

import torch

from runner.train.data import PackStats
from runner.train.runtime import Runtime


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP2 sharded the model: its parameters are DTensors (a native FSDPModule, or accelerate's FSDP2)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def end_summary(rt: Runtime, model: torch.nn.Module, stats: PackStats, *, steps: int, tokens: int, train_s: float,
                final_loss: float | None, cancelled: bool, stopped_early: int | None, params: int, trainable_params: int,
                exported: Any = None) -> dict[str, Any]:
    """The rank's summary for its end event: steps, tokens and seconds of this launch, the last logged loss, peak
    memory, the data statistics, why it ended, the model's size, whether it was sharded, early stopping, the export."""
    out = {"steps": steps, "tokens": tokens, "train_s": round(train_s, 3), "final_loss": final_loss,
           "peak_mem_gib": rt.peak_mem_gib(), "data": stats.to_dict(), "reason": "cancelled" if cancelled else "done",
           "params": params, "trainable_params": trainable_params, "fsdp_sharded": is_sharded(model),
           "stopped_early": stopped_early}
    if exported is not None:
        out["export"] = exported
    return out
