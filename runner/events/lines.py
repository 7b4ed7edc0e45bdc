"""Per-rank event lines: one JSON object per line in runs/<id>/events/rank<r>.jsonl (docs/runs-and-faults.md).

Two shapes: a step line (`StepEvent`: no "event" key, a "step"), and a lifecycle line with `"event": <kind>` (one of
EVENT_KINDS, each with its own type below and its own writer method). `parse_event` is the one reader: every consumer
(record, live view, trackers, bench, failure forensics, the engines' resume) turns a line into its typed event with
it. The JSON on disk is the contract and does not change; keys may be added.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

START, TRAIN_BEGIN, RESUME, CHECKPOINT, EVAL, SAMPLE, END, ERROR = \
    "start", "train_begin", "resume", "checkpoint", "eval", "sample", "end", "error"
EVENT_KINDS = (START, TRAIN_BEGIN, RESUME, CHECKPOINT, EVAL, SAMPLE, END, ERROR)
"""start: the rank is up (local_rank, node_rank, pid); train_begin: the engine's choices; resume: restarted from a
checkpoint; checkpoint: one saved; eval: one evaluation (global loss, token accuracy); sample: the model's greedy
answer to one of train.eval_prompts (rank 0); end: the rank finished (tokens, train_s, peak_mem_gib, data, ...);
error: it failed (cause, message)."""


# ---------------------------------------------------------------------------------------------
# Types: one per kind. Each names the keys its kind carries; a value of the wrong type reads as None (keys are
# written by other code, maybe another version), and the keys a type does not name stay in `extra`.


@dataclass(frozen=True)
class Event:
    """One line of a rank's events file. Also a read-only mapping of the line as written (`e["step"]`, `"event" in
    e`, `e.get(...)`), for the keys no type names."""

    t: float | None = None
    rank: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    line: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    KIND: ClassVar[str | None] = None

    @property
    def kind(self) -> str | None:
        """The lifecycle kind ("end", ...); None for a step line."""
        return self.KIND

    def number(self, key: str) -> float | None:
        """The number at `key`, with NaN or infinity restored from the `nonfinite` names of a strict line
        (`strict_line`); None when absent or not a number."""
        value = self.line.get(key)
        nonfinite = self.line.get("nonfinite")
        if value is None and isinstance(nonfinite, dict) and key in nonfinite:
            try:
                return float(nonfinite[key])
            except (TypeError, ValueError):
                return None
        return _float(value)

    def get(self, key: str, default: Any = None) -> Any:
        return self.line.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.line[key]

    def __contains__(self, key: object) -> bool:
        return key in self.line

    def __iter__(self) -> Iterator[str]:
        return iter(self.line)


@dataclass(frozen=True)
class StepEvent(Event):
    """One logged optimizer step of one rank. `loss` is None when the block has no target token (a NaN is None too,
    named in `nonfinite`: `number("loss")` gives it back); `extra` holds the keys engines add (data_s, doc_len_sq,
    global_loss, target_tokens, ...)."""

    step: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None
    step_s: float | None = None
    mem_gib: float | None = None

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> StepEvent:
        return _build(cls, line)


@dataclass(frozen=True)
class StartEvent(Event):
    """The rank is up."""

    KIND = START
    local_rank: int | None = None
    node_rank: int | None = None
    world_size: int | None = None
    pid: int | None = None
    host: str | None = None
    max_steps: int | None = None


@dataclass(frozen=True)
class TrainBeginEvent(Event):
    """The engine built its model and is about to train: what it was decided to run (attention path, loss, FSDP,
    precision, ..., and `decisions` whole) and what it counted."""

    KIND = TRAIN_BEGIN
    max_steps: int | None = None
    step: int | None = None
    engine: str | None = None
    attn: str | None = None
    attn_kernel: str | None = None
    loss_impl: str | None = None
    fsdp: str | None = None
    fsdp_sharded: bool | None = None
    optimizer_precision: str | None = None
    params: int | None = None
    trainable_params: int | None = None
    resumed_from: str | None = None
    sequence_parallel: int | None = None
    """Ranks that shared each block (hardware.sequence_parallel; 1 = none); absent from engines that never split."""
    offloaded_layers: int | None = None
    """Recomputed layers whose input waited in host memory (train.offload_activations: as many as the node's host
    holds, runner.facts.gpus.offloaded_layers); absent where nothing offloads. Where, not what: replay does not pin it."""
    regenerated_layers: int | None = None
    """Recomputed layers whose input, beyond what the host held, was regenerated in backward from the layer before's
    (runner.facts.gpus.regenerated_layers); absent where nothing offloads. Not pinned, as offloaded_layers."""
    attention_head_groups: int | None = None
    """KV-head groups a tiled layer's attention ran its backward in (runner.facts.tiling.attention_head_groups; 1 =
    the kernel's own backward); absent from engines that never group. Follows the block length and the GPU, not pinned."""

    quantization: dict[str, Any] | None = None
    """method.kind=qlora: how the frozen base was stored (type, block sizes, library and version, what stayed in its
    own dtype); absent otherwise."""

    decisions: dict[str, Any] | None = None
    """The run's decisions file, whole (runner.decide: made before launch, obeyed by every rank); absent from runs
    before it."""


@dataclass(frozen=True)
class ResumeEvent(Event):
    KIND = RESUME
    step: int | None = None
    checkpoint: str | None = None
    blocks_consumed: int | None = None


@dataclass(frozen=True)
class CheckpointEvent(Event):
    KIND = CHECKPOINT
    step: int | None = None
    path: str | None = None


@dataclass(frozen=True)
class EvalEvent(Event):
    """One evaluation: the loss and token accuracy over every rank's eval blocks (the same on every rank)."""

    KIND = EVAL
    step: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    target_tokens: int | None = None
    stop: bool | None = None


@dataclass(frozen=True)
class SampleEvent(Event):
    """The model's greedy answer at `step` to the prompt at `index` of train.eval_prompts (written by rank 0)."""

    KIND = SAMPLE
    step: int | None = None
    index: int | None = None
    prompt: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class EndEvent(Event):
    """The rank finished: its summary (`end_summary` of runner.train.summary, the same for both engines)."""

    KIND = END
    step: int | None = None
    steps: int | None = None
    tokens: int | None = None
    train_s: float | None = None
    final_loss: float | None = None
    peak_mem_gib: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    reason: str | None = None
    params: int | None = None
    trainable_params: int | None = None
    fsdp_sharded: bool | None = None
    stopped_early: int | None = None
    export: Any = None


@dataclass(frozen=True)
class ErrorEvent(Event):
    KIND = ERROR
    step: int | None = None
    cause: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class OtherEvent(Event):
    """A line of a kind this version does not know (a newer writer's): kept, so it still counts as a heartbeat."""

    name: str | None = None

    @property
    def kind(self) -> str | None:
        return self.name


TYPES: dict[str, type[Event]] = {c.KIND: c for c in (StartEvent, TrainBeginEvent, ResumeEvent, CheckpointEvent,
                                                      EvalEvent, SampleEvent, EndEvent, ErrorEvent)}
assert set(TYPES) == set(EVENT_KINDS)

E = TypeVar("E", bound=Event)


# Exact type checks (a bool is not a number here), fast: every line of a long run goes through them.
def _int(v: Any) -> int | None:
    kind = type(v)
    if kind is int:
        return v
    return int(v) if kind is float and math.isfinite(v) else None


def _float(v: Any) -> float | None:
    kind = type(v)
    if kind is float:
        return v
    return float(v) if kind is int else None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _dict(v: Any) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None


_COERCE = {"int | None": _int, "float | None": _float, "str | None": _str, "bool | None": _bool,
           "dict[str, Any] | None": _dict}


def _as_is(v: Any) -> Any:
    return v


@functools.cache
def _readers(cls: type[Event]) -> dict[str, Callable[[Any], Any]]:
    """The keys a type names, each with the function that reads its value (by the field's annotation)."""
    return {f.name: _COERCE.get(str(f.type), _as_is) for f in dataclasses.fields(cls)
            if f.name not in ("extra", "line", "name")}


def _build(cls: type[E], line: dict[str, Any]) -> E:
    named = _readers(cls)
    values = {k: read(line.get(k)) for k, read in named.items()}
    extra = {k: v for k, v in line.items() if k not in named and k != "event"}
    if cls is OtherEvent:
        values["name"] = _str(line.get("event"))
    return cls(**values, extra=extra, line=line)


def parse_event(obj: Any) -> Event | None:
    """The typed event of one decoded line: a step, a lifecycle event of its kind, or an `OtherEvent` (a kind this
    version does not know, or neither shape); None for what is not a JSON object."""
    if not isinstance(obj, dict):
        return None
    if "event" in obj:
        kind = obj["event"]
        return _build(TYPES.get(kind, OtherEvent) if isinstance(kind, str) else OtherEvent, obj)  # type: ignore[arg-type]
    if "step" in obj:
        return _build(StepEvent, obj)
    return _build(OtherEvent, obj)


def parse_line(text: str | bytes) -> Event | None:
    """The typed event of one line of text; None for a line that is not a JSON object (a torn or corrupted one).
    NaN and infinity literals are accepted: an older writer logged a diverged loss as NaN."""
    try:
        return parse_event(json.loads(text))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both
        return None


def read_events(path: Path) -> list[Event]:
    """Every complete line of one events file, typed (a partial last line, being written or torn, is ignored)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # what follows the last newline is not a complete line yet
    return [e for e in map(parse_line, lines) if e is not None]


# ---------------------------------------------------------------------------------------------
# Writing


class EventWriter:
    """Appends events for one rank; each line is flushed so tailers see it at once."""

    def __init__(self, path: Path, rank: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._f = open(path, "a", buffering=1, encoding="utf-8")

    def write(self, **fields: Any) -> None:
        line = strict_line({"t": round(time.time(), 3), "rank": self.rank, **fields})
        self._f.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
        self._f.flush()

    def step(self, step: int, loss: float, lr: float, grad_norm: float, tokens: int, step_s: float,
             mem_gib: float, **extra: Any) -> None:
        self.write(step=step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=tokens, step_s=step_s, mem_gib=mem_gib,
                   **extra)

    def event(self, kind: str, **fields: Any) -> None:
        self.write(event=kind, **fields)

    def start(self, **fields: Any) -> None:
        self.event(START, **fields)

    def train_begin(self, **choices: Any) -> None:
        self.event(TRAIN_BEGIN, **choices)

    def resume(self, **fields: Any) -> None:
        self.event(RESUME, **fields)

    def checkpoint(self, **fields: Any) -> None:
        self.event(CHECKPOINT, **fields)

    def eval(self, **fields: Any) -> None:
        self.event(EVAL, **fields)

    def sample(self, **fields: Any) -> None:
        self.event(SAMPLE, **fields)

    def end(self, **summary: Any) -> None:
        self.event(END, **summary)

    def error(self, **fields: Any) -> None:
        self.event(ERROR, **fields)

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


def strict_line(fields: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinity are not JSON: such a top-level number is written as null and named in `nonfinite`
    ({"loss": "nan"}), so strict parsers read every line and a diverged loss still reaches the display."""
    bad = {k: str(v) for k, v in fields.items() if isinstance(v, float) and not math.isfinite(v)}
    if not bad:
        return fields
    return {**{k: None if k in bad else v for k, v in fields.items()}, "nonfinite": bad}


# ---------------------------------------------------------------------------------------------
# Selecting events, and the rule for a step logged twice


def is_step(line: Any) -> bool:
    """A step line (a typed `StepEvent`, or a raw dict with a step and no "event")."""
    if isinstance(line, Event):
        return isinstance(line, StepEvent)
    return "event" not in line and "step" in line


def step_lines(lines: Iterable[Event]) -> list[StepEvent]:
    """The step lines, in file order (repeats included: `latest_steps` applies the rule for them)."""
    return [e for e in lines if isinstance(e, StepEvent)]


def events_of(lines: Iterable[Event], kind: str | type[E]) -> list[Any]:
    """The lifecycle events of one kind (its name or its type), in file order."""
    name = kind if isinstance(kind, str) else kind.KIND
    return [e for e in lines if not isinstance(e, StepEvent) and e.kind == name]


def first_event(lines: Iterable[Event], kind: str | type[E]) -> Any:
    return next(iter(events_of(lines, kind)), None)


class StepIndex(Generic[E]):
    """The one rule for a step logged more than once: the last line counts.

    A run resumed from a checkpoint logs again the steps after it (and evaluates again): those lines are the resumed
    run's, the ones whose model went on, so they replace the earlier ones, in the record, the live view, the
    trackers and bench alike. Lines without a step are ignored.
    """

    def __init__(self, lines: Iterable[E] = ()):
        self._by_step: dict[int, E] = {}
        for e in lines:
            self.add(e)

    def add(self, line: E) -> tuple[bool, E | None]:
        """Keep `line` for its step: (whether anything changed, the line it replaced)."""
        step = getattr(line, "step", None)
        if step is None:
            return False, None
        old = self._by_step.get(step)
        self._by_step[step] = line
        return old is None or old != line, old

    def get(self, step: int) -> E | None:
        """The kept line of `step`, if one was logged."""
        return self._by_step.get(step)

    def lines(self) -> list[E]:
        """The kept lines, by step."""
        return [self._by_step[s] for s in sorted(self._by_step)]

    def __len__(self) -> int:
        return len(self._by_step)


def latest_steps(lines: Iterable[Event]) -> list[StepEvent]:
    """One step line per step, by step: the last of each (`StepIndex`)."""
    return StepIndex(step_lines(lines)).lines()


def latest_samples(lines: Iterable[Event]) -> list[SampleEvent]:
    """One sample per (prompt, step), by prompt then step: the last line of each, as for steps (`StepIndex`)."""
    by_prompt: dict[int, StepIndex[SampleEvent]] = {}
    for e in events_of(lines, SampleEvent):
        if e.index is not None:
            by_prompt.setdefault(e.index, StepIndex()).add(e)
    return [e for i in sorted(by_prompt) for e in by_prompt[i].lines()]


def latest_evals(lines: Iterable[Event]) -> list[EvalEvent]:
    """One eval event per step, by step: the last of each (`StepIndex`)."""
    return StepIndex(events_of(lines, EvalEvent)).lines()
