"""The pre-launch sequence shared by every face: hub reachability, the estimate (refusing a run predicted not to
fit), disk room, preflight, the packing check and precision advice."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from runner.errors import PredictedNotToFit, UserError
from runner.spec import RunSpec

if TYPE_CHECKING:
    from rich.console import Console


def preflight_estimate(spec: RunSpec, force: bool, console: Console | None = None, runs_dir: Path | None = None,
                       from_step: int = 0) -> dict[str, Any] | None:
    """Everything checked before a run starts: preflight (data, template, packing, LoRA targets, kernels; raises
    SpecError listing every problem) and the estimate kept in the record, which refuses a run predicted not to
    fit unless forced and warns when it is tight. With runs_dir, a run whose checkpoints and export cannot fit
    in its free space is refused too (after `from_step`, a resume's checkpoint), unless forced."""
    from runner.plan.disk import check_disk

    from runner.plan import estimate
    from runner.errors import SpecError
    from runner.plan.hub import hub_problems
    from runner.plan.preflight import packing_check, precision_advice, preflight

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
                        f"{result.get('gpu_memory_gib')} GiB; {result.get('suggestion') or 'see runner estimate'}")
    if runs_dir is not None:
        check_disk(spec, runs_dir, (result or {}).get("steps"), force, from_step)
    preflight(spec)
    if missed is not None and console is not None:
        console.print(f"[yellow]no estimate: {missed}[/yellow]")
    check = packing_check(spec)
    if check is not None and console is not None:
        console.print(escape(check.describe()), highlight=False)
    advice = precision_advice(spec)
    if advice and console is not None:
        console.print(f"[yellow]note: {advice}[/yellow]")
    if result is None:
        return None
    if check is not None:
        result["packing_check"] = check.to_dict()  # kept in the record with what was predicted
    if console is not None and result.get("verdict") == "tight":
        unit = "GPU" if spec.hardware.device == "cuda" else "rank"
        console.print(f"[yellow]tight: {result.get('per_gpu_gib')} GiB needed per {unit} of "
                      f"{result.get('gpu_memory_gib')} GiB predicted ({result.get('headroom_gib')} GiB headroom)"
                      "[/yellow]")
    return result
