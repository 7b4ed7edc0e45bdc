"""Dataset preview (the wizard's data step): file type, columns and row format, one row as the trainer tokenises it,
packing efficiency on a sample. Blocking (tokenizer load): a UI calls it from a thread worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.spec import RunSpec, resolve_embedded

SAMPLE_ROWS_MAX = 2000
SAMPLE_BLOCKS = 8  # sample until this many blocks' worth of tokens, so the padded last block weighs little
# ... and at least this many conversations: packing is judged on counts, never on a time budget (a loaded machine
# once judged it on 2 or 3 conversations).
SAMPLE_CONVERSATIONS_MIN = 64
PREVIEW_TOKENS_MAX = 800  # a tool-calling row with its tools block runs to about 410 tokens on the embedded tokenizer
DETECT_ROWS = 16


def detect(spec: RunSpec) -> dict[str, Any]:
    """{"file", "format", "columns", "messages_ok", "detected", "chat"} for a local dataset, where `detected`
    describes the row format (runner.data.formats) or, when `messages_ok` is false, says why none fits; {"hub": id} when
    there is no local path."""
    from runner.data.formats import FormatError, RowFormat, samples
    from runner.data.formats import detect as detect_format
    from runner.data.datafiles import data_suffix, is_gzip
    from runner.gate.preflight import data_file, read_rows

    d = spec.dataset
    if not d.path:
        return {"hub": d.id}
    path = data_file(resolve_embedded(d.path), d.split)
    if path is None:
        raise ValueError(f"no data file under dataset.path {d.path}")
    rows = read_rows(path, DETECT_ROWS)
    columns = list(rows[0]) if rows else []
    # A compressed file shows as what it holds: "jsonl.gz".
    kind = data_suffix(path).lstrip(".") + (".gz" if is_gzip(path) else "")
    info = {"file": str(path), "format": kind, "columns": columns}
    fmt = RowFormat.from_spec(d)
    try:
        found = detect_format(rows, fmt)
        samples(rows, fmt, found)
    except FormatError as e:
        return {**info, "messages_ok": False, "detected": f"{e} (fix: {e.fix})", "chat": False}
    return {**info, "messages_ok": True, "detected": found.describe(), "chat": found.chat}


def tokenizer_preview(spec: RunSpec) -> dict[str, Any]:
    """One conversation as (token text, trained?) pairs and PackStats over a sample, through the trainer's own
    tokenisation (runner.data.tokens) and tokenizer loading (runner.train.model)."""
    from runner.data.formats import RowFormat, RowReader
    from runner.data.formats import detect as detect_format
    from runner.gate.preflight import read_rows
    from runner.data.tokens import has_generation_markers, tokenize_sample
    from runner.train.data import PackStats, pack
    from runner.train.model import load_tokenizer

    d = spec.dataset
    info = detect(spec)
    if "hub" in info:
        return {"detect": info}
    if not info["messages_ok"]:
        raise UserError(info["detected"])
    tok = load_tokenizer(spec)
    markers = has_generation_markers(tok)  # the trainer's own choice of masking
    rows = read_rows(Path(info["file"]), SAMPLE_ROWS_MAX)
    fmt = RowFormat.from_spec(d)
    read = RowReader(fmt, detect_format(rows[:DETECT_ROWS], fmt))
    convs = [read(r) for r in rows]
    shown = next((c for c in convs if c.has_targets), None)
    tokens: list[tuple[str, bool]] = []
    n_tokens = n_trained = 0
    if shown is not None:
        try:
            ids, mask = tokenize_sample(tok, shown, markers)
        except Exception as e:  # noqa: BLE001 - a template that cannot render these rows, said as preflight says it
            raise UserError(f"dataset.format: the chat template cannot render the dataset's rows: {e} (fix: check "
                            "the roles and content types against the template: dataset.roles, dataset.columns)") \
                from None
        n_tokens, n_trained = len(ids), sum(mask)
        tokens = token_texts(tok, ids[:PREVIEW_TOKENS_MAX], mask[:PREVIEW_TOKENS_MAX])
    stats = PackStats()
    seq_len = spec.train.seq_len
    want_tokens = SAMPLE_BLOCKS * seq_len

    def examples():
        seen = 0
        for n, conv in enumerate(convs):
            if seen >= want_tokens and n >= SAMPLE_CONVERSATIONS_MIN:
                return
            ids, mask = tokenize_sample(tok, conv, markers)
            seen += len(ids)
            yield ids, mask

    strategy = spec.train.packing_strategy
    for _ in pack(examples(), seq_len, tok.pad_token_id, stats, strategy=strategy):
        pass
    return {"detect": info, "tokens": tokens, "n_tokens": n_tokens, "n_trained": n_trained,
            "truncated": n_tokens > PREVIEW_TOKENS_MAX, "pack": stats.to_dict(), "seq_len": seq_len,
            "strategy": strategy, "template": _mask_method(tok, markers)}


def token_texts(tok: Any, ids: list[int], mask: list[int]) -> list[tuple[str, bool]]:
    """(text, trained?) per token, where a character that a byte-level tokenizer splits over several tokens ("ä" in
    "Klämbt") is shown whole on the token that completes it: decoding each token alone gives U+FFFD for each part."""
    out: list[tuple[str, bool]] = []
    start = 0
    for end in range(1, len(ids) + 1):
        text = tok.decode(ids[start:end])
        # A UTF-8 character is at most 4 bytes: a longer run ending in U+FFFD is the text's own or broken bytes.
        if text.endswith("\ufffd") and end < len(ids) and end - start < 4:
            continue
        out.append((text, any(mask[start:end])))
        start = end
    return out


def _mask_method(tok: Any, markers: bool) -> str:
    from runner.data.tokens import generation_prompt_is_prefix

    if markers:
        return "generation markers"
    try:
        aligned = not generation_prompt_is_prefix(tok)
    except Exception:  # noqa: BLE001 - a template that rejects the probe conversation: nothing to add
        aligned = False
    return "prefix bracketing" + (" (the template writes turn headers unlike its generation prompt: aligned on "
                                  "the header, which is not trained)" if aligned else "")
