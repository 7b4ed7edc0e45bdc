"""Autotune: the speed levers left `auto` (runner.engines) set to the fastest candidate predicted to fit.

The candidates are what the engine can run on this model, device and world size: each lever's values come from its
row in runner.engines.CHOICES (`lever_space`; this module names no lever but the batch split and the loss). Each is
priced by the estimator (memory and step time, `Pricer`), and the fastest that leaves the headroom free wins
(hardware.headroom_gib, else 5% of the device's memory). The search (`choose`) walks each group of candidates that
differ only in how many layers recompute: step time grows with every recomputed layer, so the first count that fits
is that group's best. tests/unit/test_autotune.py checks it against pricing every candidate.

`resolve_levers(spec)` is the one call that fills a spec: the estimate makes it (runner.plan.core.predict) and so
does the launcher before it writes the spec the ranks run (runner.launch.run.start), so what is planned is what runs;
each rank reports its levers by runner.engines.levers_of, as the estimate does. A spec without `auto` levers (a
recorded run, replayed) comes back as it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from runner.errors import Problem, UserError
from runner.decide.rules import chunked_supported
from runner.engines import (
    CHOICES,
    PLAIN,
    SPEED_LEVERS,
    Levers,
    Where,
    engine_for,
    is_auto,
    lever_values,
    unresolved,
)
from runner.plan.choices import Plan, make_plan
from runner.plan.constants import GIB
from runner.plan.memory import device_memory, memory_model
from runner.plan.timing import flops_per_step, step_time, tokens_per_step
from runner.spec import RunSpec

HEADROOM_FRACTION = 0.05
"""Device memory the planner leaves free by default: the estimator is within about 10% on memory, and most of its
misses are on the side of more (benchmarks/memory-calibration-h200.md)."""

RUNNERS_UP = 4
BISECTED = CHOICES[-1].fields[0]
"""The lever `choose` bisects over, the last of runner.engines.CHOICES (the recompute count)."""


@dataclass(frozen=True)
class Priced:
    levers: Levers
    per_gpu: float
    """Bytes per GPU (or CPU rank) the estimator predicts: allocated peak + fragmentation + context."""
    step_s: float
    fits: bool
    order: int
    """Position in the enumeration: the last tie-break, so that equal candidates resolve the same way every time."""

    @property
    def key(self) -> tuple[float, float, int]:
        return (self.step_s, self.per_gpu, self.order)

    def row(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.levers), "step_s": round(self.step_s, 3),
                "per_gpu_gib": round(self.per_gpu / GIB, 2), "fits": self.fits}


@dataclass(frozen=True)
class Space:
    """The candidates for a spec: each lever's values from its `CHOICES` row (one value for a lever that is set or
    means nothing on this run), enumerated in the rows' order."""

    train: Any
    where: Where

    def groups(self) -> list[tuple[Levers, tuple[int, ...]]]:
        """(a template, the values of the last row to try with it: the recompute counts): candidates that differ
        only in that value, in the enumeration order."""
        out: list[tuple[Levers, tuple[int, ...]]] = []
        *outer, last = CHOICES

        def walk(i: int, chosen: dict[str, Any]) -> None:
            if i == len(outer):
                counts = last.tries(self.train, self.where, chosen)
                out.append((Levers(**chosen, **{last.fields[0]: counts[0]}), counts))
                return
            for value in outer[i].tries(self.train, self.where, chosen):
                values = value if len(outer[i].fields) > 1 else (value,)
                walk(i + 1, {**chosen, **dict(zip(outer[i].fields, values))})

        walk(0, {})
        return out

    def candidates(self) -> list[Levers]:
        return [dataclasses.replace(t, **{BISECTED: k}) for t, counts in self.groups() for k in counts]


def batch_splits(spec: RunSpec, world: int) -> tuple[tuple[int, int], ...]:
    """(micro_batch, grad_accum) pairs: as set, 1 for auto, or every split of train.global_batch_tokens."""
    t = spec.train
    g = t.global_batch_tokens
    if g is None:
        return ((1 if is_auto(t.micro_batch) else t.micro_batch, 1 if is_auto(t.grad_accum) else t.grad_accum),)
    blocks, rest = divmod(g, t.seq_len * world)
    if rest or not blocks:
        raise UserError("invalid spec", [Problem(
            "train.global_batch_tokens", f"{g} tokens is not a whole number of blocks of {t.seq_len} tokens on each of "
            f"{world} ranks", f"use a multiple of {t.seq_len * world}, e.g. {max(1, blocks) * t.seq_len * world}")])
    pairs = [(m, blocks // m) for m in range(1, blocks + 1) if blocks % m == 0]
    if not is_auto(t.micro_batch):
        pairs = [p for p in pairs if p[0] == t.micro_batch]
    if not is_auto(t.grad_accum):
        pairs = [p for p in pairs if p[1] == t.grad_accum]
    if not pairs:
        raise UserError("invalid spec", [Problem(
            "train.global_batch_tokens", f"{g} tokens cannot be split with micro_batch={t.micro_batch}, "
            f"grad_accum={t.grad_accum} on {world} ranks of {t.seq_len} tokens", "set the other one to auto")])
    return tuple(pairs)


def lever_space(spec: RunSpec, plan: Plan, splits: tuple[tuple[int, int], ...]) -> Space:
    """The candidates the engine can run for this spec on the planned run (a lever the user set keeps its value)."""
    where = Where(engine_for(spec.engine), plan.device, plan.world, plan.arch.layers, plan.attn, plan.loss_impl,
                  chunked_supported(plan.loaded.config or {}) is not None, splits)
    return Space(spec.train, where)


class Pricer:
    """Memory and step time of a candidate by the estimator, for one spec (its data read once)."""

    def __init__(self, spec: RunSpec, plans: dict[int, Plan], doc_len: int, attn_len: int, limit: float):
        self.spec, self.plans, self.doc_len, self.attn_len, self.limit = spec, plans, doc_len, attn_len, limit
        self.priced = 0
        self.capacity = 0.0

    def price(self, levers: Levers, order: int) -> Priced:
        base = self.plans[levers.micro_batch]
        fields = levers.train_fields(self.spec.engine, base.arch.layers)
        spec = self.spec.model_copy(update={"train": self.spec.train.model_copy(update=fields)})
        plan = base.priced_with(spec)
        mem = memory_model(plan)
        dev = device_memory(plan, mem)
        per_gpu = mem.allocated + dev.fragmentation + dev.context
        flops, attn_flops = flops_per_step(plan, self.attn_len, tokens_per_step(spec, plan.data_ranks, self.doc_len))
        step_s, _, _ = step_time(plan, mem, flops, attn_flops)
        self.priced += 1
        # Offloaded layer inputs fit the node's host by construction: those it cannot hold stay on the GPU and are
        # counted in per_gpu (runner.facts.gpus.offloaded_layers).
        return Priced(levers, per_gpu, step_s, per_gpu <= self.limit, order)


@dataclass
class Tuned:
    """The planner's choice, the candidates behind it, and the spec with its levers filled."""

    spec: RunSpec
    levers: Levers
    chosen: Priced
    runners_up: list[Priced]
    capacity: float
    limit: float
    tuned: tuple[str, ...]
    """The levers the planner chose (they were auto)."""
    priced: int
    layers: int

    @property
    def reason(self) -> str:
        what = self.levers.describe(self.layers)
        left = (self.capacity - self.chosen.per_gpu) / GIB
        if not self.tuned:
            return f"{what}: as set"
        if not self.chosen.fits:
            return (f"{what}: nothing fits within the planner's margin ({self.limit / GIB:.1f} of "
                    f"{self.capacity / GIB:.1f} GiB, hardware.headroom_gib); this needs the least memory")
        return f"{what}: the fastest that leaves {left:.1f} GiB free"

    def to_dict(self) -> dict[str, Any]:
        # What the filled spec's ranks will report in train_begin, by the function they report it with.
        levers = lever_values(self.spec, self.layers, self.levers.loss_impl)
        return {"levers": levers, "levers_tuned": list(self.tuned), "levers_reason": self.reason,
                "runners_up": [p.row() for p in self.runners_up],
                "planner_headroom_gib": round((self.capacity - self.limit) / GIB, 2)}


def choose(space: Space, pricer: Pricer) -> tuple[Priced, list[Priced]]:
    """The fastest candidate that fits (the one needing least memory when none does), and the best of the other
    groups. In a group step time grows with each recomputed layer, so its first count that fits is its best; it is
    found by bisection, which assumes memory shrinks as more layers recompute (but for the last one; the
    brute-force test checks the choice on the catalog's architectures)."""
    best: list[Priced] = []
    order = 0
    for template, counts in space.groups():
        priced: dict[int, Priced] = {}

        def at(i: int) -> Priced:
            if i not in priced:
                priced[i] = pricer.price(dataclasses.replace(template, **{BISECTED: counts[i]}), order + i)
            return priced[i]

        def first(ok: Any) -> Priced | None:
            """The first count that passes `ok`. Recomputing the last layer too saves nothing (its recompute
            comes first in backward, while every other layer still holds what it kept) and costs its input
            again: bisect over the others, then try it alone."""
            lo, hi = 0, max(0, len(counts) - 2)
            if ok(at(hi)):
                while lo < hi:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if ok(at(mid)) else (mid + 1, hi)
                return at(lo)
            return at(len(counts) - 1) if ok(at(len(counts) - 1)) else None

        found = first(lambda p: p.fits)
        if found is None:  # the fastest of those that need the least memory
            least = min(at(max(0, len(counts) - 2)).per_gpu, at(len(counts) - 1).per_gpu)
            found = first(lambda p: p.per_gpu <= least)
        assert found is not None
        best.append(found)
        order += len(counts)
    fitting = sorted((p for p in best if p.fits), key=lambda p: p.key)
    if fitting:
        return fitting[0], fitting[1:1 + RUNNERS_UP]
    ranked = sorted(best, key=_least_memory)
    return ranked[0], ranked[1:1 + RUNNERS_UP]


def _least_memory(p: Priced) -> tuple[float, float, int]:
    return (p.per_gpu, p.step_s, p.order)


def brute_force(space: Space, pricer: Pricer) -> Priced:
    """Every candidate priced: the reference `choose` must equal (tests)."""
    priced = [pricer.price(c, i) for i, c in enumerate(space.candidates())]
    fitting = [p for p in priced if p.fits]
    if fitting:
        return min(fitting, key=lambda p: p.key)
    return min(priced, key=_least_memory)


def memory_limit(spec: RunSpec, capacity: float) -> float:
    h = spec.hardware.headroom_gib
    return capacity - (h * GIB if h is not None else HEADROOM_FRACTION * capacity)


def setup(spec: RunSpec, doc_len: int, attn_len: int) -> tuple[Space, Pricer, Plan]:
    """The lever space and the pricer of a spec, for a document length (and the length weighing attention)."""
    probe = make_plan(_with_split(spec, 1, 1))
    splits = batch_splits(spec, probe.data_ranks)
    plans = {m: make_plan(_with_split(spec, m, g)) for m, g in splits}
    plan = plans[splits[0][0]]
    capacity = device_memory(plan, memory_model(plan)).capacity
    pricer = Pricer(spec, plans, doc_len, attn_len, memory_limit(spec, capacity))
    pricer.capacity = capacity
    return lever_space(spec, plan, splits), pricer, plan


def _with_split(spec: RunSpec, micro_batch: int, grad_accum: int) -> RunSpec:
    """The spec with a batch split and every other lever at a value that plans (make_plan reads none of them but
    the split and the loss)."""
    t = spec.train
    update: dict[str, Any] = {"micro_batch": t.micro_batch if not is_auto(t.micro_batch) else micro_batch,
                              "grad_accum": t.grad_accum if not is_auto(t.grad_accum) else grad_accum}
    for f in SPEED_LEVERS:
        if is_auto(getattr(t, f)) and f not in update and f != "loss_impl":  # the plan resolves the loss
            update[f] = PLAIN[f]
    return spec.model_copy(update={"train": t.model_copy(update=update)})


def tune(spec: RunSpec, doc_len: int, attn_len: int) -> Tuned:
    space, pricer, plan = setup(spec, doc_len, attn_len)
    chosen, runners_up = choose(space, pricer)
    layers = plan.arch.layers
    fields = chosen.levers.train_fields(spec.engine, layers)
    tuned = tuple(f for f in unresolved(spec.train) if f in fields)
    if engine_for(spec.engine).fixed_loss and is_auto(spec.train.loss_impl):
        tuned += ("loss_impl",)
    filled = RunSpec.model_validate(_filled(spec, fields))
    return Tuned(filled, chosen.levers, chosen, runners_up, pricer.capacity, pricer.limit, tuned, pricer.priced,
                 layers)


def _filled(spec: RunSpec, fields: dict[str, Any]) -> dict[str, Any]:
    data = spec.to_dict()
    data["train"].update(fields)
    return data


def needs_tuning(spec: RunSpec) -> bool:
    """Whether any lever is still auto (the TRL engine ignores train.loss_impl)."""
    left = unresolved(spec.train)
    return bool([f for f in left if not (f == "loss_impl" and engine_for(spec.engine).fixed_loss)])


def document_lengths(spec: RunSpec) -> tuple[int, int]:
    """(mean document length, the length that weighs the attention work) of the spec's data, as the estimate
    reads them (runner.plan.data_size)."""
    from runner.plan.choices import _load_arch_cached
    from runner.plan.constants import DEFAULT_DOC_LEN
    from runner.plan.data_size import dataset_size

    loaded = _load_arch_cached(spec.model.id, spec.model.revision, spec.model.path)
    data = dataset_size(spec, loaded)
    doc_len = int(round(data.avg_tokens)) if data.avg_tokens else DEFAULT_DOC_LEN
    t = spec.train
    attn_len = (data.attention_len(t.seq_len) if t.packing and data.lengths else None) or doc_len
    return doc_len, attn_len


def resolve_levers(spec: RunSpec, doc_len: int | None = None, attn_len: int | None = None) -> RunSpec:
    """The spec with every `auto` lever set to the planner's choice; a spec without any comes back unchanged."""
    if not needs_tuning(spec):
        return spec
    if doc_len is None:
        doc_len, attn_len = document_lengths(spec)
    return tune(spec, doc_len, attn_len or doc_len).spec
