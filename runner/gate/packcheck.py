"""The packing check: before launch, a shrunk copy of the run's own model shows that packed documents give the loss
and gradients of the same documents run one by one, on the attention path, kernels, loss and engine inputs the run
will use, on its launch device. A mismatch refuses the run (preflight), naming the family and the path and what
passes instead; the verdict is cached per model type, config, path and package versions, and kept in the record.

Why on the user's own architecture: what keeps documents apart is the model's own forward (how it builds masks,
how its rotary embedding reads position ids, what its attention does with ties), and a family the registry does
not list, or a transformers release that changes one it does, is otherwise only assumed to be exact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import Problem
from runner.writes import atomic_write_text

CHECK_VERSION = 1
"""Bumped when the check's method changes: cached verdicts of another version are not reused."""
DOC_LENGTHS = (37, 80, 11, 23)
"""Documents of different lengths: a short one right after the longest (the most of it would be another
document's tokens if attention leaked), and a long one past the shrunk windows (runner.gate.shrink)."""
PAD_SEGMENTS = 1
BLOCK_EXTRA = 9
"""Padding after the documents: one full segment and a short one, cut as the run cuts it
(runner.train.blocks.PAD_SEGMENT); the block's length (288) a multiple of 8 as GPU runs need."""
SEED = 0

# Tolerances, per compute dtype, on three measures: the largest difference of one target token's cross-entropy
# (nats) between the packed block and its document alone; the relative difference of the loss sums; the largest
# gradient difference of a parameter relative to that parameter's largest gradient.
#
# float32: the packed and the single forward compute the same sums in another order and tiling; each rounding is
# 2^-24 relative, and a 2-layer model of width 64 over a few hundred tokens stays within 1e-6 nats per token and
# 1e-5 on gradients (measured over the registry families on CPU: at most 3e-6 nats, 1e-5 on gradients). A document
# that sees another one with these weights (init std 0.2: sharp attention) moves some of its tokens by nats: the
# leaks measured here (qwen2_5_vl before its 4-row positions, doge past its key window, biogpt, bart, opt and the
# planted ones) by 1.7 to 5.5 nats, with gradients off by 100% or more. 1e-4 / 1e-5 / 1e-3 leave orders of
# magnitude on either side.
#
# bfloat16: every matmul output and every attention output is rounded to 8 significant bits (2^-9 relative), and
# the kernels tile a packed row differently from a single document, so the two sides round differently: logits of
# a few units differ by a few 1e-2: measured on CPU in bf16 (sdpa, eager), per-token cross-entropies within 0.03
# nats, sums within 1e-4, gradients within 2e-2 (benchmarks/packcheck_gpu.py measures the GPU kernels). 0.25 nats
# leaves room for kernels that round more and stays well under the leaks above (1.7 nats and up; qwen2_5_vl's
# leak measured 5.3 nats in bf16 too). The sum and gradient bounds are as generous, for the same reason. The per-token test decides; the sums and gradients
# catch a leak that only backward has.
TOLERANCES = {
    "float32": {"ce_nats": 1e-4, "loss_rel": 1e-5, "grad_rel": 1e-3},
    "bfloat16": {"ce_nats": 0.25, "loss_rel": 2e-2, "grad_rel": 0.25},
}
PARAM_BUDGET = 60_000_000
"""The most parameters a shrunk copy may have when a family refuses the small widths and only layers and
vocabulary shrink (seconds on a GPU, about ten on a CPU core)."""
EXACT, MISMATCH, FAILED, UNCHECKED = "exact", "mismatch", "failed", "unchecked"
FLEX_SHAPES = "eager"
"""How the check runs flex attention. "static": compiled as transformers compiles it, specialised to each new
length (the packed block and each document alone); "dynamic": compiled once for every length (dynamo's
assume_static_by_default off while the check runs); "eager": flex's reference implementation, the same mask_mod,
block mask and positions evaluated densely, no compiled kernel. In a new process with a cold compile cache
on an H100 the compiled checks took several times the eager one, all exact (the first compile in a process is the
cost, not the recompiles: benchmarks/packcheck-h200.md, its last table); eager is the default: what
keeps documents apart (masks, positions) is the same in both, and the fused kernel's agreement with the reference
is PyTorch's own test. What eager cannot see is a block the compiled kernel skips or keeps wrongly by its sparse
block map."""


@dataclass
class Verdict:
    """What the check found for one model type, config, attention path and engine."""

    status: str
    """exact | mismatch | failed (the shrunk copy fails where the run would) | unchecked (no copy could be built)."""
    model_type: str
    known: bool
    """The family registry lists this model_type."""
    path: str
    engine: str
    loss_impl: str
    device: str
    dtype: str
    kernel: str = ""
    ce_nats: float | None = None
    loss_rel: float | None = None
    grad_rel: float | None = None
    tolerance: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""
    shrunk: str = ""
    """How the copy was made ("2 layers, width 64", or why it was not)."""
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for the Plan and the run's report."""
        where = f"{self.model_type} on {self.path}" + (f" ({self.kernel})" if self.kernel else "") + \
            f", {self.engine} engine, {self.dtype} on {self.device}"
        if self.status == EXACT:
            return (f"packing check: exact for {where} (per-token loss within {_g(self.ce_nats)} nats, "
                    f"gradients within {_g(self.grad_rel)}; {self.seconds:.1f} s{', cached' if self.cached else ''})")
        return f"packing check: {self.status} for {where}: {self.message}"


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


# ---------------------------------------------------------------------------------------------
# The cache


def cache_path() -> Path:
    """The verdict cache: packcheck.json in the runner's cache folder (runner.machine.cache_dir)."""
    from runner.machine import cache_dir

    return cache_dir() / "packcheck.json"


def _source_digest() -> str:
    """The code the check exercises (attention paths, masks, blocks, losses, this check): a change to it is a new
    verdict, as a package upgrade is."""
    import runner.gate.shrink as shrink
    import runner.train.attention as attention
    import runner.train.blocks as blocks
    import runner.train.loss as loss
    import runner.train.masks as masks

    h = hashlib.sha256()
    for mod in (attention, masks, blocks, loss, shrink):
        h.update(Path(mod.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def _versions() -> dict[str, str | None]:
    from runner.versions import package_versions

    return package_versions(("torch", "transformers", "trl", "peft", "flash-attn", "flash-attn-4",
                             "flash-linear-attention", "causal-conv1d", "kernels"))


def cache_key(config: Any, path: str, kernel: str, engine: str, loss_impl: str, device: str, dtype: str,
              seq_len: int, quantized: bool = False) -> str:
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    for k in ("_name_or_path", "transformers_version", "_commit_hash", "architectures"):
        cfg.pop(k, None)
    # The window regime the check puts documents in depends on seq_len (runner.gate.shrink): which side of each
    # window the run's blocks fall on is part of the key, not seq_len itself.
    windows = _window_regime(config, seq_len)
    data = {"v": CHECK_VERSION, "config": cfg, "path": path, "kernel": kernel, "engine": engine, "loss": loss_impl,
            "device": _device_name(device), "dtype": dtype, "windows": windows, "versions": _versions(),
            "code": _source_digest(), **({"quantized": "nf4"} if quantized else {})}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _window_regime(config: Any, seq_len: int) -> list[bool]:
    from runner.facts.families import text_config
    from runner.gate.shrink import POSITION_SCALE_KEYS, WINDOW_KEYS, crossed

    text = text_config(config)
    return [crossed(k, w, seq_len) for k in WINDOW_KEYS + POSITION_SCALE_KEYS
            if isinstance(w := getattr(text, k, None), int) and w > 0]


def _device_name(device: str) -> str:
    if device != "cuda":
        return device
    import torch

    return torch.cuda.get_device_name(0)


def _read_cache() -> dict[str, Any]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, verdict: Verdict) -> None:
    path = cache_path()
    data = _read_cache()
    data[key] = {k: v for k, v in verdict.to_dict().items() if k != "cached"}
    try:
        atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:  # a read-only home: the check still ran, it is only not remembered
        pass


# ---------------------------------------------------------------------------------------------
# The check


@dataclass(frozen=True)
class Setup:
    """What the run does that the check repeats."""

    engine: str
    path: str
    kernel: str
    loss_impl: str
    device: str
    dtype: str
    seq_len: int
    trust_remote_code: bool = False
    loader: str = "auto"
    quantized: bool = False
    """method.kind=qlora: the copy's Linear weights are frozen in NF4 (runner.train.qlora) as the run's are."""


def documents(vocab: int) -> list[tuple[list[int], list[bool]]]:
    """The check's documents: random ids (not 0-2, the special ids of the shrunk configs), a prompt third that is
    not trained."""
    import torch

    g = torch.Generator().manual_seed(1)
    out = []
    for n in DOC_LENGTHS:
        prompt = n // 3
        out.append((torch.randint(3, vocab, (n,), generator=g).tolist(), [False] * prompt + [True] * (n - prompt)))
    return out


def _block_length() -> int:
    from runner.train.blocks import PAD_SEGMENT

    return sum(DOC_LENGTHS) + PAD_SEGMENTS * PAD_SEGMENT + BLOCK_EXTRA


def run_check(config: Any, setup: Setup, model_cls: Any = None) -> Verdict:
    """Build the shrunk copy and compare packed with one by one (uncached).

    A copy whose own forward fails on one document alone is ours to have broken (a width the family does not
    take): the next, less shrunk copy is tried. One that runs a document alone but fails on the packed block fails
    as the run would, after launch: that is the verdict `failed`.
    """
    from runner.facts.families import family_of, model_type_of

    fam = family_of(config)
    verdict = Verdict(UNCHECKED, model_type_of(config) or str(getattr(config, "model_type", "")), fam.known,
                      setup.path, setup.engine, setup.loss_impl, setup.device, setup.dtype, setup.kernel,
                      tolerance=dict(TOLERANCES[setup.dtype]))
    start = time.perf_counter()
    errors: list[str] = []
    with _flex_regime(setup.path):
        return _first_copy_verdict(config, setup, model_cls, verdict, start, errors)


def _flex_regime(path: str) -> Any:
    """The compile regime of the check's flex attention (FLEX_SHAPES); nothing for other paths."""
    if path != "flex_attention" or FLEX_SHAPES == "static":
        return contextlib.nullcontext()
    import torch

    if FLEX_SHAPES == "eager":
        return torch.compiler.set_stance("force_eager")
    return torch._dynamo.config.patch(assume_static_by_default=False)


def _first_copy_verdict(config: Any, setup: Setup, model_cls: Any, verdict: Verdict, start: float,
                        errors: list[str]) -> Verdict:
    """The verdict on the first shrunk copy whose forward runs a document alone (run_check)."""
    for model, how in shrunk_copies(config, setup, model_cls, errors):
        try:  # with gradients on, as every forward of the check: a compiled flex recompiles when grad mode changes
            _single_loss(model, documents(_vocab(model))[0], setup.device)
        except Exception as e:  # noqa: BLE001 - see above: try the next copy
            errors.append(f"{how}: {_short(e)}")
            continue
        verdict.shrunk = how
        try:
            measured = compare(model, setup)
        except LeftOut as e:
            verdict.status, verdict.message = MISMATCH, str(e)
        except Exception as e:  # noqa: BLE001 - what fails here fails the same way in the run, after launch
            verdict.status, verdict.message = FAILED, _short(e)
        else:
            _judge(verdict, measured)
        verdict.seconds = time.perf_counter() - start
        return verdict
    verdict.message = "no shrunk copy could be built: " + "; ".join(errors)
    verdict.seconds = time.perf_counter() - start
    return verdict


def _judge(verdict: Verdict, measured: tuple[float, float, float]) -> None:
    verdict.ce_nats, verdict.loss_rel, verdict.grad_rel = measured
    tol = verdict.tolerance
    over = [f"{name} {_g(value)} > {_g(tol[name])}" for name, value in zip(("ce_nats", "loss_rel", "grad_rel"),
                                                                             measured) if not value <= tol[name]]
    verdict.status = MISMATCH if over else EXACT
    verdict.message = ("packed documents differ from the same documents one by one (" + ", ".join(over) + ")") \
        if over else "packed equals one by one"


class LeftOut(ValueError):
    """The packed loss and the model's own forward train different parameters (a loss that skips part of the
    output head)."""


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def _vocab(model: Any) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def shrunk_copies(config: Any, setup: Setup, model_cls: Any, errors: list[str]) -> Any:
    """Shrunk copies of the model, most shrunk first (small widths; then widths kept, within PARAM_BUDGET), each
    on the launch device, in the run's dtype, documents kept apart as the engines keep them; with how it was
    shrunk. What refuses to build is appended to `errors`."""
    import torch

    from runner.decide.rules import FA4_KERNEL
    from runner.gate.shrink import shrunk_config
    from runner.train.attention import keep_documents_apart, register_varlen
    from runner.train.model import DTYPES, disable_cache, expose_backbone

    if setup.path == "varlen":
        register_varlen(setup.kernel or None)
    cls = model_cls or _auto_class(config, setup)
    dtype = DTYPES[setup.dtype]
    for widths in (True, False):
        how = "small widths" if widths else "widths kept"
        try:
            # flash-attn-4's code differs by head size (and is wrong below FA4_MIN_HEAD_DIM): checked at the run's.
            small = shrunk_config(config, setup.seq_len, max(DOC_LENGTHS), widths=widths,
                                  keep_head_dim=setup.kernel == FA4_KERNEL)
            if not widths:  # the widths kept: counted on the meta device before anything is allocated
                with torch.device("meta"):
                    params = sum(p.numel() for p in _construct(cls, small, setup).parameters())
                if params > PARAM_BUDGET:
                    errors.append(f"{how}: {params / 1e6:.0f}M parameters")
                    continue
            torch.manual_seed(SEED)
            with torch.device(setup.device) if setup.device == "cuda" else contextlib.nullcontext():
                model = _construct(cls, small, setup, attn_implementation=setup.path, dtype=dtype)
        except Exception as e:  # noqa: BLE001 - the family's own checks refuse these widths: try the next
            errors.append(f"{how}: {_short(e)}")
            continue
        params = sum(p.numel() for p in model.parameters())
        disable_cache(model)
        expose_backbone(model)
        model.eval()  # no dropout, no router jitter: the two sides must see the same function
        keep_documents_apart(model, True, dtype)
        if setup.quantized:
            how += ", Linear weights in NF4"
            _quantize(model, setup.dtype)
        yield model, f"{_layers(small)} layers, {how}, {params / 1e6:.1f}M parameters"


def _quantize(model: Any, dtype: str) -> None:
    """Freeze every Linear but the output head and store it in NF4, as a QLoRA run's base (its adapters aside):
    the gradients compared are then the embeddings' and norms', behind the dequantized matmuls."""
    from torch import nn

    from runner.train.qlora import quantize_base

    head = model.get_output_embeddings()
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not head:
            module.weight.requires_grad_(False)
    quantize_base(model, 1, dtype)


def _construct(cls: Any, config: Any, setup: Setup, **kwargs: Any) -> Any:
    """An Auto class's from_config, or a model class's own _from_config (tests plant models this way)."""
    if hasattr(cls, "from_config"):
        return cls.from_config(config, trust_remote_code=setup.trust_remote_code, **kwargs)
    return cls._from_config(config, **kwargs)


def _layers(config: Any) -> Any:
    from runner.facts.families import text_config

    return getattr(text_config(config), "num_hidden_layers", "?")


def _auto_class(config: Any, setup: Setup) -> Any:
    from runner.imports import from_transformers
    from runner.decide.loader import is_vlm_config

    causal, vlm = from_transformers("AutoModelForCausalLM", "AutoModelForImageTextToText")
    if setup.loader == "image_text_to_text" or (setup.loader == "auto" and is_vlm_config(config)):
        return vlm
    return causal


def _token_ces(logits: Any, labels: Any) -> Any:
    """Cross-entropy of each target token (float32), in order: the prediction at t scores the label at t+1."""
    import torch.nn.functional as F

    from runner.train.blocks import IGNORE

    logits, labels = logits.reshape(-1, logits.size(-1))[:-1].float(), labels.reshape(-1)[1:]
    keep = labels != IGNORE
    return F.cross_entropy(logits[keep], labels[keep], reduction="none")


def _packed_side(model: Any, block: Any, setup: Setup) -> tuple[Any, Any]:
    """(loss sum with gradients, per-token cross-entropies) of the packed block, as the run's engine feeds it."""
    from runner.train.data import collate, to_device
    from runner.train.loss import LOSS_FUNCTIONS, full_loss_sum, packing_kwargs

    from runner.engines import engine_for

    if engine_for(setup.engine).boundaries_from_collator:  # the engine's batches come from TRL's collator
        from runner.train.trl_data import COUNTING_KEYS, CountingCollator, block_row

        batch = to_device(CountingCollator(0)([block_row(block)]), setup.device)
        for k in COUNTING_KEYS:
            batch.pop(k, None)
        labels = batch.pop("labels")
        logits = model(**batch, use_cache=False).logits
        ces = _token_ces(logits, labels)
        return ces.sum(), ces.detach()
    batch = to_device(collate([block]), setup.device)
    fn = LOSS_FUNCTIONS.get(setup.loss_impl, full_loss_sum)
    loss = fn(model, batch)
    logits = model(input_ids=batch["input_ids"], use_cache=False, **packing_kwargs(batch)).logits
    return loss, _token_ces(logits, batch["labels"]).detach()


def _single_loss(model: Any, doc: tuple[list[int], list[bool]], device: str) -> Any:
    """Per-token cross-entropies of one document alone, through the model's own forward (no packing inputs)."""
    from runner.train.blocks import make_block

    ids, mask = doc
    alone = make_block(ids, mask, [0], len(ids), 0)
    logits = model(input_ids=alone.input_ids[None].to(device), use_cache=False).logits
    return _token_ces(logits, alone.labels.to(device))


def _grads(model: Any) -> dict[str, Any]:
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(model: Any, setup: Setup) -> tuple[float, float, float]:
    """(largest per-token cross-entropy difference in nats, relative loss-sum difference, largest relative gradient
    difference) between the packed block and its documents one by one through the model's own forward."""
    import torch

    from runner.train.blocks import make_block

    vocab = model.get_input_embeddings().weight.shape[0]
    docs = documents(vocab)
    starts = [sum(DOC_LENGTHS[:i]) for i in range(len(docs))]
    block = make_block([t for d, _ in docs for t in d], [m for _, ms in docs for m in ms], starts,
                       _block_length(), 0)
    model.zero_grad(set_to_none=True)
    loss_p, ces_p = _packed_side(model, block, setup)
    loss_p.backward()
    grads_p = _grads(model)
    model.zero_grad(set_to_none=True)
    singles, loss_s = [], 0.0
    for doc in docs:
        ces = _single_loss(model, doc, setup.device)
        ces.sum().backward()
        singles.append(ces.detach())
        loss_s += float(ces.detach().sum())
    grads_s = _grads(model)
    model.zero_grad(set_to_none=True)
    ces_s = torch.cat(singles)
    if ces_s.shape != ces_p.shape:
        raise ValueError(f"the packed block scored {ces_p.numel()} target tokens, the documents alone {ces_s.numel()}")
    token = float((ces_p - ces_s).abs().max())
    loss_rel = abs(float(loss_p.detach()) - loss_s) / max(abs(loss_s), 1e-30)
    if grads_p.keys() != grads_s.keys():
        missing = sorted(set(grads_s) ^ set(grads_p))[:3]
        raise LeftOut(f"the packed loss ({setup.loss_impl}) and the model's own forward train different parameters "
                      f"({', '.join(missing)}): its output head is more than lm_head")
    grad = max((float((grads_p[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for n, g in grads_s.items()
                if float(g.abs().max()) > 0), default=0.0)
    if not all(math.isfinite(x) for x in (token, loss_rel, grad)):
        raise ValueError(f"non-finite losses or gradients in the shrunk copy (token {token}, loss {loss_rel})")
    return token, loss_rel, grad


# ---------------------------------------------------------------------------------------------
# What preflight asks


def setup_for(spec: Any, config: Any, device: str, path: str | None = None) -> Setup | None:
    """The run's path, kernel, loss and dtype (None when the attention choice itself is refused: preflight says
    why elsewhere)."""
    from runner.decide.rules import choose_loss
    from runner.train.attention import attention_for

    choice, refusal = attention_for(spec, config, device)
    if refusal is not None:
        return None
    try:
        loss_impl = choose_loss(spec.engine, spec.train.loss_impl, config)[0]
    except ValueError:
        return None
    # The run's compute dtype: bf16 on GPU (FSDP's mixed precision, or bf16 weights, or TRL's autocast), the weights'
    # dtype on CPU.
    dtype = "bfloat16" if device == "cuda" or spec.model.dtype == "bfloat16" else "float32"
    return Setup(spec.engine, path or choice.impl, choice.kernel if (path or choice.impl) == "varlen" else "",
                 loss_impl, device, dtype, spec.train.seq_len, spec.model.trust_remote_code, spec.model.loader,
                 spec.method.kind == "qlora")


def checked(config: Any, setup: Setup, use_cache: bool = True) -> Verdict:
    """The verdict for this setup: from the cache when this model, config, path and versions were checked before."""
    key = cache_key(config, setup.path, setup.kernel, setup.engine, setup.loss_impl, setup.device, setup.dtype,
                    setup.seq_len, setup.quantized)
    if use_cache:
        hit = _read_cache().get(key)
        if isinstance(hit, dict):
            with contextlib.suppress(TypeError):
                return Verdict(**{**hit, "cached": True})
    verdict = run_check(config, setup)
    if verdict.status != UNCHECKED:
        _write_cache(key, verdict)
    return verdict


def passing_paths(spec: Any, config: Any, device: str, setup: Setup) -> list[str]:
    """Other attention paths this model may take here that pass the check (what a refusal proposes)."""
    from runner.decide.rules import attention_refusal
    from runner.train.attention import available_kernels, concrete_model_class, supported_attention

    kernels = available_kernels(device)
    supported = supported_attention(concrete_model_class(_auto_class(config, setup), config), True)
    out = []
    for path in ("varlen", "flash_attention_2", "flex_attention", "sdpa", "eager"):
        if path == setup.path or attention_refusal(path, device, config, supported, kernels) is not None:
            continue
        other = Setup(**{**asdict(setup), "path": path, "kernel": setup.kernel if path == "varlen" else ""})
        if checked(config, other).status == EXACT:
            out.append(path)
    return out


def packing_verdict(spec: Any, config: Any, device: str) -> Verdict | None:
    """The check's verdict for this run (None without packing, or when the attention choice is refused)."""
    if not spec.train.packing:
        return None
    setup = setup_for(spec, config, device)
    return None if setup is None else checked(config, setup)


def check_problems(spec: Any, config: Any, device: str) -> list[Problem]:
    """Refuse the run when packed documents do not match them one by one, or the copy fails where the run would."""
    verdict = packing_verdict(spec, config, device)
    if verdict is None or verdict.status == EXACT or (verdict.status == UNCHECKED and verdict.known):
        # A registry family the check could not shrink is still proven by the family matrix in CI.
        return []
    fam = f"{verdict.model_type} ({'a registry family' if verdict.known else 'not in the family registry'})"
    where = f"the {verdict.path} attention path" + (f" ({verdict.kernel})" if verdict.kernel else "") + \
        f" of the {verdict.engine} engine"
    setup = setup_for(spec, config, device)
    if verdict.status == FAILED:
        return [Problem("train.packing", f"packing check: a shrunk copy of {fam} fails on {where} as the run "
                                         f"would after launch: {verdict.message}",
                        "use the other engine, train.loss_impl=full, or train.packing=false")]
    alternatives = passing_paths(spec, config, device, setup) if setup is not None else []
    fix = (f"use model.attn_implementation={alternatives[0]} (it passes the same check)"
           f"{' or ' + ', '.join(alternatives[1:]) if alternatives[1:] else ''}, or set train.packing=false"
           if alternatives else "set train.packing=false (one document per block)")
    if verdict.status == UNCHECKED:
        return [Problem("train.packing", f"packing check: {fam} is not proven to keep packed documents apart on "
                                         f"{where}: {verdict.message}", fix)]
    return [Problem("train.packing", f"packing check: in a shrunk copy of {fam} on {where}, {verdict.message}: "
                                     "documents would leak into each other", fix)]
