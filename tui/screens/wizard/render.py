"""The wizard's renderers: the architecture, dataset preview, plan and what-if table, from the dicts the checks return."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static

from runner import api
from runner.spec import RunSpec, spec_warnings
from tui import format as fmt
from tui.widgets.membar import MemoryBar

VERDICT_TOKEN = {"fits": "success", "tight": "warning", "does not fit": "error"}


def render_arch(arch: dict[str, Any]) -> Content:
    rows: list[tuple[str, str]] = []
    label = {"model_type": "type", "params_total": "parameters", "params_active": "active parameters",
             "layers": "layers", "num_hidden_layers": "layers", "layer_types": "layer types", "vocab": "vocab",
             "vocab_size": "vocab", "hidden": "hidden size", "hidden_size": "hidden size", "experts": "experts",
             "source": "config from", "approximate": "approximate"}
    seen = set()
    for key, name in label.items():
        if key in arch and arch[key] is not None and name not in seen:
            seen.add(name)
            value = arch[key]
            if key.startswith("params"):
                text = fmt.count(value)
            elif isinstance(value, dict):
                text = ", ".join(f"{k} × {v}" for k, v in value.items())
            elif isinstance(value, (list, tuple)):
                counts: dict[str, int] = {}
                for v in value:
                    counts[str(v)] = counts.get(str(v), 0) + 1
                text = ", ".join(f"{k} × {v}" for k, v in counts.items())
            else:
                text = f"{value:,}" if isinstance(value, int) else str(value)
            rows.append((name, text))
    if not rows:
        return Content("architecture: no details").stylize("$text-muted")
    width = max(len(n) for n, _ in rows)
    lines = [Content("architecture").stylize("bold")]
    lines += [Content(f"  {n:<{width}}  ").stylize("$text-muted") + Content(v) for n, v in rows]
    return Content("\n").join(lines)


def render_detect(info: dict[str, Any]) -> Content:
    if "hub" in info:
        return Content(f"hub dataset {info['hub']}: the wizard reads local files only (no hub access); set a local "
                       "path to preview it").stylize("$text-muted")
    cols = ", ".join(info.get("columns") or []) or "none"
    ok = info.get("messages_ok")
    what = ("chat messages · " if info.get("chat") else "") + str(info.get("detected") or "")
    status = Content(f" ✓ {what}" if ok else f" ✗ {what}").stylize("$text-success" if ok else "$text-error")
    return Content(f"{info.get('format')} file {fmt.show_path(info.get('file'))} · columns: {cols}") + status


def render_tokens(p: dict[str, Any]) -> Content:
    trained, total = p.get("n_trained", 0), p.get("n_tokens", 0)
    head = Content("").join([
        Content("first conversation through the chat template: ").stylize("bold"),
        Content(f"{total} tokens, {trained} trained on ({100 * trained / max(total, 1):.0f}%) · "),
        Content("trained").stylize("bold $text-success"), Content(" / "),
        Content("context").stylize("$text-muted"),
        Content(f" · mask by {p.get('template')}"),
    ])
    parts = []
    for text, on_loss in p.get("tokens") or []:
        parts.append(Content(text).stylize("bold $text-success underline" if on_loss else "$text-muted"))
    body = Content("").join(parts)
    if p.get("truncated"):
        body = body + Content(" …").stylize("$text-muted")
    return Content("\n").join([head, body])


def render_packing(p: dict[str, Any]) -> Content:
    s = p["pack"]
    eff = s.get("packing_efficiency")
    share = s.get("target_share")
    return Content(
        f"packing ({p.get('strategy', 'wrapped')}) on a sample of {s.get('examples')} conversations into "
        f"{p.get('seq_len'):,}-token blocks: {s.get('blocks')} blocks, efficiency {100 * eff:.1f}%, trained-on "
        f"tokens {100 * share:.1f}% of the block, {s.get('split_documents')} conversations split across blocks, "
        f"{s.get('skipped_no_assistant')} "
        "skipped (no assistant turn)" if eff is not None else "packing: no tokens in the sample")


def render_plan(screen: Screen, plan: dict[str, Any]) -> None:
    verdict_w = screen.query_one("#plan-verdict", Static)
    bar = screen.query_one("#plan-bar", MemoryBar)
    time_w = screen.query_one("#plan-time", Static)
    sugg_w = screen.query_one("#plan-suggestion", Static)
    cmd_w = screen.query_one("#plan-commands", Static)
    if plan.get("error"):
        verdict_w.update(Content(f"✗ {plan['error']}").stylize("$text-error"))
        bar.set_estimate({}, None, None)
        time_w.update("")
        sugg_w.update("")
        cmd_w.update("")
        return
    spec: RunSpec = plan["spec"]
    where = f"{spec.world_size} rank(s) on {spec.hardware.device}"
    if plan.get("planned"):
        where += " (planned target; this machine has no GPU)"
    est = plan.get("estimate")
    bar.display = est is not None
    if est is None:
        err = plan.get("estimate_error") or "no estimate"
        hint = " — pick a GPU type on the Hardware step to plan for one" if "hardware.gpu" in err else ""
        verdict_w.update(Content("\n").join([Content(where).stylize("$text-muted"),
                                             Content(err + hint).stylize("$text-warning")]))
        bar.set_estimate({}, None, None)
        time_w.update("")
        sugg_w.update("")
    else:
        verdict = est.get("verdict") or ("fits" if est.get("fits") else "does not fit")
        token = VERDICT_TOKEN.get(verdict, "warning")
        capacity = est.get("gpu_memory_gib")
        device_word = "host RAM" if spec.hardware.device == "cpu" else (est.get("gpu") or "GPU")
        line = Content("").join([
            Content(f" {verdict.upper()} ").stylize(f"bold $text-{token} on ${token}-muted"),
            Content(f"  {fmt.memory_estimate(est)} of {fmt.gib(capacity)} GiB {device_word}, "
                    f"headroom {fmt.gib(est.get('headroom_gib'))} GiB"),
            Content(" (approximate)").stylize("$text-warning") if est.get("approximate") else Content(""),
        ])
        lines = [Content(where).stylize("$text-muted"), line]
        if est.get("levers_reason"):  # the speed levers the planner chose, and why (runner.plan.autotune)
            lines.append(Content(f"levers: {est['levers_reason']}"))
        if est.get("approximate") and est.get("approximate_reason"):
            lines.append(Content(f"approximate: {est['approximate_reason']}").stylize("$text-muted"))
        advice = api.precision_advice(spec)
        if advice:
            lines.append(Content(f"note: {advice}").stylize("$text-warning"))
        lines += [Content(f"warning: {w}").stylize("$text-warning") for w in spec_warnings(spec)]
        verdict_w.update(Content("\n").join(lines))
        bar.set_estimate(fmt.breakdown_parts(est), est.get("per_gpu_gib"), capacity, device_word)
        time = Content(f"time: {fmt.num(est.get('step_s'), '.3g')} s/step × {est.get('steps') or '?'} steps "
                       f"≈ {fmt.duration(est.get('total_s'))}")
        disk = plan.get("disk")
        if disk:  # checkpoints and export against the runs folder's free space (launch refuses what cannot fit)
            line = Content(f"disk: {api.human_bytes(disk['needed_bytes'])} needed of "
                           f"{api.human_bytes(disk['free_bytes']) if disk['free_bytes'] is not None else '?'} free in "
                           f"{disk['folder']}" + ("" if disk["fits"] else ": does not fit"))
            time = Content("\n").join([time, line if disk["fits"] else line.stylize("$text-error")])
        time_w.update(time)
        suggestion = est.get("suggestion")
        if suggestion and verdict != "fits":
            sugg_w.update(Content(f"suggestion: {suggestion}").stylize("$text-warning"))
        else:
            sugg_w.update("")
    if plan.get("commands"):
        n = len(plan["commands"])
        cmd_w.update("\n".join(f"# node {i}\n{c}" if n > 1 else c for i, c in enumerate(plan["commands"])))
    else:
        cmd_w.update(f"command unavailable: {plan.get('command_error')}")


def render_sweep(screen: Screen, sweep: dict[str, Any], plan: dict[str, Any]) -> None:
    """The what-if grid as text: a Static, so that it is laid out with the rest of the pane in the same frame."""
    grid_w = screen.query_one("#sweep", Static)
    title = screen.query_one("#sweep-title", Static)
    if sweep.get("cpu"):
        title.update(Content("what-if by GPU type: plan for GPUs (Hardware: device cuda)").stylize(
            "$text-muted"))
        grid_w.display = False
        return
    if sweep.get("error"):
        title.update(Content(f"what-if table unavailable: {sweep['error']}").stylize("$text-muted"))
        grid_w.display = False
        return
    grid_w.display = True
    (_, seq_lens), (_, gpu_types) = sweep["axes"]
    title.update(f"what-if: GiB needed per GPU, {sweep.get('ranks')} GPU(s) per node, by tokens per block × GPU type")
    spec: RunSpec | None = plan.get("spec")
    first_w = max(len("GPU"), *(len(g) for g in gpu_types)) + 2
    cell_w = 11
    head = [Content(f"{'GPU':<{first_w}}").stylize("bold")]
    for s in seq_lens:
        mark = " •" if spec is not None and spec.train.seq_len == s else ""
        head.append(Content(f"{f'{s:,}{mark}':>{cell_w}}").stylize("bold"))
    lines = [Content("").join(head)]
    for g in gpu_types:
        cells = [Content(f"{g:<{first_w}}")]
        for s in seq_lens:
            row = sweep["grid"].get((s, g))
            if row is None:
                cells.append(Content(f"{'-':>{cell_w}}"))
                continue
            verdict = row.get("verdict") or ("fits" if row.get("fits") else "does not fit")
            mark = {"fits": "✓", "tight": "~", "does not fit": "✗"}.get(verdict, "?")
            token = VERDICT_TOKEN.get(verdict, "warning")
            text = f"{fmt.gib(row.get('per_gpu_gib'))} {mark}"
            cells.append(Content(f"{text:>{cell_w}}").stylize(f"$text-{token}"))
        lines.append(Content("").join(cells))
    lines += method_line(sweep.get("methods") or [], spec)
    grid_w.update(Content("\n").join(lines))


METHOD_NAMES = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}


def method_line(rows: list[dict[str, Any]], spec: RunSpec | None) -> list[Content]:
    """`by method: full 157.3 ✗ · LoRA 136.2 ✗ · QLoRA 75.3 ✓` (GiB per GPU on the run's GPU and block length),
    the run's own method marked; nothing when there are no rows."""
    cells = []
    for row in rows:
        kind = row.get("method.kind")
        if kind not in METHOD_NAMES or row.get("per_gpu_gib") is None:
            continue
        verdict = row.get("verdict") or ("fits" if row.get("fits") else "does not fit")
        mark = {"fits": "✓", "tight": "~", "does not fit": "✗"}.get(verdict, "?")
        own = "•" if spec is not None and spec.method.kind == kind else ""
        cells.append(Content(f"{METHOD_NAMES[kind]}{own} {fmt.gib(row['per_gpu_gib'])} {mark}").stylize(
            f"$text-{VERDICT_TOKEN.get(verdict, 'warning')}"))
    if not cells:
        return []
    return [Content("by method: ").stylize("bold") + Content(" · ").join(cells)]
