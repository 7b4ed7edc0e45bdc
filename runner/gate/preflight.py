"""Preflight: what would make a run fail or train on wrong data, found before any rank starts (all at once).

Checks: the installed libraries are in their supported ranges; every line of a local JSONL file parses; the dataset's format is detected (or the asked one fits) and a
few rows convert; the chat template yields assistant tokens on a sample; train.seq_len suits the attention kernels
and holds a sampled prompt with its first trained token; a pretrained model has weights to load; the model
can keep packed documents apart with the installed kernels, and split its blocks over hardware.sequence_parallel
ranks; LoRA targets exist; nproc fits the visible GPUs.
Hub datasets and models are checked only as far as the local cache allows (nothing is downloaded here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.data.datafiles import (  # noqa: F401 - re-exported
    DATA_SUFFIXES,
    DataFileError,
    bad_jsonl_line,
    data_file,
    data_suffix,
    read_rows,
)
from runner.errors import Problem, SpecError
from runner.data.formats import FORMATS, FormatError, RowFormat, Sample, detect, samples
from runner.imports import from_transformers
from runner.engines import engine_for
from runner.spec import RunSpec, resolve_embedded
from runner.events.tracking import tracker_problems
from runner.facts.tiling import tiled_mlp_problems
from runner.gate.versioncheck import version_problems

SAMPLE_ROWS = 16
TEMPLATE_ROWS = 8  # rows rendered through the chat template (each trained turn costs two renders of its prefix)
# bf16 tensor-core GEMMs and the flash/varlen attention kernels work on 8-token tiles: a block length off that
# grid pads every projection and attention call of every layer.
CUDA_SEQ_MULTIPLE = 8


def preflight(spec: RunSpec) -> None:
    """Raise SpecError listing every problem found; return quietly when the run can start."""
    problems = preflight_problems(spec)
    if problems:
        raise SpecError("preflight found problems", problems)


def preflight_problems(spec: RunSpec) -> list[Problem]:
    # A library outside its supported range is the one answer: the checks below run that library's code.
    out: list[Problem] = version_problems()
    if out:
        return out
    out += _seq_len_problems(spec)
    rows, data_problems = _sample_rows(spec)
    out += data_problems
    config, model_problems = _model_config(spec)
    out += model_problems
    token_ids = _token_id_problems(spec, config)
    out += token_ids
    if token_ids:
        config = None  # no model can be built from it: the checks below that build one would die of it
    if config is not None or not model_problems:  # a folder transformers cannot read loads no tokenizer either
        out += _template_problems(spec, rows)
    if config is not None:
        from runner.train.ulysses import sequence_parallel_problems

        out += sequence_parallel_problems(config, spec.hardware.sequence_parallel)
        packing = _packing_problems(spec, config)
        out += packing
        if not packing and not out:
            # A shrunk copy of the model proves packing exact on the run's path (runner.gate.packcheck); only for a
            # spec that is otherwise sound, since it builds and runs that copy.
            from runner.gate.packcheck import check_problems

            out += check_problems(spec, config, _device(spec))
        out += _lora_problems(spec, config)
        out += engine_for(spec.engine).check_problems(spec, config, _device(spec))
    out += _attention_problems(spec, config)
    out += _hardware_problems(spec)
    out += tiled_mlp_problems(spec.engine, spec.train.tiled_mlp, spec.train.compile)
    out += tracker_problems(list(spec.report.to))
    if spec.method.adapters and spec.output.save == "full" and not engine_for(spec.engine).exports_full_lora:
        out.append(Problem("output.save", f"full export of a LoRA run is not supported by the {spec.engine} engine",
                           "use output.save=merged (the LoRA folded into the base, a standalone model) or adapter"))
    prompts = spec.train.eval_prompts
    if isinstance(prompts, str) and not resolve_embedded(prompts).is_file():
        out.append(Problem("train.eval_prompts", f"no such file: {prompts}",
                           "give a text file with one prompt a line, or a list such as [\"Name a fruit.\"]"))
    return out


def packing_check(spec: RunSpec) -> Any:
    """The packing check's verdict for this run (runner.gate.packcheck.Verdict; cached by the preflight that
    computed it), or None when there is none: no packing, no readable config, or an attention path refused."""
    if not spec.train.packing:
        return None
    config, problems = _model_config(spec)
    if config is None or problems:
        return None
    from runner.gate.packcheck import packing_verdict

    return packing_verdict(spec, config, _device(spec))


BF16_ULP = 2.0**-8
"""Spacing of bf16 numbers relative to their magnitude (8 bits of significand)."""
TYPICAL_WEIGHT = 0.02
"""Magnitude of a typical transformer weight (the usual init std): the scale an update must move."""


def precision_advice(spec: RunSpec) -> str | None:
    """A warning when plain bf16 parameters would round most AdamW updates away (train.optimizer_precision=bf16:
    parameters and states in bf16, rounded to nearest; AdamW moves each weight by about lr per step)."""
    t = spec.train
    if engine_for(spec.engine).fixed_optimizer_precision or t.optimizer_precision != "bf16":
        return None
    if t.lr >= TYPICAL_WEIGHT * BF16_ULP:
        return None
    return (f"train.optimizer_precision=bf16 keeps parameters and AdamW states in bf16 rounded to nearest: a step of "
            f"about lr={t.lr:g} is under bf16's resolution for weights above {t.lr / BF16_ULP:.1g}, so most updates "
            "round away (on an H200: loss 8.14 against 4.56 with fp32 master weights after the same 13 steps). "
            "train.optimizer_precision=bf16_stochastic keeps the same 8 bytes per parameter and learns like fp32 "
            "master weights in expectation (auto picks it for bf16 weights)")


# ---------------------------------------------------------------------------------------------


def _device(spec: RunSpec) -> str:
    if spec.hardware.device != "auto":
        return spec.hardware.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _seq_len_problems(spec: RunSpec) -> list[Problem]:
    n = spec.train.seq_len
    if n < 2:
        return [Problem("train.seq_len", f"must be at least 2 (one token predicts the next), got {n}", "use 512")]
    if _device(spec) == "cuda" and n % CUDA_SEQ_MULTIPLE:
        up = -(-n // CUDA_SEQ_MULTIPLE) * CUDA_SEQ_MULTIPLE
        return [Problem("train.seq_len", f"must be a multiple of {CUDA_SEQ_MULTIPLE} on GPU (bf16 tensor cores and "
                                         f"flash/varlen kernels work on {CUDA_SEQ_MULTIPLE}-token tiles), got {n}",
                        f"use {up}")]
    return []


def _data_files(path: Path, chosen: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted({chosen, *(p for p in path.rglob("*") if p.is_file() and data_suffix(p) == ".jsonl")})


def _sample_rows(spec: RunSpec) -> tuple[list[Sample], list[Problem]]:
    """A few rows of a local dataset as Samples (none for hub datasets: not downloaded here)."""
    d = spec.dataset
    if not d.path:
        return [], []
    path = resolve_embedded(d.path)
    if not path.exists():
        return [], [Problem("dataset.path", f"no such file or directory: {path}", "give an existing local path")]
    f = data_file(path, d.split)
    if f is None:
        return [], [Problem("dataset.path", f"no {'/'.join(DATA_SUFFIXES)} file (or .jsonl.gz/.json.gz/.csv.gz) "
                                             f"under {path}",
                            "point dataset.path at a JSONL/JSON/parquet/CSV file or a folder of them")]
    for file in _data_files(path, f):
        bad = bad_jsonl_line(file) if data_suffix(file) == ".jsonl" else None
        if bad:
            return [], [Problem("dataset.path", *bad)]
    try:
        rows = read_rows(f, SAMPLE_ROWS)
    except DataFileError as e:
        return [], [Problem("dataset.path", str(e), "fix the file")]
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        return [], [Problem("dataset.path", f"cannot read {f}: {e}", "check the file's format")]
    if not rows:
        return [], [Problem("dataset.path", f"{f} holds no rows", "give a dataset with at least one conversation")]
    fmt = RowFormat.from_spec(d)
    try:
        detected = detect(rows, fmt)
        out = samples(rows, fmt, detected)
    except FormatError as e:
        return [], [Problem(e.field, f"{f.name}: {e}", e.fix)]
    if not any(s.has_targets for s in out):
        what = "no assistant turn" if FORMATS[detected.format].roles_train else "nothing to train on"
        return out, [Problem("dataset.roles", f"{what} in the first {len(rows)} rows of {f.name} "
                                              f"({detected.describe()})",
                             "SFT trains on assistant turns: map the dataset's role names with dataset.roles, "
                             "e.g. {bot: assistant}")]
    return out, []


def _model_config(spec: RunSpec) -> tuple[Any | None, list[Problem]]:
    from runner.spec import model_source
    from runner.train.model import has_weights

    src, rev = model_source(spec)
    problems: list[Problem] = []
    if spec.model.path:
        path = Path(src)
        if not (path / "config.json").is_file():
            return None, [Problem("model.path", f"{path} has no config.json", "point model.path at an HF model folder")]
        if spec.model.init == "pretrained" and not has_weights(path):
            problems.append(Problem("model.init", f"pretrained, but {path} holds no weights (*.safetensors/*.bin)",
                                    "set model.init=random to initialise from config.json, or add the weights"))
        unknown = _model_type_problem(spec, path / "config.json")
        if unknown:
            return None, [*problems, unknown]
    try:
        AutoConfig = from_transformers("AutoConfig")

        config = AutoConfig.from_pretrained(src, revision=rev, trust_remote_code=spec.model.trust_remote_code,
                                            local_files_only=True)
    except Exception as e:  # noqa: BLE001 - not cached (hub) or unreadable: only a local folder is an error here
        if spec.model.path:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            problems.append(Problem("model.path", f"cannot read the model config: {first}", "check config.json"))
        return None, problems
    return config, problems


def _model_type_problem(spec: RunSpec, config_json: Path) -> Problem | None:
    """A config.json whose model_type this transformers does not know (and whose folder ships no code for it), in
    one line: transformers' own error is six lines."""
    import json

    try:
        model_type = json.loads(config_json.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: AutoConfig's error says how
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not model_type or model_type in CONFIG_MAPPING or spec.model.trust_remote_code:
        return None
    return Problem("model.path", f"config.json's model_type {model_type!r} is not one transformers "
                                 f"{transformers.__version__} knows",
                   "upgrade transformers (pip install -U transformers) if the family is new, fix model_type in "
                   "config.json, or set model.trust_remote_code=true if the folder ships the model's code")


TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def _token_id_problems(spec: RunSpec, config: Any) -> list[Problem]:
    """The config's special token ids inside its vocabulary: a pad id outside it fails building the embedding
    (`Padding_idx must be within num_embeddings`) on every rank, and a bos/eos id outside it indexes past the
    embedding (transformers' Phi3Config default: vocab_size 32000, pad_token_id 32000)."""
    text = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int):
        return []
    field = "model.path" if spec.model.path else "model.id"
    where = f"{resolve_embedded(spec.model.path)}/config.json" if spec.model.path else "the model's config.json"
    out = []
    for name in TOKEN_ID_FIELDS:
        value = getattr(text, name, None)
        ids = value if isinstance(value, list) else [value]
        bad = [i for i in ids if isinstance(i, int) and not 0 <= i < vocab]
        if bad:
            out.append(Problem(field, f"{name} is {value} in {where}, outside the vocabulary (vocab_size {vocab}: "
                                      f"ids 0 to {vocab - 1})",
                               f"set {name} in config.json to the tokenizer's id for that token (below {vocab}), "
                               "or to null"))
    return out


def _template_problems(spec: RunSpec, sampled: list[Sample]) -> list[Problem]:
    from runner.data.tokens import tokenize_sample

    try:
        AutoTokenizer = from_transformers("AutoTokenizer")

        from runner.spec import model_source
        from runner.train.model import quiet_length_warning

        src, rev = model_source(spec)
        tok = quiet_length_warning(AutoTokenizer.from_pretrained(
            src, revision=rev, trust_remote_code=spec.model.trust_remote_code, local_files_only=True))
    except Exception:  # noqa: BLE001 - hub tokenizer not cached: checked when the ranks load it
        return []
    chat = [s for s in sampled if s.messages is not None]
    if (chat or not sampled) and not getattr(tok, "chat_template", None):
        return [Problem("model.path" if spec.model.path else "model.id", "the tokenizer has no chat template",
                        "use a chat/instruct checkpoint, or add chat_template.jinja to the model folder")]
    picked = [s for s in sampled if s.has_targets][:TEMPLATE_ROWS]
    if not picked:
        picked = [Sample(messages=[{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}],
                         trained=[False, True])]
    try:
        examples = [tokenize_sample(tok, s) for s in picked]
    except Exception as e:  # noqa: BLE001 - a template that cannot render these messages
        return [Problem("dataset.format", f"the chat template cannot render the dataset's rows: {e}",
                        "check the roles and content types against the template (dataset.roles, dataset.columns)")]
    if not any(any(mask) for _, mask in examples):
        return [Problem("model.path" if spec.model.path else "model.id",
                        f"the chat template yields no assistant tokens on {len(picked)} sample row(s): "
                        "nothing would be trained",
                        "use a template that renders assistant turns (or wraps them in {% generation %} markers)")]
    return _tool_problems(spec, tok, [s for s in sampled if s.messages is not None]) + _block_problems(spec, examples)


def _tool_problems(spec: RunSpec, tok: Any, chat: list[Sample]) -> list[Problem]:
    """Rows with tool calls or a tools list need a template that renders them: many templates ignore both, and
    the run would train on empty assistant turns with no tool list. One sampled row of each kind is rendered with
    and without them; the same text, or a call's or tool's name missing from it, means they were dropped."""
    field = "model.path" if spec.model.path else "model.id"
    fix = ("use a chat template that renders `tools` and the messages' `tool_calls` (chat_template.jinja in the "
           "model folder; recipes/embedded/tokenizer/chat_template.jinja is one), or give data without tool calls")

    def render(messages: list[dict[str, Any]], tools: Any) -> str:
        return tok.apply_chat_template(messages, tools=tools, tokenize=False)

    out = []
    called = next((s for s in chat if any(m.get("tool_calls") for m in s.messages or [])), None)
    if called is not None:
        names = [c["function"]["name"] for m in called.messages or [] for c in m.get("tool_calls") or []]
        plain = [{k: v for k, v in m.items() if k != "tool_calls"} for m in called.messages or []]
        try:
            text, without = render(called.messages, called.tools), render(plain, called.tools)
        except Exception as e:  # noqa: BLE001 - a template that rejects tool_calls drops them as surely
            text, without = "", str(e)
        if text == without or not all(n in text for n in names):
            out.append(Problem(field, f"the chat template drops tool calls: a sampled row calls {names[0]!r} but "
                                      "the rendered text has no call, so its assistant turn trains empty", fix))
    listed = next((s for s in chat if s.tools), None)
    if listed is not None:
        names = [t["function"].get("name", "") for t in listed.tools or []]
        try:
            text, without = render(listed.messages, listed.tools), render(listed.messages, None)
        except Exception as e:  # noqa: BLE001
            text, without = "", str(e)
        if text == without or not all(n in text for n in names):
            out.append(Problem(field, f"the chat template drops the tools list: a sampled row offers {names[0]!r} "
                                      "but the rendered text does not list it", fix))
    return out


def _block_problems(spec: RunSpec, examples: list[tuple[list[int], list[bool]]]) -> list[Problem]:
    """A block too short to hold any sampled row's prompt and its first trained token: conversations are cut into
    pieces, and every reply would train in a later piece, without the prompt it answers."""
    # A block's first token is never a target (nothing predicts it), so a row needs its first trained index + 1.
    firsts = [max(mask.index(True), 1) + 1 for _, mask in examples if any(mask)]
    n = spec.train.seq_len
    if not firsts or n >= min(firsts):
        return []
    need = min(firsts)
    whole = 1 << (max(len(ids) for ids, _ in examples) - 1).bit_length()  # a power of two that holds every row
    return [Problem("train.seq_len", f"{n} tokens per block cannot hold any sampled row's prompt and its first "
                                     f"trained token (the shortest needs {need}): conversations would be cut into "
                                     f"{n}-token pieces and every reply trained without the prompt it answers",
                    f"use train.seq_len={need} or more ({max(whole, need)} holds each sampled row whole)")]


def _packing_problems(spec: RunSpec, config: Any) -> list[Problem]:
    if not spec.train.packing:
        return []
    from runner.train.attention import packing_support, recurrent_layer_types

    if engine_for(spec.engine).boundaries_from_collator and recurrent_layer_types(config):
        from runner.train.trl_engine import collator_passes_boundaries

        if not collator_passes_boundaries():
            return [Problem("train.packing", "this TRL's padding-free packing passes only position_ids, which the "
                                             f"recurrent layers of {config.model_type} ignore: documents would leak "
                                             "into each other", "use engine=native, or set train.packing=false")]
    support = packing_support(config)
    if support.safe:
        return []
    return [Problem("train.packing", f"packed documents would not stay apart: {support.reason}", support.fix)]


def _lora_problems(spec: RunSpec, config: Any) -> list[Problem]:
    if not spec.method.adapters:
        return []
    try:
        from runner.train import lora
    except ImportError:
        return []
    from_config = getattr(lora, "lora_problems_from_config", None)
    if from_config is not None:
        return list(from_config(config, spec))
    import torch

    from runner.train.model import model_class

    # The module tree on the meta device: no weights read, fast for any size.
    with torch.device("meta"):
        model = model_class(spec, config).from_config(config, trust_remote_code=spec.model.trust_remote_code)
    return list(lora.lora_problems(model, spec))


def _attention_problems(spec: RunSpec, config: Any = None) -> list[Problem]:
    """The attention path the engine would load must keep packed documents apart and apply the family's attention
    (runner.decide.rules via runner.train.attention.attention_for); the trl engine's own check covers it there."""
    from runner.train.attention import attention_for, attention_problem

    if config is None or engine_for(spec.engine).checks_own_attention:
        impl = spec.model.attn_implementation
        problem = None if impl == "auto" or config is not None else attention_problem(impl, _device(spec))
        return [Problem("model.attn_implementation", f"{impl} cannot run here: {problem}", "use auto")] \
            if problem else []
    choice, refusal = attention_for(spec, config, _device(spec))
    if refusal is None:
        return []
    return [Problem("model.attn_implementation", f"{choice.impl} cannot train this model here: {refusal[0]}",
                    refusal[1])]


def _gpu_name_problems(spec: RunSpec) -> list[Problem]:
    """A hardware.gpu that names no known GPU type is a typo on any device: refused with the closest name, on CPU
    too (where the name is otherwise unused), rather than passing silently there and losing the estimate on GPU."""
    from runner.errors import UserError
    from runner.facts.gpus import gpu_type

    if spec.hardware.gpu == "auto":
        return []
    try:
        gpu_type(spec.hardware.gpu)
    except UserError as e:
        return list(e.problems)
    return []


def _hardware_problems(spec: RunSpec) -> list[Problem]:
    gpu_name = _gpu_name_problems(spec)
    if gpu_name:
        return gpu_name
    if _device(spec) != "cuda" or spec.hardware.nproc_per_node == "auto" or spec.hardware.nodes != 1:
        return []
    import torch

    visible = torch.cuda.device_count()
    n = int(spec.hardware.nproc_per_node)
    if visible == 0:
        return [Problem("hardware.device", "cuda was asked for but no GPU is visible",
                        "use hardware.device=cpu or run on a GPU machine")]
    if n > visible:
        return [Problem("hardware.nproc_per_node", f"{n} ranks but only {visible} GPUs visible",
                        f"use hardware.nproc_per_node={visible} or fewer")]
    return []
