"""The launch gate's one entry point: `check(spec, force)` runs every pre-launch check in order and returns a `Gate`
(what the run keeps and what the faces show), or raises what refuses the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.errors import PredictedNotToFit, SpecError, UserError
from runner.spec import RunSpec

if TYPE_CHECKING:
    from runner.gate.packcheck import Verdict


@dataclass(frozen=True)
class Note:
    """One line the gate has to say about a run it lets through."""

    text: str
    warning: bool = False
    """True: a caution (no estimate, precision advice, tight memory) the faces set apart; False: information."""


@dataclass(frozen=True)
class Gate:
    """A run the gate let through: what it predicted and proved, and what to tell the user. Printing is the faces'."""

    estimate: dict[str, Any] | None
    """The estimate kept in the run's record (the packing check's verdict included); None when none could be made."""
    packing: Verdict | None
    """The packing check's verdict (runner.gate.packcheck), None when the run does not pack or has none."""
    notes: tuple[Note, ...] = ()
    """What to show before the run starts, in order."""


def check(spec: RunSpec, force: bool, runs_dir: Path | None = None, from_step: int = 0) -> Gate:
    """Every check made before a run starts, in order: the hub (model and dataset reachable), the estimate (a plan
    predicted not to fit raises PredictedNotToFit unless forced), the disk (with runs_dir: checkpoints and export
    must fit its free space after `from_step`, a resume's checkpoint, unless forced), preflight (data, template,
    packing, LoRA targets, kernels: raises SpecError listing every problem), then the packing check, precision
    advice and a tight-memory warning as notes."""
    from runner.gate.disk import check_disk
    from runner.gate.hub import hub_problems
    from runner.gate.preflight import packing_check, precision_advice, preflight
    from runner.plan import estimate

    unreachable = hub_problems(spec)
    if unreachable:
        raise SpecError("preflight found problems", unreachable)
    # The estimate first: it takes a second, and a plan that does not fit is refused before preflight's slower
    # checks (the rank's own packer and model) are paid for.
    missed: UserError | None = None
    try:
        result: dict[str, Any] | None = estimate(spec).to_dict()
    except UserError as e:
        # No estimate (e.g. a GPU NVML cannot name) must not stop a run: it only loses the prediction. Said once
        # preflight has passed: what stops the estimate (no config.json) often stops preflight too, in one line.
        missed, result = e, None
    if result is not None and result.get("fits") is False and not force:
        unit = "GPU" if spec.hardware.device == "cuda" else "rank (CPU memory)"
        raise PredictedNotToFit(f"predicted not to fit: {result.get('per_gpu_gib')} GiB per {unit} of "
                                f"{result.get('gpu_memory_gib')} GiB; "
                                f"{result.get('suggestion') or 'see runner estimate'}")
    if runs_dir is not None:
        check_disk(spec, runs_dir, (result or {}).get("steps"), force, from_step)
    preflight(spec)
    notes: list[Note] = []
    if missed is not None:
        notes.append(Note(f"no estimate: {missed}", warning=True))
    verdict = packing_check(spec)
    if verdict is not None:
        notes.append(Note(verdict.describe()))
    advice = precision_advice(spec)
    if advice:
        notes.append(Note(f"note: {advice}", warning=True))
    if result is not None and verdict is not None:
        result["packing_check"] = verdict.to_dict()  # kept in the record with what was predicted
    if result is not None and result.get("verdict") == "tight":
        unit = "GPU" if spec.hardware.device == "cuda" else "rank"
        notes.append(Note(f"tight: {result.get('per_gpu_gib')} GiB needed per {unit} of {result.get('gpu_memory_gib')} "
                          f"GiB predicted ({result.get('headroom_gib')} GiB headroom)", warning=True))
    return Gate(result, verdict, tuple(notes))
