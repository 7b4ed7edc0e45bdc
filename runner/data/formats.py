"""Dataset row formats: detect which one a dataset uses and turn each row into what the tokeniser trains on.

Formats (the names `dataset.format` takes):

* `messages`: a column of `[{role, content}, ...]` (OpenAI / TRL conversational); an optional `tools` column.
* `sharegpt`: a column (`conversations`) of `[{from, value}, ...]` with the role names human / gpt / system /
  function_call / observation / tool, an optional `system` and `tools` column (LLaMA-Factory's layout).
* `alpaca`: `instruction`, optional `input`, `output`, optional `system` and `history` ([[query, answer], ...]).
* `prompt_completion`: TRL's `prompt` + `completion`, both strings (standard: plain text, no chat template) or both
  lists of messages (conversational); loss on the completion only.
* `text`: a `text` column, loss on every token (TRL's language-modeling format).

Chat rows become a `Sample` of messages with one flag per message (does it train?), plus the tools passed to the
chat template as `tools=`; text rows become segments of (text, trained?). No torch here: preflight, the wizard and
the estimator read rows through this module too.

Each format is one `Format` row of `FORMATS` (how it is found in rows, how a row reads, what trains); the spec's
allowed `dataset.format` values are the registry's names, and nowhere else compares format names
(`tests/unit/test_registries.py` checks both).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runner.errors import UserError

TRAIN_ON = ("assistant", "assistant+tool_calls")
# What `dataset.columns` may name: dataset columns, and the keys inside each message (role, content).
COLUMN_KEYS = ("messages", "tools", "system", "instruction", "input", "output", "history", "prompt", "completion",
               "text", "role", "content")
# Roles a dataset's role names map to; function_call becomes an assistant message with tool_calls.
TARGET_ROLES = ("user", "assistant", "system", "tool", "function_call")
DEFAULT_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "model": "assistant",
                 "system": "system", "tool": "tool", "observation": "tool", "function_call": "function_call",
                 "tool_call": "function_call"}
CONVERSATION_COLUMNS = ("messages", "conversations", "conversation")


class FormatError(UserError):
    """A row or a dataset that cannot be read in the asked (or detected) format; `field` is the spec field to set."""

    def __init__(self, message: str, fix: str = "", field: str = "dataset.format"):
        super().__init__(message)
        self.field, self.fix = field, fix


@dataclass(frozen=True)
class RowFormat:
    """The dataset fields that say how rows read: hashable and picklable (DataLoader workers, caches)."""

    format: str = "auto"
    columns: tuple[tuple[str, str], ...] = ()
    roles: tuple[tuple[str, str], ...] = ()
    train_on: str = "assistant"

    @classmethod
    def from_spec(cls, dataset: Any) -> RowFormat:
        """From a DatasetSpec; `messages_field` is the conversation column unless `columns.messages` names one."""
        columns = dict(getattr(dataset, "columns", None) or {})
        messages_field = getattr(dataset, "messages_field", "messages")
        if messages_field and messages_field != "messages":
            columns.setdefault("messages", messages_field)
        return cls(format=getattr(dataset, "format", "auto"), columns=tuple(sorted(columns.items())),
                   roles=tuple(sorted((getattr(dataset, "roles", None) or {}).items())),
                   train_on=getattr(dataset, "train_on", "assistant"))

    @property
    def column_map(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def role_map(self) -> dict[str, str]:
        return {**DEFAULT_ROLES, **dict(self.roles)}


@dataclass(frozen=True)
class Detected:
    """A resolved format: which one, from which columns, and whether it was detected or asked for."""

    format: str
    columns: tuple[tuple[str, str], ...]  # logical name -> dataset column (or message key), only those in use
    variant: str = ""  # prompt_completion: standard | conversational
    detected: bool = True

    @property
    def column_map(self) -> dict[str, str]:
        return dict(self.columns)

    def describe(self) -> str:
        """One line for people: `sharegpt (detected): conversations [from/value], tools`."""
        c = self.column_map
        name = f"{self.format} ({self.variant})" if self.variant else self.format
        parts = [f"{c[k]}" + (f" [{c['role']}/{c['content']}]" if k == "messages" else "")
                 for k in ("messages", "instruction", "input", "output", "prompt", "completion", "text") if k in c]
        parts += [c[k] for k in ("system", "history", "tools") if k in c]
        return f"{name} ({'detected' if self.detected else 'set'}): {', '.join(parts)}"

    @property
    def chat(self) -> bool:
        """Whether rows become messages through the chat template (not strings: text, standard prompt/completion)."""
        return FORMATS[self.format].chat and self.variant != "standard"

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "variant": self.variant or None, "columns": self.column_map,
                "detected": self.detected}


@dataclass
class Sample:
    """What one row trains on: messages with a trained flag each (chat), or text segments (text, trained?)."""

    messages: list[dict[str, Any]] | None = None
    trained: list[bool] | None = None
    tools: list[dict[str, Any]] | None = None
    segments: list[tuple[str, bool]] | None = None

    @property
    def has_targets(self) -> bool:
        flags = self.trained if self.messages is not None else [t for s, t in self.segments or [] if s]
        return any(flags or [])

    def texts(self) -> list[str]:
        """The row's text pieces (contents, tool calls and tools as JSON), for counting tokens."""
        if self.segments is not None:
            return [s for s, _ in self.segments]
        out = [_text(m.get("content")) for m in self.messages or []]
        out += [json.dumps(c, ensure_ascii=False) for m in self.messages or [] for c in m.get("tool_calls") or []]
        if self.tools:
            out.append(json.dumps(self.tools, ensure_ascii=False))
        return out


# ---------------------------------------------------------------------------------------------
# Detection


def _conversation_keys(conv: Any) -> tuple[str, str] | None:
    """(role key, content key) of a list of message dicts, or None when it is not one."""
    if not isinstance(conv, list) or not conv or not all(isinstance(m, dict) for m in conv):
        return None
    for role, content in (("role", "content"), ("from", "value")):
        if all(role in m for m in conv) and all(content in m or "tool_calls" in m for m in conv):
            return role, content
    return None


def _present(rows: list[dict[str, Any]], column: str) -> bool:
    return any(isinstance(r, dict) and r.get(column) is not None for r in rows)


def _has(rows: list[dict[str, Any]], column: str) -> bool:
    # An optional column counts when any row has it, even empty: the ranks detect on one row, which may lack a value.
    return any(isinstance(r, dict) and column in r for r in rows)


def _detect_conversation(rows: list[dict[str, Any]], cols: dict[str, str], asked: str,
                         found: list[str]) -> Detected | None:
    conv_col = cols.get("messages") or next((c for c in CONVERSATION_COLUMNS if _present(rows, c)), None)
    if conv_col and _present(rows, conv_col):
        keys = next((k for r in rows if (k := _conversation_keys(r.get(conv_col))) is not None), None)
        if "role" in cols or "content" in cols:
            role, content = keys or ("role", "content")
            keys = (cols.get("role", role), cols.get("content", content))
        if keys is not None:
            kind = asked if asked != "auto" else ("sharegpt" if keys == ("from", "value") else "messages")
            used = {"messages": conv_col, "role": keys[0], "content": keys[1]}
            used.update({k: cols.get(k, k) for k in ("system", "tools") if _has(rows, cols.get(k, k))})
            return Detected(kind, tuple(sorted(used.items())), detected=asked == "auto")
        if asked != "auto":
            raise FormatError(f"dataset.format={asked}: column '{conv_col}' does not hold lists of messages "
                              f"with role/content or from/value keys", field="dataset.columns",
                              fix="set dataset.columns.role and dataset.columns.content to the message keys")
    elif asked != "auto":
        want = cols.get("messages", "messages" if asked == "messages" else "conversations")
        raise FormatError(f"dataset.format={asked}: no column '{want}'; columns found: {', '.join(found)}",
                          field="dataset.columns", fix="set dataset.columns.messages to the conversation column")
    return None


def _detect_prompt_completion(rows: list[dict[str, Any]], cols: dict[str, str], asked: str,
                              found: list[str]) -> Detected | None:
    p, c = cols.get("prompt", "prompt"), cols.get("completion", "completion")
    if _present(rows, p) and _present(rows, c):
        row = next(r for r in rows if r.get(p) is not None)
        variant = "conversational" if isinstance(row.get(p), list) else "standard"
        return Detected("prompt_completion", (("completion", c), ("prompt", p)), variant, asked == "auto")
    if asked != "auto":
        raise FormatError(f"dataset.format=prompt_completion: needs columns '{p}' and '{c}'; columns found: "
                          f"{', '.join(found)}", field="dataset.columns",
                          fix="set dataset.columns.prompt and dataset.columns.completion")
    return None


def _detect_alpaca(rows: list[dict[str, Any]], cols: dict[str, str], asked: str,
                   found: list[str]) -> Detected | None:
    i, o = cols.get("instruction", "instruction"), cols.get("output", "output")
    if _present(rows, i) and _present(rows, o):
        used = {"instruction": i, "output": o}
        used.update({k: cols.get(k, k) for k in ("input", "system", "history") if _has(rows, cols.get(k, k))})
        return Detected("alpaca", tuple(sorted(used.items())), detected=asked == "auto")
    if asked != "auto":
        raise FormatError(f"dataset.format=alpaca: needs columns '{i}' and '{o}'; columns found: "
                          f"{', '.join(found)}", field="dataset.columns",
                          fix="set dataset.columns.instruction and dataset.columns.output")
    return None


def _detect_text(rows: list[dict[str, Any]], cols: dict[str, str], asked: str, found: list[str]) -> Detected | None:
    t = cols.get("text", "text")
    if _present(rows, t):
        return Detected("text", (("text", t),), detected=asked == "auto")
    if asked != "auto":
        raise FormatError(f"dataset.format=text: no column '{t}'; columns found: {', '.join(found)}",
                          field="dataset.columns", fix="set dataset.columns.text to the text column")
    return None


# Tried in this order when the format is auto: a conversation column wins over prompt/completion, and so on.
_AUTO_ORDER = (_detect_conversation, _detect_prompt_completion, _detect_alpaca, _detect_text)


def detect(rows: list[dict[str, Any]], fmt: RowFormat) -> Detected:
    """The format of these rows (a sample of the dataset), or a FormatError naming the columns found."""
    asked = fmt.format
    found = sorted({k for r in rows if isinstance(r, dict) for k in r})
    detectors = _AUTO_ORDER if asked == "auto" else (FORMATS[asked].detect,) if asked in FORMATS else ()
    for detector in detectors:
        hit = detector(rows, fmt.column_map, asked, found)
        if hit is not None:
            return hit
    raise FormatError(
        f"cannot tell the dataset's format from its columns ({', '.join(found) or 'none'}): expected a messages/"
        "conversations column, prompt+completion, instruction+output, or text",
        fix=f"set dataset.format ({'|'.join(FORMATS)}) and dataset.columns, e.g. "
            "dataset.columns={messages: dialog} or {instruction: question, output: answer}")


# ---------------------------------------------------------------------------------------------
# Rows to samples


def _text(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    if isinstance(x, list):  # content parts: [{"type": "text", "text": ...}]
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in x)
    return str(x)


def _maybe_json(x: Any) -> Any:
    if isinstance(x, str):
        try:
            return json.loads(x)
        except json.JSONDecodeError:
            return x
    return x


def parse_tools(raw: Any) -> list[dict[str, Any]] | None:
    """A tools column (JSON text or a list) as the chat template expects: [{type: function, function: {...}}]."""
    tools = _maybe_json(raw)
    if tools in (None, "", []):
        return None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise FormatError(f"the tools column holds {type(tools).__name__}, not a list of function descriptions",
                          field="dataset.columns", fix="point dataset.columns.tools at a column of tool lists")
    return [t if "function" in t and t.get("type", "function") == "function" else {"type": "function", "function": t}
            for t in tools]


def _tool_calls(value: Any) -> list[dict[str, Any]] | None:
    """A function_call turn's value ({name, arguments} or a list of them, as JSON) as tool_calls; None if not one."""
    calls = _maybe_json(value)
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not all(isinstance(c, dict) and "name" in c for c in calls):
        return None
    return [{"type": "function", "function": {"name": c["name"], "arguments": _maybe_json(c.get("arguments", {}))}}
            for c in calls]


def _message(raw: dict[str, Any], role_key: str, content_key: str, roles: Mapping[str, str]) -> dict[str, Any]:
    name = raw.get(role_key)
    role = roles.get(name) if isinstance(name, str) else None
    if role not in TARGET_ROLES:
        raise FormatError(f"role {name!r} is not a known role name (known: {', '.join(sorted(roles))})",
                          field="dataset.roles", fix=f"map it, e.g. dataset.roles={{{name}: assistant}}")
    content = raw.get(content_key)
    if role == "function_call":
        calls = _tool_calls(content)
        if calls is None:
            return {"role": "assistant", "content": _text(content), "_tool_call": True}
        return {"role": "assistant", "content": "", "tool_calls": calls}
    # Columnar files give every message every key seen in the file, absent ones as None; templates that test
    # `'tool_calls' in message` would then render a None.
    msg = {k: v for k, v in raw.items() if k not in (role_key, content_key) and v is not None}
    msg.update(role=role, content=_text(content))
    return msg


def _trains(msg: dict[str, Any], train_on: str) -> bool:
    if msg.get("role") != "assistant":
        return False
    calls = bool(msg.get("tool_calls")) or bool(msg.pop("_tool_call", False))
    return train_on == "assistant+tool_calls" or not calls


def _chat(messages: list[dict[str, Any]], train_on: str, tools: Any = None,
          trainable_from: int = 0) -> Sample:
    trained = [i >= trainable_from and _trains(m, train_on) for i, m in enumerate(messages)]
    for m in messages:
        m.pop("_tool_call", None)
    return Sample(messages=messages, trained=trained, tools=parse_tools(tools))


def _conversation(value: Any, what: str, role_key: str, content_key: str, roles: Mapping[str, str]) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise FormatError(f"{what} holds {type(value).__name__}, not a list of messages", field="dataset.columns",
                          fix="set dataset.format and dataset.columns to match the rows")
    try:
        return [_message(m, role_key, content_key, roles) for m in value]
    except FormatError as e:
        if e.field != "dataset.roles":
            raise
        raise FormatError(str(e), field="dataset.roles",
                          fix=f"map it, e.g. dataset.roles={_role_guess(value, role_key, roles)}") from None


# Words in a role name that say who speaks: checked before the order of speaking (an agent may greet first).
_ROLE_WORDS = {"user": ("customer", "client", "human", "patient", "student", "question", "asker", "prompter", "caller"),
               "assistant": ("agent", "bot", "support", "expert", "answer", "model", "gpt", "tutor")}


def _role_guess(value: list[dict[str, Any]], role_key: str, roles: Mapping[str, str]) -> str:
    """A mapping for the conversation's unknown role names (a name mapped to assistant trains on that speaker's
    words): by a word in the name (customer, agent), else by the roles already known, else the first speaker is the
    user."""
    names = [m.get(role_key) for m in value if isinstance(m.get(role_key), str)]
    unknown = list(dict.fromkeys(n for n in names if roles.get(n) not in TARGET_ROLES))
    known = {roles[n] for n in names if roles.get(n) in TARGET_ROLES}
    speakers = [n for n in dict.fromkeys(names) if roles.get(n) not in ("system", "tool", "function_call")]
    guess = {}
    for name in unknown:
        hint = next((role for role, words in _ROLE_WORDS.items() if any(w in name.lower() for w in words)), None)
        if hint:
            guess[name] = hint
        elif "assistant" in known and "user" not in known:
            guess[name] = "user"
        elif "user" in known and "assistant" not in known:
            guess[name] = "assistant"
        else:  # both or neither known: the order of speaking decides
            guess[name] = "user" if speakers and speakers[0] == name else "assistant"
    return "{" + ", ".join(f"{k}: {v}" for k, v in guess.items()) + "}"


def _read_conversation(row: dict[str, Any], det: Detected, fmt: RowFormat) -> Sample:
    c, roles = det.column_map, fmt.role_map
    messages = _conversation(row.get(c["messages"]), f"column '{c['messages']}'", c["role"], c["content"], roles)
    system = row.get(c["system"]) if "system" in c else None
    if system and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": _text(system)})
    return _chat(messages, fmt.train_on, row.get(c["tools"]) if "tools" in c else None)


def _read_alpaca(row: dict[str, Any], det: Detected, fmt: RowFormat) -> Sample:
    c = det.column_map
    messages = []
    if row.get(c.get("system", "")):
        messages.append({"role": "system", "content": _text(row[c["system"]])})
    for pair in row.get(c.get("history", "")) or []:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise FormatError(f"column '{c['history']}' must hold [query, answer] pairs, got {pair!r:.60}",
                              field="dataset.columns", fix="point dataset.columns.history at such a column")
        messages += [{"role": "user", "content": _text(pair[0])}, {"role": "assistant", "content": _text(pair[1])}]
    query = "\n".join(x for x in (_text(row.get(c["instruction"])), _text(row.get(c.get("input", "")))) if x)
    messages += [{"role": "user", "content": query}, {"role": "assistant", "content": _text(row.get(c["output"]))}]
    return _chat(messages, fmt.train_on)


def _read_prompt_completion(row: dict[str, Any], det: Detected, fmt: RowFormat) -> Sample:
    c, roles = det.column_map, fmt.role_map
    prompt, completion = row.get(c["prompt"]), row.get(c["completion"])
    if isinstance(prompt, list) or isinstance(completion, list):
        head = _conversation(prompt, f"column '{c['prompt']}'", "role", "content", roles)
        tail = _conversation(completion, f"column '{c['completion']}'", "role", "content", roles)
        return _chat(head + tail, fmt.train_on, row.get(fmt.column_map.get("tools", "tools")),
                     trainable_from=len(head))
    return Sample(segments=[(_text(prompt), False), (_text(completion), True)])


def _read_text(row: dict[str, Any], det: Detected, fmt: RowFormat) -> Sample:
    return Sample(segments=[(_text(row.get(det.column_map["text"])), True)])


@dataclass(frozen=True)
class Format:
    """One row layout `dataset.format` names: how it is found in a dataset's rows and how one row reads."""

    name: str
    detect: Callable[[list[dict[str, Any]], dict[str, str], str, list[str]], Detected | None]
    """f(rows, column map, asked format, columns found): the Detected layout; None when the format is auto and the
    rows lack it, a FormatError naming the columns to set when it was asked for. Formats told apart by their keys
    (messages, sharegpt) share one."""
    read: Callable[[dict[str, Any], Detected, RowFormat], Sample]
    """f(row, detected, row format): the row as a Sample, or a FormatError naming the field to set."""
    chat: bool = True
    """Rows may become messages through the chat template; False: plain text, no template."""
    roles_train: bool = True
    """Role names decide what trains (assistant turns, dataset.roles); False: the layout does (the completion,
    every token)."""


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("messages", _detect_conversation, _read_conversation),
    Format("sharegpt", _detect_conversation, _read_conversation),
    Format("alpaca", _detect_alpaca, _read_alpaca),
    Format("prompt_completion", _detect_prompt_completion, _read_prompt_completion, roles_train=False),
    Format("text", _detect_text, _read_text, chat=False, roles_train=False),
)}
"""Every dataset.format but auto, in the order the spec lists them (auto detection has its own order)."""


def to_sample(row: dict[str, Any], det: Detected, fmt: RowFormat) -> Sample:
    """One row as a Sample; FormatError (with the field to set) when the row does not fit the format."""
    if det.format not in FORMATS:
        raise FormatError(f"unknown dataset.format {det.format!r}", fix=f"use one of auto, {', '.join(FORMATS)}")
    return FORMATS[det.format].read(row, det, fmt)


class RowReader:
    """Rows → Samples for one stream: the format is detected on the first row when dataset.format is auto."""

    def __init__(self, fmt: RowFormat, detected: Detected | None = None):
        self.fmt, self.detected = fmt, detected

    def __call__(self, row: dict[str, Any]) -> Sample:
        if self.detected is None:
            self.detected = detect([row], self.fmt)
        return to_sample(row, self.detected, self.fmt)


def row_texts(row: dict[str, Any], fmt: RowFormat = RowFormat()) -> tuple[list[str], int]:
    """(text pieces, chat turns) of one row in any format, for token counts (the estimator adds the template's
    tokens per turn; text rows have none); ([], 0) when the row does not read."""
    try:
        sample = to_sample(row, detect([row], fmt), fmt)
    except FormatError:
        return [], 0
    return sample.texts(), len(sample.messages or [])


def samples(rows: Iterable[dict[str, Any]], fmt: RowFormat, detected: Detected) -> list[Sample]:
    """Every row as a Sample; a FormatError names the 1-based row that does not fit."""
    out = []
    for n, row in enumerate(rows, 1):
        try:
            out.append(to_sample(row, detected, fmt))
        except FormatError as e:
            raise FormatError(f"row {n}: {e}", e.fix, e.field) from None
    return out


def dataset_format(dataset: Any, sample_rows: int = 16) -> Detected | None:
    """The format of a DatasetSpec's local file, from its first rows (for the wizard, `runner estimate` and the
    record). None for a hub dataset (the ranks detect it on their first row) or a file that does not read."""
    from runner.data.datafiles import data_file, read_rows
    from runner.naming import resolve_embedded

    fmt = RowFormat.from_spec(dataset)
    if not dataset.path:
        return None
    f = data_file(resolve_embedded(dataset.path), dataset.split)
    if f is None:
        return None
    try:
        return detect(read_rows(f, sample_rows), fmt)
    except (FormatError, ValueError, OSError):
        return None


def is_heldout(row: dict[str, Any], seed: int, fraction: float) -> bool:
    """Whether a dataset row belongs to the eval share: a hash of its content and the seed, under `fraction`."""
    if fraction <= 0:
        return False
    text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    digest = hashlib.sha256(f"{seed}\0{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
