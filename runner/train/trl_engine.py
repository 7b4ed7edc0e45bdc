"""The TRL engine: TRL SFTTrainer + accelerate FSDP2 + peft LoRA (the 120B notebook's stack) on this rank's blocks.

Choices, recorded in the `train_begin` event:
- Data. Each rank builds its blocks with `runner.train.data` (its own shard, assistant-only mask from the template's
  `{% generation %}` markers or by bracketing each assistant turn, exact `seq_len` blocks with `train.packing`, one
  document per block without), exactly as the native engine does, and hands them to TRL pre-tokenised
  (`input_ids`, `labels`, `seq_lengths`). TRL's padding-free collator rebuilds the per-document position_ids and
  cu_seqlens, so both engines see the same tokens, targets and document boundaries. TRL's own tokenisation and
  packing are skipped (`skip_prepare_dataset`): it would shard, pack and mask differently, and `assistant_only_loss`
  needs generation markers that many templates lack. The trainer gets this rank's loader as is: every rank already
  read its own shard, so nothing is sharded twice.
- Documents stay apart as in the native engine (runner.train.attention.keep_documents_apart): models whose forward
  builds its attention mask without position_ids (GPT-OSS) get a pre-hook that builds the mask of every layer type
  from the position_ids (flash and varlen kernels read cu_seqlens); gated-delta layers restart per document from
  the cu_seq_lens / seq_idx that TRL's padding-free collator passes.
- Attention: the native engine's choice (runner.decide.rules, runner.facts.families): e.g. GPT-OSS's attention sinks get
  eager on CPU (flex cannot apply sinks there) and flex_attention on CUDA; sdpa, varlen and flash-attn are refused.
- FSDP2 through accelerate with more than one rank (`fsdp_config` version 2, decoder-layer classes from
  `_no_split_modules`, reshard after forward, FSDP's own activation checkpointing). accelerate only enables FSDP on
  accelerator devices; on CPU ranks the trainer's accelerator is switched to FSDP2 after creation, so the same code
  path runs under gloo, on the process group that runtime.py initialised. One process trains the plain module, as
  TRL's own single-GPU setup does (and as the native engine does): bf16 autocast over fp32 trainable weights, the
  trainer's gradient checkpointing. `train.fsdp_one_rank` wraps one GPU process in FSDP2 anyway.
- Loss. TRL's chunked LM head, normalised by the target count of the whole step over every rank (the native
  engine's normalisation). The MoE router's auxiliary loss is off (`router_aux_loss_coef=0`), as in the notebook
  and the native engine. The learning-rate schedule is the native engine's (runner.train.schedule), given to the
  trainer as its scheduler.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runner.events.paths import RunPaths
from runner.decide.decisions import Decisions
from runner.errors import Problem, SpecError
from runner.events.lines import EventWriter, read_events
from runner.engines import saved_as
from runner.spec import RunSpec, model_source
from runner.train.attention import PACKED_MASK_HOOK, keep_documents_apart
from runner.data.tokens import has_generation_markers
from runner.train.data import PackStats
from runner.train.evaluation import EVAL_METHOD, Evaluator, attach_eval
from runner.train.samples import with_samples
from runner.train.lora import apply_lora, lora_notes, lora_problems_from_config, trainable_params
from runner.train.runtime import Runtime
from runner.train.schedule import lr_at
from runner.train.trl_qlora import bnb_4bit_config, bnb_4bit_problems, bnb_4bit_record
from runner.train.summary import end_summary
from runner.train.trl_data import (  # noqa: F401 - the engine's data, re-exported for its callers
    CountingCollator,
    EpochOrder,
    RankLoader,
    block_row,
    collator_passes_boundaries,
    equalise_rows,
    rank_dataset,
    rank_rows,
)

MXFP4 = "mxfp4"


# ---------------------------------------------------------------------------------------------
# Checks before any weight is read (preflight calls `trl_problems`)


def is_mxfp4(config: Any) -> bool:
    q = getattr(config, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method) or "").lower() == MXFP4


def mxfp4_dequantize_available() -> tuple[bool, str]:
    """Whether this environment can dequantize an MXFP4 checkpoint to bf16 (transformers' own check)."""
    try:
        from transformers import Mxfp4Config
        from transformers.integrations import mxfp4 as _mxfp4  # noqa: F401 - the dequantizer lives here
        from transformers.quantizers.quantizer_mxfp4 import Mxfp4HfQuantizer
    except ImportError as e:
        return False, f"this transformers has no MXFP4 support ({e})"
    try:
        Mxfp4HfQuantizer(Mxfp4Config(dequantize=True)).validate_environment()
    except (ImportError, ValueError, RuntimeError) as e:
        return False, str(e).splitlines()[0]
    return True, ""


def attention_problems(spec: RunSpec, device: str, config: Any) -> list[Problem]:
    from runner.train.attention import attention_for

    _, refusal = attention_for(spec, config, device)
    return [Problem("model.attn_implementation", *refusal)] if refusal else []


def trl_problems(spec: RunSpec, config: Any = None, device: str | None = None, lora: bool = True) -> list[Problem]:
    """Everything the trl engine can find wrong before any weight is read: MXFP4 support, attention, LoRA targets.

    Runs on the meta device (no weights, no memory), so preflight can call it before launching and bad input
    exits 2; `lora=False` leaves out the LoRA checks when the caller runs lora_problems_from_config itself.
    """
    from runner.train.model import load_config

    config = config if config is not None else load_config(spec)
    if device is None:
        device = spec.hardware.device if spec.hardware.device != "auto" else \
            ("cuda" if torch.cuda.is_available() else "cpu")
    problems: list[Problem] = []
    if is_mxfp4(config) and spec.model.init != "random":
        ok, why = mxfp4_dequantize_available()
        if not ok:
            problems.append(Problem("model.path" if spec.model.path else "model.id",
                                    f"the checkpoint is MXFP4-quantized and cannot be dequantized to bf16 here: {why}",
                                    "install a transformers with MXFP4 support and the packages it names, or use a "
                                    "bf16 checkpoint"))
    problems += attention_problems(spec, device, config)
    if spec.method.kind == "qlora":
        problems += bnb_4bit_problems(spec, device)
    if lora and spec.method.adapters:
        problems += lora_problems_from_config(config, spec)
    return problems


def check(spec: RunSpec, config: Any = None, device: str | None = None) -> None:
    """Raise SpecError (exit code 2) listing every trl_problems entry."""
    problems = trl_problems(spec, config, device)
    if problems:
        raise SpecError("the trl engine cannot run this spec", problems)


# ---------------------------------------------------------------------------------------------
# Model


def load_model(spec: RunSpec, device: str, config: Any, attn: str, varlen_kernel: str = "") -> torch.nn.Module:
    """The model through runner.train.model.load_model; MXFP4 checkpoints dequantized to bf16 at load.

    A random-init model is created on the GPU it runs on (runner.train.model.load_model).
    """
    from runner.train import model as model_mod

    if is_mxfp4(config) and spec.model.init != "random":
        from transformers import Mxfp4Config

        src, rev = model_source(spec)
        cls = model_mod.model_class(spec, config)
        model = cls.from_pretrained(src, revision=rev, dtype=torch.bfloat16, attn_implementation=attn,
                                    quantization_config=Mxfp4Config(dequantize=True),
                                    trust_remote_code=spec.model.trust_remote_code)
        model_mod.disable_cache(model)
        return model
    if spec.method.kind == "qlora":  # bnb_4bit_problems refused the rest before launch
        from runner.train.attention import VARLEN, register_varlen

        if attn == VARLEN:
            register_varlen(varlen_kernel or None)
        src, rev = model_source(spec)
        model = model_mod.model_class(spec, config).from_pretrained(
            src, revision=rev, dtype=torch.bfloat16, attn_implementation=attn, quantization_config=bnb_4bit_config(),
            device_map={"": torch.cuda.current_device()}, trust_remote_code=spec.model.trust_remote_code)
        model_mod.disable_cache(model)
        model_mod.expose_backbone(model)
        return model
    return model_mod.load_model(spec, attn, seed=spec.train.seed, device=device, varlen_kernel=varlen_kernel)


# ---------------------------------------------------------------------------------------------
# Trainer configuration


def lr_scheduler_type(spec: RunSpec) -> str:
    kind = spec.train.schedule
    if kind == "constant":
        return "constant_with_warmup" if warmup(spec) else "constant"
    return kind


def warmup(spec: RunSpec) -> float:
    """Warmup steps, or a fraction of the run below 1 (transformers' convention) from train.warmup_ratio."""
    t = spec.train
    ratio = getattr(t, "warmup_ratio", None)
    return float(ratio) if not t.warmup_steps and ratio else t.warmup_steps


def fp32_master_weights(model: torch.nn.Module) -> int:
    """Cast the trainable parameters to fp32 in place (the optimizer steps them; autocast computes in bf16), as
    accelerate's FSDP2 preparation does under mixed precision. Frozen weights stay as loaded. Returns the count."""
    cast = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
            cast += p.numel()
    return cast


def fsdp_settings(model: torch.nn.Module, spec: RunSpec) -> dict[str, Any]:
    """accelerate's FSDP2 settings, under the `fsdp_config` keys transformers reads."""
    from runner.train.model import decoder_layers

    return {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": sorted({type(m).__name__ for m in decoder_layers(model)}),
        "reshard_after_forward": True,
        "activation_checkpointing": spec.train.activation_checkpointing,
        "state_dict_type": "FULL_STATE_DICT",
        "cpu_ram_efficient_loading": False,
    }


def _resume_from(run_dir: Path) -> str | None:
    """The latest complete checkpoint, named: the trainer's own pick is the newest folder, finished or not."""
    last = RunPaths(run_dir).latest_checkpoint()
    return str(last) if last is not None else None


def sft_config(spec: RunSpec, rt: Runtime, out_dir: Path, fsdp: dict[str, Any] | None, bf16: bool,
               liger: bool = False) -> Any:
    from trl import SFTConfig

    t = spec.train
    kwargs: dict[str, Any] = dict(
        output_dir=str(out_dir),
        per_device_train_batch_size=t.micro_batch,
        gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.lr,
        lr_scheduler_type=lr_scheduler_type(spec),
        warmup_steps=warmup(spec),
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        optim="adamw_torch_fused" if rt.device == "cuda" else "adamw_torch",
        max_steps=t.max_steps or -1,
        # Counted in epochs, the rows already hold every epoch (rank_rows): the trainer makes one pass over them.
        num_train_epochs=1,
        seed=t.seed,
        data_seed=t.seed,
        max_length=t.seq_len,
        # The trainer logs every step, so its loss window is one step; the callback writes every log_every steps.
        logging_strategy="steps",
        logging_steps=1,
        save_strategy="steps" if t.checkpoint_every else "no",
        save_steps=t.checkpoint_every or 500,
        report_to="none",
        disable_tqdm=True,
        bf16=bf16,
        use_cpu=rt.device == "cpu",
        # Blocks arrive packed and the engine's loader applies TRL's padding-free collator; TRL's own packing and
        # padding-free switches would re-pack the rows and refuse that collator.
        packing=False,
        padding_free=False,
        dataset_kwargs={"skip_prepare_dataset": True},
        remove_unused_columns=False,
        assistant_only_loss=False,  # the labels carry the assistant-only mask already
        completion_only_loss=False,
        router_aux_loss_coef=0.0,
        average_tokens_across_devices=True,
        ddp_find_unused_parameters=False,
        dataloader_pin_memory=rt.device == "cuda",
        use_liger_kernel=liger,
    )
    if fsdp is not None:
        kwargs.update(fsdp=True, fsdp_config=fsdp)
    # TRL turns gradient checkpointing on by default; it follows the spec here. Under FSDP the recomputation is
    # FSDP's own (fsdp_config above): the trainer's would add an all-gather per layer in backward. Newer
    # transformers call it activation_checkpointing and keep the old name as an alias.
    recompute = t.activation_checkpointing and fsdp is None
    kwargs["gradient_checkpointing"] = recompute
    if "activation_checkpointing" in {f.name for f in dataclasses.fields(SFTConfig)}:
        kwargs["activation_checkpointing"] = recompute
    return SFTConfig(**kwargs)


def _trainer_class() -> type:
    from accelerate.utils import DistributedType
    from trl import SFTTrainer

    class RunnerSFTTrainer(SFTTrainer):
        """SFTTrainer over this rank's own loader, FSDP2 on CPU ranks too, with exact per-rank loss sums."""

        def __init__(self, *args: Any, rank_loader: Any, spec: RunSpec, cpu_fsdp_plugin: Any = None, **kwargs: Any):
            self._rank_loader = rank_loader
            self._spec = spec
            self._cpu_fsdp_plugin = cpu_fsdp_plugin
            self.ce_sum = 0.0
            self.targets = 0
            self.real_tokens = 0
            self.doc_len_sq = 0
            super().__init__(*args, **kwargs)
            # TRL patched the causal LM's forward with its fused LM head; wrapping that patch gives this rank's
            # exact token-loss sum and target count per micro-batch, whatever normalisation the trainer applies.
            inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            fused = inner.forward

            def recording_forward(*a: Any, **k: Any) -> Any:
                out = fused(*a, **k)
                log_probs = getattr(out, "log_probs", None)
                if log_probs is not None and torch.is_grad_enabled():
                    self.ce_sum += float(-log_probs.detach().double().sum())
                    self.targets += int(out.label_mask.sum())
                return out

            inner.forward = recording_forward

        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            plugin = self._cpu_fsdp_plugin
            if plugin is not None and self.accelerator.distributed_type == DistributedType.MULTI_CPU:
                # accelerate enables FSDP only on accelerator devices; switching the process-wide state after
                # creation runs the same FSDP2 preparation, state-dict gathering and checkpointing on gloo. Both
                # shared states change: AcceleratorState copies PartialState's type whenever it is built again.
                # accelerate's collectives choose their gloo variants from the backend, not from this type.
                from accelerate.state import PartialState

                PartialState._shared_state["distributed_type"] = DistributedType.FSDP
                self.accelerator.state.distributed_type = DistributedType.FSDP
                self.accelerator.state.fsdp_plugin = plugin
                self.is_fsdp_enabled = True

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            # The engines' one schedule (runner.train.schedule), over train.max_steps as the native engine counts:
            # transformers' own would run the first warmup step at lr 0.
            if self.lr_scheduler is None:
                spec = self._spec
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, lambda i: lr_at(spec, i + 1, spec.train.max_steps) / spec.train.lr)
                self._created_lr_scheduler = True
            return self.lr_scheduler

        def get_train_dataloader(self) -> Any:
            return self._rank_loader

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            self.real_tokens += int(inputs.pop("real_tokens", 0))
            self.doc_len_sq += int(inputs.pop("doc_len_sq", 0))
            rows, trained = inputs.pop("rows", None), getattr(self._rank_loader, "trained", None)
            if rows is not None and trained is not None and torch.is_grad_enabled():
                trained.trained(rows)  # the record's packing statistics count what trained
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    return RunnerSFTTrainer


def _event_callback(spec: RunSpec, rt: Runtime, events: EventWriter, trainer_ref: list, evaluator: Any = None) -> Any:
    from transformers import TrainerCallback

    class EventCallback(TrainerCallback):
        """Writes the runner's per-step events and stops every rank together on a cancel request."""

        def __init__(self) -> None:
            self.mark = time.perf_counter()
            self.pending: dict[str, Any] | None = None
            self.tokens_total = 0
            self.last_loss: float | None = None
            self.cancelled = False
            self.evaluated_at: int | None = None
            self.stopped_early: int | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            if evaluator is not None and state.global_step:  # resumed: early stopping counts on
                evaluator.restore(read_events(Path(events._f.name)), state.global_step)
            return control

        def evaluate(self, step: int) -> bool:
            """The runner's eval (runner.train.evaluation) on the trainer's model; True when it says stop."""
            tr = trainer_ref[0]
            self.evaluated_at = step
            if not hasattr(tr.model, EVAL_METHOD):
                attach_eval(tr.model)
            with tr.accelerator.autocast():
                stop = evaluator.run(tr.model, step, events)["stop"]
            self.mark = time.perf_counter()  # the eval's time is not the next step's
            return stop

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            tr = trainer_ref[0]
            now = time.perf_counter()
            step = state.global_step
            self.tokens_total += tr.real_tokens
            # One small all-reduce per step: the global loss sum and target count, and whether any rank was asked
            # to stop (so all ranks stop after the same step).
            agree = torch.tensor([tr.ce_sum, float(tr.targets), float(rt.stop_requested),
                                  float(rt.checkpoint_requested)], dtype=torch.float64, device=rt.device)
            dist.all_reduce(agree, op=dist.ReduceOp.SUM)
            ce, n, stop, save = (float(x) for x in agree.tolist())
            step_loss = ce / n if n else None  # None: no rank had a target token in this step
            self.last_loss = step_loss if step_loss is not None else self.last_loss
            if step % spec.train.log_every == 0 or step >= state.max_steps or stop:
                loader = tr._rank_loader
                self.pending = dict(step=step, loss=tr.ce_sum / tr.targets if tr.targets else None,
                                    tokens=tr.real_tokens, step_s=round(now - self.mark, 6), mem_gib=rt.mem_gib(),
                                    global_loss=step_loss, target_tokens=tr.targets,
                                    data_s=round(loader.wait_s, 6), doc_len_sq=tr.doc_len_sq)
            tr.ce_sum, tr.targets, tr.real_tokens, tr.doc_len_sq = 0.0, 0, 0, 0
            tr._rank_loader.wait_s = 0.0
            self.mark = now
            if stop:
                self.cancelled = True
                control.should_training_stop = True
                # SIGTERM / SIGUSR1: an emergency checkpoint, whatever train.checkpoint_every says.
                control.should_save = control.should_save or bool(save)
            elif evaluator is not None and evaluator.due(step) and self.evaluate(step):
                self.stopped_early = step  # the eval loss is global: every rank stops on this step
                control.should_training_stop = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> Any:
            # The trainer logs after on_step_end; its logs carry the step's grad norm and learning rate.
            if self.pending is None or not logs or "loss" not in logs:
                return control
            p, self.pending = self.pending, None
            grad_norm = logs.get("grad_norm")
            events.step(step=p.pop("step"), loss=p.pop("loss"), lr=float(logs.get("learning_rate", 0.0)),
                        grad_norm=float(grad_norm) if grad_norm is not None else None, tokens=p.pop("tokens"),
                        step_s=p.pop("step_s"), mem_gib=p.pop("mem_gib"), **p)
            return control

    return EventCallback()


# ---------------------------------------------------------------------------------------------
# Export


def export(trainer: Any, spec: RunSpec, rt: Runtime, run_dir: Path, tokenizer: Any) -> dict[str, Any] | None:
    """output.save through the trainer: the adapter (peft files), the full model, or a LoRA run merged into its
    base (output.save=merged, or full for a LoRA run) as safetensors.

    Collective (FSDP gathers the weights); rank 0 writes and returns {dir, kind, files: {name: sha256}}.
    """
    from runner.train.export import file_hashes

    saved = saved_as(spec)
    if saved == "none":
        return None
    out = RunPaths(run_dir).export
    if saved == "merged" or (saved == "full" and spec.method.kind == "lora"):
        _export_merged(trainer, spec, rt, out, tokenizer)
    else:
        trainer.save_model(str(out))  # a peft model saves its adapter; a full fine-tune, the model
    if rt.rank == 0:
        tokenizer.save_pretrained(str(out))
        training_args = out / "training_args.bin"  # a pickle of the trainer's arguments, not part of a model
        training_args.unlink(missing_ok=True)
    dist.barrier()
    if rt.rank != 0:
        return None
    return {"dir": str(out), "kind": saved, "files": file_hashes(out)}


def _export_merged(trainer: Any, spec: RunSpec, rt: Runtime, out: Path, tokenizer: Any) -> None:
    # The sharded LoRA model is gathered once; rank 0 folds the adapter into the base weights (runner.train.merge).
    from runner.train.export import adapter_config, write_merged

    state = trainer.accelerator.get_state_dict(trainer.model)
    if rt.rank == 0:
        write_merged(state, adapter_config(trainer.model), spec, tokenizer, out)


# ---------------------------------------------------------------------------------------------
# The engine


def _run_dir(events: EventWriter) -> Path:
    return Path(events._f.name).resolve().parent.parent  # runs/<id>/events/rank<r>.jsonl


def train(spec: RunSpec, rt: Runtime, events: EventWriter, decisions: Decisions, run_dir: Path | None = None,
          resume: bool = False) -> dict[str, Any]:
    """Train with TRL to the end of the data or max_steps, as `decisions` say (attention, FSDP wrapping,
    precision: runner.decide); returns the rank's summary for its end event.

    resume: continue from the latest trainer checkpoint in run_dir/checkpoints (model, optimizer, schedule, RNG, data).
    """
    from runner.train.model import DTYPES, load_config, load_tokenizer

    t = spec.train
    run_dir = Path(run_dir) if run_dir is not None else _run_dir(events)
    config = load_config(spec)
    check(spec, config, rt.device)
    choice = decisions.attention
    tokenizer = load_tokenizer(spec)
    torch.manual_seed(t.seed)
    model = load_model(spec, rt.device, config, choice.impl, choice.kernel)
    lora_left_out = lora_notes(model, spec)  # before the adapters: what 'all-linear' and LoRA leave out
    model = apply_lora(model, spec) if spec.method.adapters else model
    n_params = sum(p.numel() for p in model.parameters())
    wrapped = decisions.fsdp
    prec = decisions.precision_of
    bf16 = prec.autocast
    packing_mechanism = keep_documents_apart(model, t.packing,
                                             torch.bfloat16 if bf16 else DTYPES.get(spec.model.dtype, torch.float32))

    stats = PackStats()
    dataset, loader, own_rows, n_rows = rank_dataset(spec, tokenizer, rt, stats)

    fsdp = fsdp_settings(model, spec) if wrapped else None
    if fsdp is None and bf16:
        fp32_master_weights(model)
    liger = decisions.liger  # TRL's best measured settings (flex attention + liger) include them
    args = sft_config(spec, rt, RunPaths(run_dir).checkpoints, fsdp, bf16, liger)
    cpu_plugin = None
    if fsdp is not None and rt.device == "cpu":
        from accelerate.utils import FullyShardedDataParallelPlugin
        cpu_plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    trainer_ref: list = []
    evaluator = with_samples(Evaluator.build(spec, tokenizer, rt.rank, rt.world_size, rt.device,
                                             pass_boundaries=False), spec, tokenizer, rt)
    callback = _event_callback(spec, rt, events, trainer_ref, evaluator)
    trainer = _trainer_class()(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                               callbacks=[callback], rank_loader=loader, spec=spec, cpu_fsdp_plugin=cpu_plugin)
    trainer_ref.append(trainer)

    n_trainable = trainable_params(model)
    begin = dict(max_steps=t.max_steps, engine="trl", params=n_params, trainable_params=n_trainable,
                 model_type=getattr(config, "model_type", None), init=spec.model.init, lora_left_out=lora_left_out,
                 mxfp4_dequantized=is_mxfp4(config) and spec.model.init != "random",
                 **choice.to_dict(), packed_mask_hook=packing_mechanism == PACKED_MASK_HOOK,
                 packing_mechanism=packing_mechanism, liger_kernels=liger, loss_impl=decisions.loss_impl,
                 loss_reason=decisions.loss_reason, levers=decisions.levers, decisions=decisions.to_dict(),
                 packing=("packed: exact seq_len blocks" if t.packing else "one document per block")
                 + " (runner.train.data), TRL padding-free collator",
                 fsdp=f"fsdp2 (accelerate) over {rt.world_size} rank(s)" if fsdp else "none (one rank)",
                 fsdp_sharded=bool(fsdp), quantization=bnb_4bit_record(spec),
                 precision=prec.describe() if bf16 else str(next(model.parameters()).dtype),
                 optimizer_precision=t.optimizer_precision,
                 lr_scheduler=lr_scheduler_type(spec), warmup=warmup(spec), rows=own_rows, rows_padded_to=n_rows,
                 tokenisation="generation markers" if has_generation_markers(tokenizer) else "prefix bracketing")
    events.train_begin(**begin)
    if rt.rank == 0:
        print(f"[trl] params {n_params:,}, trainable params {n_trainable:,} "
              f"({100 * n_trainable / max(1, n_params):.4f}%); attn {choice.impl}; {begin['packing']}; fsdp {begin['fsdp']}",
              flush=True)

    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=_resume_from(run_dir) if resume else None)
    rt.synchronize()
    elapsed = time.perf_counter() - start - (evaluator.seconds if evaluator else 0.0)
    step = int(trainer.state.global_step)
    if evaluator is not None and not callback.cancelled and step > 0 and callback.evaluated_at != step:
        callback.evaluate(step)
    exported = None if callback.cancelled else export(trainer, spec, rt, run_dir, tokenizer)
    return end_summary(rt, trainer.model, stats, steps=step, tokens=callback.tokens_total, train_s=elapsed,
                       final_loss=callback.last_loss, cancelled=callback.cancelled,
                       stopped_early=callback.stopped_early, params=n_params, trainable_params=n_trainable,
                       exported=exported)
