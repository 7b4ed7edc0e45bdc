"""RunSpec: the one description of a run, loaded from a recipe or file, overridden with --set, validated all at once."""

from __future__ import annotations

import difflib
import json
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from runner.data.formats import COLUMN_KEYS, FORMATS, TARGET_ROLES, TRAIN_ON
from runner.engines import ENGINES, lever_problems, save_problems, saved_as
from runner.machine import Machine, hardware_problems, ranks_per_node, run_device
from runner.naming import (  # noqa: F401 - recipe files are found by name: re-exported for the spec's callers
    EMBEDDED_PREFIX, RECIPES_DIR, find_spec_file, follow_paths, follow_run, load_yaml, overridden_fields,
    overridden_sections, read_spec_file, recipe_names, resolve_embedded, revision_problems)
from runner.precision import optimizer_precision, precision_problems, weights_dtype
from runner.errors import Problem, SpecError, range_text, shown

# The values of these fields are their registries' names (runner.data.formats, runner.engines): a new format or
# engine is one row there, never a second list here.
FormatName = Literal[("auto", *FORMATS)]  # type: ignore[valid-type]
ColumnKey = Literal[COLUMN_KEYS]  # type: ignore[valid-type]
ChatRole = Literal[TARGET_ROLES]  # type: ignore[valid-type]
TrainOn = Literal[TRAIN_ON]  # type: ignore[valid-type]
EngineName = Literal[tuple(ENGINES)]  # type: ignore[valid-type]


class _Section(BaseModel):
    # Field docstrings become descriptions (shown by `runner fields` and the wizard);
    # unknown keys are errors, not silently ignored settings.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class ModelSpec(_Section):
    id: str = "sft-tui/tiny-qwen3"
    """Hub id of the model (or its name when `path` is set)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit SHA); resolved to a commit SHA in the record. None = main."""
    path: str | None = "embedded:model"
    """Local directory to load instead of the hub; the id is kept as the model's name. `embedded:` = shipped assets."""
    trust_remote_code: bool = False
    """Allow the model repo's own Python code to run. Off unless you trust the repo."""
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """Weight dtype: auto = bfloat16 on GPU, float32 on CPU (CPU runs are exact and reproducible)."""
    attn_implementation: Literal["auto", "varlen", "flex_attention", "sdpa", "eager", "flash_attention_2"] = "auto"
    """Attention backend; auto picks one that keeps packed documents apart (recorded in the run)."""
    varlen_kernel: Literal["auto", "torch", "flash-attn-4"] = "auto"
    """Kernel behind varlen attention: auto = flash-attn-4 where it is installed for the GPU (SM 9.x/10.x) and takes
    the model's head size, else PyTorch's varlen_attn (FlashAttention-2); recorded in the run."""
    loader: Literal["auto", "causal_lm", "image_text_to_text"] = "auto"
    """auto = AutoModelForCausalLM, or the language tower of a VLM-style checkpoint."""
    init: Literal["pretrained", "random"] = "pretrained"
    """pretrained = load the checkpoint's weights; random = initialise from config.json with train.seed (a directory
    that holds only config.json + tokenizer, for reduced architectures and benchmarks)."""


class DatasetSpec(_Section):
    id: str | None = "sft-tui/tiny-chat"
    """Hub dataset id (or its name when `path` is set)."""
    revision: str | None = None
    """Hub revision; resolved to a commit SHA in the record. None = main."""
    path: str | None = "embedded:data/chat.jsonl"
    """Local JSON/JSONL/parquet file or directory; wins over the id. `embedded:` = shipped assets."""
    split: str = "train"
    """Split to train on."""
    messages_field: str = "messages"
    """Column holding the conversation (same as columns.messages, which wins when both are set)."""
    format: FormatName = "auto"
    """Row format: messages ({role, content} lists), sharegpt ({from, value} lists, human/gpt/function_call/
    observation), alpaca (instruction/input/output), prompt_completion (TRL's prompt + completion, strings or
    message lists; loss on the completion), text (loss on every token); auto = detected from the rows."""
    columns: dict[ColumnKey, str] = Field(default_factory=dict)
    """Which dataset column (or message key: role, content) holds each part, where it differs from the format's
    usual name, e.g. {messages: conversations, role: from, content: value, tools: functions}."""
    roles: dict[str, ChatRole] = Field(default_factory=dict)
    """Role names of the dataset mapped to chat roles, added to the usual ones (human/gpt/observation/...),
    e.g. {bot: assistant, customer: user}."""
    train_on: TrainOn = "assistant"
    """Which turns carry the loss: assistant replies, or also the assistant's function/tool calls."""
    eval_split: str | None = None
    """Split to evaluate on (hub dataset or a directory with splits); None = no named eval split."""
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """Share of the training rows held out for evaluation and never trained on (0 = none). A row is held out by
    a hash of its content with train.seed: the same rows whatever the world size, on resume and on replay."""


class LoraSpec(_Section):
    r: int = Field(16, gt=0)
    """LoRA rank."""
    alpha: int = Field(32, gt=0)
    """LoRA alpha (scale = alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA input."""
    target_modules: str | list[str] = "all-linear"
    """Modules to adapt: 'all-linear' or a list of module-name suffixes."""
    target_parameters: list[str] = Field(default_factory=list)
    """Parameter tensors to adapt directly (MoE experts), e.g. mlp.experts.gate_up_proj."""
    rank_pattern: dict[str, int] = Field(default_factory=dict)
    """Per-target rank overrides, e.g. {mlp.experts.down_proj: 8}."""


class MethodSpec(_Section):
    kind: Literal["full", "lora", "qlora"] = "full"
    """full = every weight trains; lora = low-rank adapters on a frozen base; qlora = the same adapters on a base
    whose frozen Linear weights are stored in 4-bit NF4 (block 64, double-quantized scales) and dequantized to
    bf16 for compute."""
    lora: LoraSpec = Field(default_factory=LoraSpec)
    """LoRA settings (used when kind is lora or qlora)."""

    @property
    def adapters(self) -> bool:
        """Whether low-rank adapters train on a frozen base (lora and qlora)."""
        return self.kind in ("lora", "qlora")


class HardwareSpec(_Section):
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """auto = cuda when a GPU is visible, else cpu (gloo)."""
    gpu: str = "auto"
    """GPU type for planning (H100-80GB, H200, B300, ...); auto = detect through NVML."""
    nproc_per_node: int | Literal["auto"] = "auto"
    """Ranks per node; auto = visible GPUs, or 2 CPU ranks without a GPU."""
    nodes: int = Field(1, ge=1)
    """Number of nodes (torchrun c10d rendezvous across them)."""
    rdzv_endpoint: str = "localhost:29500"
    """host:port of the rendezvous (first node) for multi-node runs."""
    sample_interval_s: float = Field(2.0, gt=0)
    """Seconds between GPU/CPU samples written by each node's sampler."""
    headroom_gib: float | None = Field(None, ge=0)
    """Memory per GPU (or CPU rank) the planner leaves free when it picks the speed levers; None = 5% of it."""
    memory_gib: float | None = Field(None, gt=0)
    """Memory per GPU (or CPU rank) the run may use, to share a device or see what fits a smaller one; None = all.
    The planner plans for it and each rank holds to it (CUDA: torch's allocator; CPU: the rank's data memory)."""
    host_memory_gib: float | None = Field(None, gt=0)
    """Host memory of each node, for planning activation offload; None = what the OS reports there (a VM whose
    memory grows as it is used reports too little at first)."""
    sequence_parallel: int = Field(1, ge=1)
    """Ranks that split each block's tokens (Ulysses): attention exchanges heads for sequence so each rank attends
    over the whole block for 1/N of its heads; FSDP2 shards over all ranks; 1 = off. Native engine only."""


class TrainSpec(_Section):
    seq_len: int = Field(512, gt=0)
    """Tokens per packed block."""
    micro_batch: PositiveInt | Literal["auto"] = "auto"
    """Packed blocks per rank per forward; auto = 1, or the planner's split of train.global_batch_tokens."""
    grad_accum: PositiveInt | Literal["auto"] = "auto"
    """Micro-batches per optimizer step; auto = 1, or what train.global_batch_tokens leaves after micro_batch."""
    global_batch_tokens: PositiveInt | None = None
    """Tokens per optimizer step over all ranks (seq_len × micro_batch × grad_accum × ranks); set, it fixes the
    product and the planner splits it between micro_batch and grad_accum (the fastest split that fits)."""
    lr: float = Field(1e-3, gt=0)
    """Peak learning rate."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """LR schedule after warmup."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup steps."""
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    """Warmup as a share of all steps, used when warmup_steps is 0 (the 120B recipe uses 0.03)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this (0 = no clipping)."""
    max_steps: int | None = Field(None, gt=0)
    """Stop after this many optimizer steps; None = run `epochs` passes over the data."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the data when max_steps is None."""
    seed: int = 0
    """Seed for init, data order and dropout."""
    activation_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute decoder layers in backward (non-reentrant) to save activation memory. auto, like every speed lever
    (runner.engines): the planner's choice, the fastest setting predicted to fit (`runner estimate` shows it)."""
    recompute_layers: Annotated[int, Field(ge=0)] | Literal["auto"] | None = "auto"
    """With activation_checkpointing, how many decoder layers (the first ones) recompute in backward; the others
    keep their activations: faster, more memory (`runner estimate` shows how much). None = all (native engine)."""
    recompute_attention: bool | Literal["auto"] = "auto"
    """With activation_checkpointing, recomputed layers run attention again in backward; false keeps each recomputed
    layer's attention output (tokens × heads × head_dim × 2 bytes, and its log-sum-exp) from forward instead (native
    engine, varlen attention): faster where attention is a large part of the step (long documents), for memory."""
    offload_activations: bool | Literal["auto"] = "auto"
    """With activation_checkpointing, the input each recomputing layer keeps from forward to backward waits in
    pinned host memory (as many as the node's host holds) instead of on the GPU (native engine, GPU only): longer
    blocks fit, at the cost of host RAM and one copy each way per layer, overlapped with compute in forward."""
    tiled_mlp: bool | Literal["auto"] = "auto"
    """Run each layer's MLP over the block in tiles of hidden-size tokens, each recomputed in backward, and recompute
    its RMSNorms there: exact, its intermediates a tile's, at one more MLP forward (native engine, eager layers).
    auto = on on a GPU when they bound the block length (runner.facts.tiling)."""
    log_every: int = Field(1, gt=0)
    """Write a step event every N steps."""
    optimizer_precision: Literal["auto", "fp32_master", "bf16_stochastic", "bf16"] = "auto"
    """How weights and AdamW states are held (native engine): fp32_master = fp32 weights and states, bf16 compute
    (16 B per parameter); bf16_stochastic = bf16 weights, gradients and states (8 B per parameter), the update
    computed in fp32 and stochastically rounded back, so updates below bf16's resolution survive in expectation;
    bf16 = the same bytes rounded to nearest, which rounds away most updates at SFT learning rates (the 27B
    notebook's policy, for experts). auto = fp32_master when model.dtype is float32, bf16_stochastic when it is
    bfloat16. The TRL engine always keeps fp32 master weights."""
    deterministic: bool = True
    """Ask PyTorch for deterministic kernels (bit-exact replays; CPU runs always are)."""
    loss_impl: Literal["auto", "full", "chunked", "fused"] = "auto"
    """Cross-entropy: full = one fp32 logits tensor; chunked = over token chunks, no full logits, recomputed in
    backward; fused = chunks whose gradients are made in forward (no recompute, one lm_head-sized gradient held
    through the forward); auto = the planner's choice between chunked and fused (full when the model transforms
    its logits)."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile each decoder layer (GPU only). With activation_checkpointing the checkpoint sits inside the
    compiled layer, so backward recomputes only what it reads (not the MLP's output projection)."""
    packing: bool = True
    """Pack documents into exact seq_len blocks (both engines; TRL through padding-free); false: one document per
    block, padded."""
    packing_strategy: Literal["bfd", "wrapped"] = "bfd"
    """bfd = best-fit decreasing within a bounded buffer: conversations stay whole (one longer than seq_len is
    split into seq_len pieces); wrapped = concatenate and cut every seq_len tokens, a conversation cut at a block
    end continues in the next block without its prompt (the 27B notebook's method)."""
    eval_every: int = Field(0, ge=0)
    """Evaluate on the eval set (dataset.eval_split or dataset.eval_fraction) every N steps; it is also
    evaluated at the end. 0 = only at the end."""
    eval_prompts: list[str] | str = Field(default_factory=list)
    """User prompts (a short list, or a text file with one per line) the model answers greedily on rank 0 every
    eval_every steps and at the end: `sample` events, shown live, kept in the record, compared by replay."""
    early_stop_patience: int = Field(0, ge=0)
    """Stop when this many evaluations in a row did not improve the best eval loss (0 = never; needs
    train.eval_every)."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a resumable checkpoint every N steps (0 = never during the run)."""
    data_workers: int = Field(0, ge=0)
    """DataLoader worker processes per rank for tokenising and packing (0 = in the training process)."""
    fsdp_one_rank: bool | Literal["auto"] = "auto"
    """Wrap the model in FSDP2 even when the run has one rank (GPU). Off, one rank trains the plain module: there is
    nothing to shard, and FSDP's per-layer copies and hooks only cost time. The native engine keeps FSDP2 on one rank
    when the weights need its mixed precision (fp32 weights computed in bf16); the TRL engine casts its trainable
    weights to fp32 and computes in bf16 under autocast, as TRL's own one-GPU setup does (with FSDP2 accelerate does
    the same cast). Which is faster depends on the engine and the block length (docs/levers.md); with LoRA, unwrapped
    needs far less memory."""


TrackerName = Literal["tensorboard", "mlflow", "wandb", "trackio"]
TRACKERS = typing.get_args(TrackerName)  # the trackers, named once (runner.events.tracking keys its packages by them)


class ReportSpec(_Section):
    to: list[TrackerName] = Field(default_factory=list)
    """Experiment trackers to log to (from the launcher, never prompting): tensorboard (runs/<id>/tensorboard),
    mlflow (MLFLOW_TRACKING_URI, or a file store in runs/<id>/mlruns), wandb (WANDB_MODE, WANDB_PROJECT as set),
    trackio (local). Each needs its package installed: pip install 'sft-tui[tensorboard]' and so on."""


class OutputSpec(_Section):
    save: Literal["auto", "none", "adapter", "full", "merged"] = "auto"
    """What to export at the end into runs/<id>/export (HF safetensors): auto = the adapter for a LoRA run, the
    full model otherwise; none = nothing (benchmarks); adapter = the LoRA adapter (peft's files); full = the whole
    model; merged = a LoRA run's adapter folded into the base weights, a standalone model that loads without peft."""


class RunSpec(_Section):
    """A whole run: what to train, on what, how, and what to keep."""

    name: str = "run"
    """Short name used in run ids and listings."""
    description: str = ""
    """One line on what this run is for (shown by `runner recipes`)."""
    model: ModelSpec = Field(default_factory=ModelSpec)
    """The model to fine-tune."""
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    """The chat dataset."""
    engine: EngineName = "native"
    """native = plain PyTorch FSDP2 loop; trl = TRL SFTTrainer + accelerate FSDP2."""
    method: MethodSpec = Field(default_factory=MethodSpec)
    """Full fine-tune or LoRA."""
    hardware: HardwareSpec = Field(default_factory=HardwareSpec)
    """Where it runs."""
    train: TrainSpec = Field(default_factory=TrainSpec)
    """Optimisation settings."""
    output: OutputSpec = Field(default_factory=OutputSpec)
    """What to export."""
    report: ReportSpec = Field(default_factory=ReportSpec)
    """Where else the run's curves go (experiment trackers)."""

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def world_size(self) -> int:
        return int(self.hardware.nproc_per_node) * self.hardware.nodes


# ---------------------------------------------------------------------------------------------
# Loading, overrides and validation


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _section_type(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    ann = model.model_fields[name].annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b=value` to a raw spec dict; the value is parsed as YAML and typed later by the schema."""
    if "=" not in assignment:
        raise SpecError(f"--set expects field=value, got '{assignment}'",
                        [Problem("--set", f"'{assignment}' has no '='", "write it as train.lr=1e-4")])
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    model: type[BaseModel] | None = RunSpec
    node = data
    for i, part in enumerate(parts):
        assert model is not None
        if part not in model.model_fields:
            path = ".".join(parts[: i + 1])
            close = difflib.get_close_matches(part, _field_names(model), n=1)
            prefix = ".".join(parts[:i] + [close[0]]) if close else None
            fix = f"did you mean '{prefix}'?" if prefix else f"fields here: {', '.join(_field_names(model))}"
            raise SpecError("bad --set", [Problem(path, "no such field", fix)])
        if i == len(parts) - 1:
            node[part] = _parse_value(raw)
        else:
            sub = _section_type(model, part)
            if sub is None:
                raise SpecError("bad --set", [Problem(".".join(parts[: i + 2]), f"'{part}' has no sub-fields",
                                                      f"set '{'.'.join(parts[: i + 1])}' itself")])
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SpecError("bad --set", [Problem(".".join(parts[: i + 1]), "is not a mapping in the spec file",
                                                      "fix the spec file")])
            model = sub


def _parse_value(raw: str) -> Any:
    raw = raw.strip()
    try:
        value = load_yaml(raw) if raw else ""
    except yaml.YAMLError:
        return raw
    # YAML 1.1 reads 1e-5 as a string; keep strings and let the schema coerce them.
    return value


def _problem_from_pydantic(err: dict[str, Any]) -> Problem:
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    got = err.get("input")
    if kind == "extra_forbidden":
        parent = err["loc"][:-1]
        model: type[BaseModel] = RunSpec
        for p in parent:
            sub = _section_type(model, str(p)) if str(p) in model.model_fields else None
            if sub is None:
                break
            model = sub
        close = difflib.get_close_matches(str(err["loc"][-1]), _field_names(model), n=1)
        if close:
            fix = f"did you mean '{'.'.join([*map(str, parent), close[0]])}'?"
        else:
            fix = f"fields here: {', '.join(_field_names(model))}"
        return Problem(loc, "unknown field", fix)
    msg = err["msg"]
    fix = ""
    if kind.startswith(("greater_than", "less_than")):
        fix = f"use a value {range_text(RunSpec, err)}"
    elif kind == "literal_error":
        fix = "choose one of the listed values"
    elif kind.endswith("_type") or kind.endswith("_parsing"):
        fix = "give a value of the right type"
    return Problem(loc, f"{msg}, got {shown(got)}", fix)


def cross_field_problems(spec: RunSpec) -> list[Problem]:
    """Checks that involve more than one field (the schema checks each field alone)."""
    out: list[Problem] = []
    if spec.model.path is None and not spec.model.id:
        out.append(Problem("model.id", "neither model.id nor model.path is set", "set one of them"))
    if spec.dataset.path is None and not spec.dataset.id:
        out.append(Problem("dataset.id", "neither dataset.id nor dataset.path is set", "set one of them"))
    out += hardware_problems(spec)
    out += save_problems(spec)
    out += lever_problems(spec)
    out += eval_problems(spec)
    out += precision_problems(spec)
    out += revision_problems({"model.revision": spec.model.revision, "dataset.revision": spec.dataset.revision})
    for name, value in (("model.path", spec.model.path), ("dataset.path", spec.dataset.path)):
        if value and not value.startswith(EMBEDDED_PREFIX) and not Path(value).expanduser().exists():
            out.append(Problem(name, f"no such file or directory: {value}",
                               "give an existing local path, or unset it to use the hub id"))
    return out


def eval_problems(spec: RunSpec) -> list[Problem]:
    """Evaluation, early stopping and trackers: the fields that only make sense together."""
    out: list[Problem] = []
    d, t = spec.dataset, spec.train
    if d.eval_split and d.eval_fraction:
        out.append(Problem("dataset.eval_fraction", "both an eval split and an eval fraction are set",
                           "use dataset.eval_split or dataset.eval_fraction, not both"))
    if d.eval_split and d.eval_split == d.split:
        out.append(Problem("dataset.eval_split", f"is the training split {d.split!r}: it would evaluate on what "
                           "it trains on", "name another split, or use dataset.eval_fraction"))
    if d.eval_split and d.path and resolve_embedded(d.path).is_file():
        out.append(Problem("dataset.eval_split", "a single data file has no named splits",
                           "use dataset.eval_fraction, or a directory or hub dataset with that split"))
    has_eval = bool(d.eval_split) or d.eval_fraction > 0
    if t.eval_every and not has_eval and not t.eval_prompts:
        out.append(Problem("train.eval_every", "there is no eval set to evaluate",
                           "set dataset.eval_fraction (e.g. 0.05) or dataset.eval_split"))
    if t.early_stop_patience and not (t.eval_every and has_eval):
        out.append(Problem("train.early_stop_patience", "needs evaluations during training",
                           "set train.eval_every and dataset.eval_fraction or dataset.eval_split"))
    if len(set(spec.report.to)) != len(spec.report.to):
        out.append(Problem("report.to", f"lists a tracker twice: {spec.report.to}", "name each tracker once"))
    return out


def _leaf_depth(loc: tuple[Any, ...]) -> int:
    """How many parts of a pydantic error location are field names; the rest name union members (`int`, ...)."""
    model: type[BaseModel] | None = RunSpec
    for i, part in enumerate(loc):
        if model is None or str(part) not in model.model_fields:
            return i
        model = _section_type(model, str(part))
    return len(loc)


def _problems_from_validation(e: ValidationError) -> list[Problem]:
    """One problem per field: a value that fits no member of a union (`int | "auto"`) is one error, not one per
    member, and its path is the field's (`hardware.nproc_per_node`, not `hardware.nproc_per_node.int`)."""
    by_field: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for err in e.errors():
        loc = tuple(err["loc"])
        depth = _leaf_depth(loc)
        key = loc[:depth] if depth and err["type"] != "extra_forbidden" else loc
        by_field.setdefault(key, []).append({**err, "loc": key})
    out = []
    for errs in by_field.values():
        if len(errs) == 1:
            out.append(_problem_from_pydantic(errs[0]))
            continue
        wants = []
        for err in errs:
            want = str(err["msg"]).removeprefix("Input should be ").split(",")[0]
            if want not in wants:
                wants.append(want)
        loc = ".".join(str(p) for p in errs[0]["loc"])
        out.append(Problem(loc, f"should be {' or '.join(wants)}, got {shown(errs[0].get('input'))}",
                           "give a value of one of these kinds"))
    return out


def spec_warnings(spec: RunSpec) -> list[str]:
    """Valid but probably not meant: said before launch, never refused."""
    out = []
    t = spec.train
    if t.max_steps is not None and 0 < t.max_steps < t.warmup_steps:
        out.append(f"train.max_steps={t.max_steps} is shorter than train.warmup_steps={t.warmup_steps}: the learning "
                   f"rate never reaches train.lr (fix: set train.warmup_steps below {t.max_steps}, e.g. {max(1, t.max_steps // 10)})")
    return out


def field_choices(path: str) -> list[Any]:
    """The allowed values of an enum field (a Literal, optionally None too); [] for any other field."""
    model: type[BaseModel] | None = RunSpec
    ann: Any = None
    for part in path.split("."):
        if model is None or part not in model.model_fields:
            return []
        ann = model.model_fields[part].annotation
        model = _section_type(model, part)
    if typing.get_origin(ann) is typing.Literal:
        return list(typing.get_args(ann))
    members = [a for a in typing.get_args(ann) if a is not type(None)]
    if members and all(typing.get_origin(a) is typing.Literal or a is bool for a in members):
        # A speed lever is `bool | "auto"`: auto, or set on or off.
        return [v for a in members for v in ((True, False) if a is bool else typing.get_args(a))]
    return []


def validate(data: dict[str, Any]) -> RunSpec:
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError("invalid spec", _problems_from_validation(e)) from None
    problems = cross_field_problems(spec)
    if problems:
        raise SpecError("invalid spec", problems)
    return spec


_SECTION_TYPES: dict[str, type[BaseModel]] = {"model": ModelSpec, "dataset": DatasetSpec}


def load_spec(spec: str | Path | dict[str, Any], overrides: list[str] | tuple[str, ...] = (),
              notes: list[str] | None = None) -> RunSpec:
    """Recipe name, file path or raw dict → validated RunSpec, with `--set` overrides applied first. An override of
    model.path or dataset.path without one of its id renames the run's model or data after the path
    (follow_paths), and overrides that make it another run than the recipe's rename and redescribe it
    (follow_run); `notes`, when given, receives a line saying so."""
    if isinstance(spec, dict):
        data = json.loads(json.dumps(spec))
    else:
        data = read_spec_file(find_spec_file(str(spec)))
    origin = json.loads(json.dumps(data))
    for assignment in overrides:
        apply_override(data, assignment)
    said = follow_paths(data, overridden_sections(overrides), EMBEDDED_PREFIX,
                        {k: t.model_fields["id"].default for k, t in _SECTION_TYPES.items()})
    said += follow_run(data, origin, RunSpec().to_dict(), overridden_fields(overrides))
    if notes is not None:
        notes += said
    return validate(data)


def model_source(spec: RunSpec) -> tuple[str, str | None]:
    """(what from_pretrained loads, revision): a local path wins over the hub id."""
    if spec.model.path:
        return str(resolve_embedded(spec.model.path)), None
    return spec.model.id, spec.model.revision


def resolve(spec: RunSpec, cuda_available: bool | None = None, gpu_count: int | None = None,
            machine: Machine | None = None) -> RunSpec:
    """Fill the `auto` values that depend on the machine the run will see (runner.machine; here by default, or
    `gpu_count` GPUs when cuda_available), so the record holds what actually ran."""
    if machine is None:
        machine = Machine.here() if cuda_available is None or gpu_count is None else \
            Machine(gpu_count if cuda_available else 0)
    gpu_count = machine.gpus
    device = run_device(spec, machine)
    if device == "cuda" and not gpu_count:
        raise SpecError("invalid spec", [Problem("hardware.device", "cuda was asked for but no GPU is visible",
                                                 "use hardware.device=cpu or run on a GPU machine")])
    nproc = ranks_per_node(spec, device, machine)
    if device == "cuda" and spec.hardware.nodes == 1 and nproc > gpu_count:
        raise SpecError("invalid spec", [Problem("hardware.nproc_per_node",
                                                 f"{nproc} ranks but only {gpu_count} GPUs visible",
                                                 f"use hardware.nproc_per_node={gpu_count} or fewer")])
    problems = hardware_problems(spec, nproc)
    if problems:
        raise SpecError("invalid spec", problems)
    dtype = weights_dtype(spec, device)
    data = spec.to_dict()
    data["hardware"].update(device=device, nproc_per_node=nproc)
    data["model"]["dtype"] = dtype
    data["output"]["save"] = saved_as(spec)
    data["train"]["optimizer_precision"] = optimizer_precision(spec.engine, spec.train.optimizer_precision, dtype)
    return RunSpec.model_validate(data)


def field_docs(model: type[BaseModel] = RunSpec, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted path, description, default) for every leaf field: the reference printed by `runner fields`."""
    out: list[tuple[str, str, Any]] = []
    for name, info in model.model_fields.items():
        sub = _section_type(model, name)
        if sub is not None:
            out += field_docs(sub, f"{prefix}{name}.")
        else:
            default = info.get_default(call_default_factory=True)
            out.append((f"{prefix}{name}", info.description or "", default))
    return out
