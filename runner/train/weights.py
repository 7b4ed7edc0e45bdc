"""A finished run's weights after the fact: found in its export or else its last checkpoint, and written again as
an adapter, the full model or the LoRA merged into its base (`runner export`)."""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.errors import UserError
from runner.events.paths import CHECKPOINT_META, RunPaths
from runner.engines import ADAPTER_METHODS
from runner.spec import RunSpec

if TYPE_CHECKING:  # torch loads in the caller's worker, not when a screen imports this module
    import torch

EXPORT_KINDS = ("merged", "adapter", "full")
TRY_ATTENTION = "sdpa"
"""Attention for models loaded here (export, generation): one sequence at a time, nothing packed."""


@dataclass
class RunWeights:
    """Where a run's final weights are: a folder holding a standalone model (`model_dir`), or a plain base state
    with the adapter that goes on it, or a plain state (a full fine-tune's checkpoint)."""

    spec: RunSpec
    source: str
    """What they were read from, for messages: 'export (adapter)', 'checkpoint step40'."""
    model_dir: Path | None = None
    state: dict[str, torch.Tensor] | None = None
    adapter: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None


def record_spec(record: dict[str, Any]) -> RunSpec:
    return RunSpec.model_validate(record["spec"])


def run_dir_of(record: dict[str, Any]) -> Path:
    run_dir = record.get("run_dir")
    if not run_dir or not Path(run_dir).is_dir():
        raise UserError(f"record {record.get('id')}: its run folder {run_dir} is gone, so are its weights")
    return Path(run_dir)


def quiet_loading() -> None:
    """No per-file progress bars from transformers: the commands here print their own one line."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def base_model(spec: RunSpec) -> torch.nn.Module:
    from runner.train.model import load_model

    quiet_loading()
    return load_model(spec, TRY_ATTENTION).eval()


def _adapter_files(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors"), json.loads((folder / "adapter_config.json").read_text())


def _from_native_checkpoint(spec: RunSpec, folder: Path) -> RunWeights:
    from runner.train.merge import split_peft_state

    model = base_model(spec)
    if spec.method.kind in ADAPTER_METHODS:
        from runner.train.export import adapter_config
        from runner.train.lora import apply_lora

        model = apply_lora(model, spec)
        _load_alone(folder, model)
        base, adapter = split_peft_state(model.state_dict())
        return RunWeights(spec, f"checkpoint {folder.name}", state=base, adapter=(adapter, adapter_config(model)))
    _load_alone(folder, model)
    return RunWeights(spec, f"checkpoint {folder.name}", state=model.state_dict())


def _load_alone(folder: Path, model: torch.nn.Module) -> None:
    from runner.train.checkpoint import load_model_weights

    with warnings.catch_warnings():  # one process reading what many wrote is what is meant here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_model_weights(folder, model)


def run_weights(record: dict[str, Any], prefer_checkpoint: bool = False) -> RunWeights:
    """The run's final weights: its export when it has one (unless prefer_checkpoint), else its last checkpoint."""
    spec = record_spec(record)
    run_dir = run_dir_of(record)
    export = ((record.get("metrics") or {}).get("export") or {})
    folder = RunPaths(run_dir).export
    if export.get("kind") and folder.is_dir() and not prefer_checkpoint:
        kind = export["kind"]
        if kind == "adapter":
            return RunWeights(spec, "export (adapter)", state=base_model(spec).state_dict(),
                              adapter=_adapter_files(folder))
        return RunWeights(spec, f"export ({kind})", model_dir=folder)
    ckpt = RunPaths(run_dir).latest_checkpoint()
    if ckpt is None:
        raise UserError(f"record {record.get('id')}: the run kept no weights (output.save="
                        f"{spec.output.save}, no checkpoint in {RunPaths(run_dir).checkpoints}); re-run it with "
                        "output.save=auto or train.checkpoint_every set")
    if (ckpt / CHECKPOINT_META).is_file():
        return _from_native_checkpoint(spec, ckpt)
    if (ckpt / "adapter_model.safetensors").is_file():
        return RunWeights(spec, f"checkpoint {ckpt.name}", state=base_model(spec).state_dict(),
                          adapter=_adapter_files(ckpt))
    if any(ckpt.glob("model*.safetensors")):
        return RunWeights(spec, f"checkpoint {ckpt.name}", model_dir=ckpt)
    raise UserError(f"checkpoint {ckpt} holds sharded trainer state only; export needs the run's export folder "
                    "(run with output.save=auto)")


def plain_state(weights: RunWeights) -> dict[str, torch.Tensor]:
    """The model's weights with any adapter merged in (runner.train.merge)."""
    from runner.train.merge import merge_lora

    if weights.model_dir is not None:
        return load_model_dir(weights.model_dir, weights.spec).state_dict()
    assert weights.state is not None
    if weights.adapter is None:
        return weights.state
    return merge_lora(weights.state, *weights.adapter)


def load_model_dir(folder: Path, spec: RunSpec) -> torch.nn.Module:
    import torch

    from runner.train.model import DTYPES, load_config, model_class

    quiet_loading()
    return model_class(spec, load_config(spec)).from_pretrained(str(folder), dtype=DTYPES.get(spec.model.dtype, torch.float32),
                                      attn_implementation=TRY_ATTENTION).eval()


def export_run(record: dict[str, Any], kind: str, out_dir: Path) -> dict[str, Any]:
    """Write the run's weights as `kind` (merged | adapter | full) into out_dir; returns {dir, kind, source, files}."""
    from runner.train.export import file_hashes, write_model
    from runner.train.model import load_tokenizer

    if kind not in EXPORT_KINDS:
        raise UserError(f"--as must be one of {', '.join(EXPORT_KINDS)}, got {kind!r}")
    spec = record_spec(record)
    lora = spec.method.kind in ADAPTER_METHODS
    if kind in ("adapter", "merged") and not lora:
        raise UserError(f"a {spec.method.kind} fine-tune has no adapter to {'save' if kind == 'adapter' else 'merge'}:"
                        " export it --as full")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir} is not empty: give -o a new folder")
    exported = (record.get("metrics") or {}).get("export") or {}
    # An adapter cannot be taken back out of a merged or full export: those runs' adapters are in the checkpoint.
    weights = run_weights(record, prefer_checkpoint=kind == "adapter" and exported.get("kind") != "adapter")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if kind == "adapter":
            _write_adapter(weights, tmp)
        elif weights.model_dir is not None:
            shutil.copytree(weights.model_dir, tmp)
        else:
            write_model(plain_state(weights), spec, load_tokenizer(spec), tmp)
        if kind == "adapter" or weights.model_dir is None:
            load_tokenizer(spec).save_pretrained(str(tmp))
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"dir": str(out_dir), "kind": kind, "source": weights.source, "files": file_hashes(out_dir)}


def _write_adapter(weights: RunWeights, out: Path) -> None:
    from safetensors.torch import save_file

    if weights.adapter is None:
        raise UserError(f"{weights.source} holds no adapter")
    state, config = weights.adapter
    out.mkdir(parents=True)
    # peft's file form: the live model's `.default` adapter name is not part of the saved keys.
    save_file({k.replace(".default.weight", ".weight"): v.contiguous() for k, v in state.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(_json_ready(config), indent=2, sort_keys=True))


def _json_ready(config: dict[str, Any]) -> dict[str, Any]:
    return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
