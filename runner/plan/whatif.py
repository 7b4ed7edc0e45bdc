"""What-if: the estimate with the cheapest change that fits when the run does not."""

from __future__ import annotations

from runner.errors import UserError
from runner.engines import engine_for
from runner.plan.core import predict
from runner.plan.result import Estimate
from runner.spec import RunSpec, load_spec


def _candidates(spec: RunSpec, nproc: int, loss_impl: str) -> list[tuple[str, list[str]]]:
    t, hw = spec.train, spec.hardware
    out: list[tuple[str, list[str]]] = []
    if engine_for(spec.engine).fixed_loss is None and loss_impl == "full":
        out.append(("chunked loss", ["train.loss_impl=chunked"]))
    if not t.activation_checkpointing:
        out.append(("activation checkpointing on", ["train.activation_checkpointing=true"]))
    s = t.seq_len // 2
    while s >= 256:
        out.append((f"{s:,} tokens per block", [f"train.seq_len={s}"]))
        s //= 2
    if spec.method.kind == "full":
        out.append(("LoRA", ["method.kind=lora"]))
    if spec.method.kind != "qlora":
        out.append(("QLoRA (a 4-bit base)", ["method.kind=qlora"]))
    if hw.device != "cpu":
        n = 1
        while n <= nproc:
            n *= 2
        if nproc < 8:
            out.append((f"{min(n, 8)} GPUs per node", [f"hardware.nproc_per_node={min(n, 8)}"]))
        for nodes in (2, 4, 8, 16):
            if nodes > hw.nodes:
                out.append((f"{nodes} nodes", [f"hardware.nproc_per_node={max(nproc, 1)}", f"hardware.nodes={nodes}"]))
    return out


def suggestion(spec: RunSpec, est: Estimate, doc_len: int) -> str:
    target = "fits" if est.verdict == "tight" else ("fits", "tight")
    base = spec.to_dict()
    nproc = est.world_size // spec.hardware.nodes
    tried: list[tuple[str, Estimate]] = []
    for label, overrides in _candidates(spec, nproc, est.loss_impl):
        try:
            alt = predict(load_spec(base, overrides), doc_len=doc_len)
        except UserError:
            continue
        tried.append((label, alt))
        if alt.verdict in target:
            per = "rank" if spec.hardware.device == "cpu" else "GPU"  # a CPU run's memory is host RAM per rank
            return (f"{label} ({' '.join('--set ' + o for o in overrides)}): predicted {alt.per_gpu_gib:.1f} of "
                    f"{alt.gpu_memory_gib:.1f} GiB per {per}")
    if est.verdict == "tight":
        return "tight: no single change makes room; consider more GPUs or fewer tokens per block"
    cap = spec.hardware.memory_gib
    more = (f"raise hardware.memory_gib ({cap:g} GiB per {'rank' if spec.hardware.device == 'cpu' else 'GPU'} now)"
            if cap is not None else "give each rank more memory" if spec.hardware.device == "cpu"
            else "plan for a larger GPU")
    return f"no single change fits: combine them (e.g. QLoRA with fewer tokens per block) or {more}"


METHODS = ("full", "lora", "qlora")
"""What the method comparison sets side by side (method.kind)."""


def method_comparison(spec: RunSpec) -> list[dict]:
    """The estimate of the same run as a full fine-tune, LoRA and QLoRA (same model, GPU and block length): one
    row each, with `method` and the estimate's dict; a method this spec cannot plan gets its `error`."""
    base = spec.to_dict()
    rows = []
    for kind in METHODS:
        try:
            est = predict(load_spec(base, [f"method.kind={kind}"]))
        except UserError as e:
            rows.append({"method": kind, "error": str(e)})
            continue
        rows.append({"method": kind, **est.to_dict()})
    return rows


# =============================================================================================
# Sweeps and the CLI


def estimate(spec: RunSpec, doc_len: int | None = None, suggest: bool = True) -> Estimate:
    """Predict per-GPU memory and time for a spec (its `auto` fields are resolved for planning, not for running);
    when it does not fit comfortably and `suggest`, name the cheapest single change that does."""
    est = predict(spec, doc_len)
    if suggest and est.verdict != "fits":
        est.suggestion = suggestion(spec, est, est.doc_len)
    return est
