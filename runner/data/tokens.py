"""Token ids of one dataset row and its loss mask: True only on the trained turns' responses (any chat template).

Templates with `{% generation %}` markers give ids and mask in one render when exactly the assistant turns train;
otherwise turns are bracketed one by one (`tokenize_sft`); text is tokenised as it is, ending in EOS. No torch: the
ranks' stream, preflight and the wizard's preview tokenise the same way.
"""

from __future__ import annotations

import re
from typing import Any

from runner.data.formats import Sample

Example = tuple[list[int], list[bool]]



def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation: bool = False) -> list[int]:
    return _ids(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=True,
                                              return_dict=False))


def tokenize_sft(tokenizer: Any, messages: list[dict[str, Any]], trained: list[bool] | None = None,
                 tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation and a mask that is True only on the trained turns' responses (any template).

    `trained` flags the turns that carry the loss (default: every assistant turn). Each is bracketed by two
    renders: the conversation up to just before it with the generation prompt, and the conversation through it.
    The response is what lies between where each render stops agreeing with the full conversation: measuring
    agreement (a common prefix) rather than render length keeps the mask right for templates whose generation
    prompt adds tokens the full render lacks (a prefilled `<think>`). The generation prompt itself is never a
    target: the model is given it at inference time, also when the full render spells it differently
    (`_align_to_header`).
    """
    if trained is None:
        trained = [m.get("role") == "assistant" for m in messages]
    full = _render(tokenizer, messages, tools)
    mask = [False] * len(full)
    for i, _ in enumerate(messages):
        if not trained[i]:
            continue
        prefix = _render(tokenizer, messages[:i], tools, generation=True) if i else []
        through = _render(tokenizer, messages[: i + 1], tools)
        start, end = _common_prefix(prefix, full), _common_prefix(through, full)
        if start < len(prefix):
            start = _align_to_header(tokenizer, full, start, end, prefix, _render(tokenizer, messages[:i], tools))
        for j in range(start, end):
            mask[j] = True
    return full, mask


HEADER_SLACK = 4  # tokens the full render may add before the turn header that the generation prompt lacks


def _align_to_header(tokenizer: Any, full: list[int], start: int, end: int, prompt: list[int],
                     before: list[int]) -> int:
    """Where the response starts when the generation prompt is not a prefix of the full render.

    Templates that put a separator before each turn header (a newline between turns) render the header
    differently in the full conversation than at the end of the generation prompt, so agreement stops before the
    header and the header would be trained. Find the generation prompt's header (less leading and trailing
    whitespace tokens) just after `start` in the full render and start after it and its trailing whitespace.
    A prefilled generation prompt (`<think>` the full render lacks) agrees through its header: nothing to find.
    """
    header = prompt[_common_prefix(before, prompt):]
    blank = [not tokenizer.decode([t]).strip() for t in header]
    lo, hi = 0, len(header)
    while lo < hi and blank[lo]:
        lo += 1
    while hi > lo and blank[hi - 1]:
        hi -= 1
    core = header[lo:hi]
    if not core:
        return start
    for p in range(start, min(end - len(core), start + HEADER_SLACK + lo) + 1):
        if full[p:p + len(core)] == core:
            q = p + len(core)
            for _ in range(len(header) - hi):  # the header's trailing whitespace, as the full render spells it
                if q < end and not tokenizer.decode([full[q]]).strip():
                    q += 1
            return q
    return start


PROBE = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."},
         {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Hi."}]


def generation_prompt_is_prefix(tokenizer: Any) -> bool:
    """Whether the template's generation prompt is a prefix of its full render (when not, the turn header is
    found by `_align_to_header`, and the preview says so)."""
    prompt = _render(tokenizer, PROBE[:3], None, generation=True)
    return _render(tokenizer, PROBE, None)[:len(prompt)] == prompt


def tokenize_sft_generation(tokenizer: Any, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[bool]]:
    """Fast path for templates with `{% generation %}` markers: one render gives ids and mask."""
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


def tokenize_text(tokenizer: Any, segments: list[tuple[str, bool]]) -> tuple[list[int], list[bool]]:
    """Plain text segments (text, trained?) as one document ending in EOS (TRL's standard prompt/completion and
    language-modeling rows); a segment's mask starts where the tokenisation of the text so far stops agreeing
    with the text before it, so a token merged across a boundary belongs to the later segment."""
    ids: list[int] = []
    mask: list[bool] = []
    text = ""
    for piece, trained in segments:
        text += piece
        cur = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        keep = _common_prefix(ids, cur)
        ids, mask = cur, mask[:keep] + [trained] * (len(cur) - keep)
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
        mask.append(bool(segments) and segments[-1][1])
    return ids, mask


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and bool(_GENERATION_TAG.search(template))


def tokenize_sample(tokenizer: Any, sample: Sample, markers: bool | None = None) -> tuple[list[int], list[bool]]:
    """One row (runner.data.formats.Sample) as ids and loss mask. Generation markers mark every assistant turn, so they
    serve only when exactly the assistant turns train; any other choice of turns is bracketed turn by turn."""
    if sample.segments is not None:
        return tokenize_text(tokenizer, sample.segments)
    messages = sample.messages or []
    if markers is None:
        markers = has_generation_markers(tokenizer)
    if markers and sample.trained == [m.get("role") == "assistant" for m in messages]:
        return tokenize_sft_generation(tokenizer, messages, sample.tools)
    return tokenize_sft(tokenizer, messages, sample.trained, sample.tools)


def _ids(x: Any) -> list[int]:
    # apply_chat_template returns a list, or a BatchEncoding in some versions even with return_dict=False.
    if isinstance(x, dict) or hasattr(x, "input_ids"):
        x = x["input_ids"]
    return list(x)
