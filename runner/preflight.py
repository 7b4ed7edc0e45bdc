"""Preflight: what would make a run fail or train on wrong data, found before any rank starts (all at once).

Checks: the dataset has the messages column (a few rows of a local file); the chat template yields assistant
tokens on a sample; train.seq_len suits the attention kernels; a pretrained model has weights to load; the model
can keep packed documents apart with the installed kernels; LoRA targets exist; nproc fits the visible GPUs.
Hub datasets and models are checked only as far as the local cache allows (nothing is downloaded here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.errors import Problem, SpecError
from runner.imports import from_transformers
from runner.spec import RunSpec, resolve_embedded

SAMPLE_ROWS = 16
# bf16 tensor-core GEMMs and the flash/varlen attention kernels work on 8-token tiles: a block length off that
# grid pads every projection and attention call of every layer.
CUDA_SEQ_MULTIPLE = 8
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def preflight(spec: RunSpec) -> None:
    """Raise SpecError listing every problem found; return quietly when the run can start."""
    problems = preflight_problems(spec)
    if problems:
        raise SpecError("preflight found problems", problems)


def preflight_problems(spec: RunSpec) -> list[Problem]:
    out: list[Problem] = []
    out += _seq_len_problems(spec)
    rows, data_problems = _sample_rows(spec)
    out += data_problems
    config, model_problems = _model_config(spec)
    out += model_problems
    out += _template_problems(spec, rows)
    if config is not None:
        out += _packing_problems(spec, config)
        out += _lora_problems(spec, config)
        if spec.engine == "trl":
            from runner.train.trl_engine import trl_problems

            out += trl_problems(spec, config, _device(spec), lora=False)
    out += _attention_problems(spec)
    out += _hardware_problems(spec)
    if spec.method.kind == "lora" and spec.output.save == "full" and spec.engine == "native":
        out.append(Problem("output.save", "full export of a LoRA run is not supported by the native engine",
                           "use output.save=adapter (load it on the base model with peft)"))
    return out


BF16_ULP = 2.0**-8
"""Spacing of bf16 numbers relative to their magnitude (8 bits of significand)."""
TYPICAL_WEIGHT = 0.02
"""Magnitude of a typical transformer weight (the usual init std): the scale an update must move."""


def precision_advice(spec: RunSpec) -> str | None:
    """A warning when bf16 parameters would round most AdamW updates away (the native engine keeps parameters and
    optimizer states in model.dtype; AdamW moves each weight by about lr per step)."""
    t = spec.train
    if spec.engine != "native" or spec.method.kind != "full" or spec.model.dtype not in ("bfloat16", "auto"):
        return None
    if spec.hardware.device == "cpu" or t.lr >= TYPICAL_WEIGHT * BF16_ULP:
        return None
    dtype = "bfloat16" if spec.model.dtype == "bfloat16" else "auto (the checkpoint's dtype, bf16 for most)"
    return (f"model.dtype={dtype} keeps parameters and AdamW states in bf16: a step of about lr={t.lr:g} is under "
            f"bf16's resolution for weights above {t.lr / BF16_ULP:.1g}, so most updates round away "
            "(on an H200: loss 8.14 against 4.56 with fp32 master weights after the same 13 steps). "
            "For fp32 master weights with bf16 compute at the same speed, set model.dtype=float32 (+8 bytes per "
            "parameter)")


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


def data_file(path: Path, split: str) -> Path | None:
    """The file to sample for a local dataset: the file itself, or the split's (else the first) data file."""
    if path.is_file():
        return path
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in DATA_SUFFIXES)
    return next((p for p in files if split in p.stem), files[0] if files else None)


def read_rows(path: Path, limit: int) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rows.append(json.loads(line))
                if len(rows) >= limit:
                    break
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        return list(data)[:limit]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).read_row_group(0).slice(0, limit).to_pylist()
    if suffix == ".csv":
        import csv

        with open(path, encoding="utf-8", newline="") as f:
            return [row for _, row in zip(range(limit), csv.DictReader(f))]
    raise ValueError(f"unsupported dataset file type {suffix!r}")


def _is_conversation(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(m, dict) and "role" in m and "content" in m for m in x)


def _sample_rows(spec: RunSpec) -> tuple[list[list[dict[str, Any]]], list[Problem]]:
    """A few conversations of a local dataset (none for hub datasets: not downloaded here)."""
    d = spec.dataset
    if not d.path:
        return [], []
    path = resolve_embedded(d.path)
    if not path.exists():
        return [], [Problem("dataset.path", f"no such file or directory: {path}", "give an existing local path")]
    f = data_file(path, d.split)
    if f is None:
        return [], [Problem("dataset.path", f"no {'/'.join(DATA_SUFFIXES)} file under {path}",
                            "point dataset.path at a JSONL/JSON/parquet/CSV file or a folder of them")]
    try:
        rows = read_rows(f, SAMPLE_ROWS)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        return [], [Problem("dataset.path", f"cannot read {f}: {e}", "check the file's format")]
    if not rows:
        return [], [Problem("dataset.path", f"{f} holds no rows", "give a dataset with at least one conversation")]
    columns = sorted({k for r in rows for k in r})
    field = d.messages_field
    if not any(field in r for r in rows):
        return [], [Problem("dataset.messages_field", f"column '{field}' not found in {f.name}; columns: "
                                                      f"{', '.join(columns)}",
                            "set dataset.messages_field to the column holding the chat messages")]
    convs = [r[field] for r in rows if _is_conversation(r.get(field))]
    if not convs:
        return [], [Problem("dataset.messages_field", f"column '{field}' of {f.name} does not hold lists of "
                                                      "{role, content} messages",
                            "convert the rows to chat format: [{\"role\": ..., \"content\": ...}, ...]")]
    if not any(m.get("role") == "assistant" for c in convs for m in c):
        return convs, [Problem("dataset.messages_field", f"no assistant message in the first {len(rows)} rows",
                               "SFT trains on assistant turns: check the role names (assistant, not bot/gpt)")]
    return convs, []


def _local_files_only(spec: RunSpec) -> bool:
    return bool(spec.model.path)


def _model_config(spec: RunSpec) -> tuple[Any | None, list[Problem]]:
    from runner.train.model import has_weights, model_source

    src, rev = model_source(spec)
    problems: list[Problem] = []
    if spec.model.path:
        path = Path(src)
        if not (path / "config.json").is_file():
            return None, [Problem("model.path", f"{path} has no config.json", "point model.path at an HF model folder")]
        if spec.model.init == "pretrained" and not has_weights(path):
            problems.append(Problem("model.init", f"pretrained, but {path} holds no weights (*.safetensors/*.bin)",
                                    "set model.init=random to initialise from config.json, or add the weights"))
    try:
        AutoConfig = from_transformers("AutoConfig")

        config = AutoConfig.from_pretrained(src, revision=rev, trust_remote_code=spec.model.trust_remote_code,
                                            local_files_only=True)
    except Exception as e:  # noqa: BLE001 - not cached (hub) or unreadable: only a local folder is an error here
        if spec.model.path:
            problems.append(Problem("model.path", f"cannot read the model config: {e}", "check config.json"))
        return None, problems
    return config, problems


def _template_problems(spec: RunSpec, convs: list[list[dict[str, Any]]]) -> list[Problem]:
    from runner.train.data import tokenizer_fn

    try:
        AutoTokenizer = from_transformers("AutoTokenizer")

        from runner.train.model import model_source

        src, rev = model_source(spec)
        tok = AutoTokenizer.from_pretrained(src, revision=rev, trust_remote_code=spec.model.trust_remote_code,
                                            local_files_only=True)
    except Exception:  # noqa: BLE001 - hub tokenizer not cached: checked when the ranks load it
        return []
    if not getattr(tok, "chat_template", None):
        return [Problem("model.path" if spec.model.path else "model.id", "the tokenizer has no chat template",
                        "use a chat/instruct checkpoint, or add chat_template.jinja to the model folder")]
    samples = [c for c in convs if any(m.get("role") == "assistant" for m in c)][:4]
    if not samples:
        samples = [[{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}]]
    tokenize = tokenizer_fn(tok)
    try:
        trained = sum(sum(tokenize(tok, c)[1]) for c in samples)
    except Exception as e:  # noqa: BLE001 - a template that cannot render these messages
        return [Problem("dataset.messages_field", f"the chat template cannot render the dataset's messages: {e}",
                        "check the roles and content types against the template")]
    if trained == 0:
        return [Problem("model.path" if spec.model.path else "model.id",
                        f"the chat template yields no assistant tokens on {len(samples)} sample conversation(s): "
                        "nothing would be trained",
                        "use a template that renders assistant turns (or wraps them in {% generation %} markers)")]
    return []


def _packing_problems(spec: RunSpec, config: Any) -> list[Problem]:
    if not spec.train.packing:
        return []
    from runner.train.attention import packing_support, recurrent_layer_types

    if spec.engine == "trl" and recurrent_layer_types(config):
        return [Problem("train.packing", "TRL's padding-free packing passes only position_ids, which the recurrent "
                                         f"layers of {config.model_type} ignore: documents would leak into each "
                                         "other", "use engine=native, or set train.packing=false")]
    support = packing_support(config)
    if support.safe:
        return []
    return [Problem("train.packing", f"packed documents would not stay apart: {support.reason}", support.fix)]


def _lora_problems(spec: RunSpec, config: Any) -> list[Problem]:
    if spec.method.kind != "lora":
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


def _attention_problems(spec: RunSpec) -> list[Problem]:
    from runner.train.attention import attention_problem

    impl = spec.model.attn_implementation
    if impl == "auto":
        return []
    problem = attention_problem(impl, _device(spec))
    return [Problem("model.attn_implementation", f"{impl} cannot run here: {problem}", "use auto")] if problem else []


def _hardware_problems(spec: RunSpec) -> list[Problem]:
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
