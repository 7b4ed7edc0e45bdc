"""The TUI tests' fake estimate and sweep keep the shape of the real ones: every field of `runner.plan`'s `Estimate`
with its type, the estimator's names for the memory parts, a sweep row's layout. A field added to or retyped in
the real estimate fails here instead of leaving the wizard's tests on a picture the estimator no longer makes."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest

from runner.plan import estimate, sweep
from runner.plan.result import Estimate
from runner.spec import RunSpec, load_spec, resolve
from tests.tui.conftest import fake_estimate, fake_sweep

FIELD_TYPES = typing.get_type_hints(Estimate)


def conforms(value: Any, annotation: Any) -> bool:
    """Whether `value` is of the declared type: `X | None` either, `dict[...]` a dict, a float a float (an int where
    a float is declared reads the same in JSON but not in an exact check), a bool never an int."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return any(conforms(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if origin is not None:
        return isinstance(value, origin)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def real_and_fake(overrides: list[str], gpus: int) -> tuple[RunSpec, dict[str, Any], dict[str, Any]]:
    spec = resolve(load_spec("tiny-cpu", overrides), cuda_available=gpus > 0, gpu_count=gpus)
    return spec, estimate(spec).to_dict(), fake_estimate(spec)


@pytest.mark.parametrize(("overrides", "gpus"), [
    ([], 0),
    (["hardware.device=cuda", "hardware.gpu=H200", "hardware.nproc_per_node=2"], 2),
], ids=["cpu", "cuda"])
def test_the_fake_estimate_has_the_real_estimates_fields_and_types(overrides: list[str], gpus: int) -> None:
    _, real, fake = real_and_fake(overrides, gpus)
    fields = {f.name for f in dataclasses.fields(Estimate)}
    assert real.keys() == fields  # what the real estimator returns is the dataclass, whole
    assert fake.keys() == fields
    wrong = {k: (type(fake[k]).__name__, FIELD_TYPES[k]) for k in fields if not conforms(fake[k], FIELD_TYPES[k])}
    assert wrong == {}
    assert all(conforms(real[k], FIELD_TYPES[k]) for k in fields)  # the checker holds the real one to the same
    # Same concrete types where both have a value: the wizard formats them the same way.
    assert {k: type(fake[k]) for k in fields if None not in (fake[k], real[k])} == \
        {k: type(real[k]) for k in fields if None not in (fake[k], real[k])}
    # The memory parts the bar's legend names are the estimator's own, for this device.
    assert fake["breakdown"].keys() <= real["breakdown"].keys()
    assert fake["peak_mem_gib"].keys() == real["peak_mem_gib"].keys()
    assert (fake["device"], fake["gpu"], fake["world_size"]) == (real["device"], real["gpu"], real["world_size"])


def test_the_checker_catches_a_drifted_field() -> None:
    """Negative control: a value of another type than the field's is caught."""
    assert not conforms("12", FIELD_TYPES["per_gpu_gib"]) and not conforms(True, FIELD_TYPES["world_size"])
    assert not conforms(3, FIELD_TYPES["step_s"]) and conforms(None, FIELD_TYPES["steps"])
    assert not conforms([], FIELD_TYPES["breakdown"]) and not conforms({}, FIELD_TYPES["suggestion"])


def test_a_fake_sweep_row_is_laid_out_like_a_real_one() -> None:
    spec, _, _ = real_and_fake([], 0)
    axes: list[tuple[str, list[Any]]] = [("train.seq_len", [256])]
    real_row, fake_row = sweep(spec, axes)[0], fake_sweep(spec, axes)[0]
    assert fake_row.keys() == real_row.keys()
    assert fake_row["swept"] == real_row["swept"] == {"train.seq_len": 256} and fake_row["seq_len"] == 256
