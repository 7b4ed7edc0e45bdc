"""Every choice an engine makes about a run, in one place: the attention path, whether one rank is FSDP-wrapped, loss
implementation and chunk sizes, precision (autocast, master weights), and LoRA target matching.

Both engines call these at run time and the estimator calls them when it plans, so a plan and a run cannot disagree.
No torch here: what depends on the installed kernels is probed by the engines (runner.train.attention
`available_kernels`) and passed in as `Kernels`; the estimator passes `Kernels.assumed(device)`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runner.engines import engine_for
from runner.facts.families import EAGER, FLASH, FLEX, SDPA, VARLEN, Family, family_of, text_config
from runner.engines import tokens_per_forward

VARLEN_MIN_TOKENS = 32_768
"""auto on CUDA picks varlen from this many tokens per forward, flex below: on one H200 compiled flex attention
is the faster at 8,192 tokens per forward and the slower at 32,768 (references.md; the times in
benchmarks/README.md); the crossover between them has not been measured."""

# ---------------------------------------------------------------------------------------------
# Attention


@dataclass(frozen=True)
class Kernels:
    """Which attention kernels this machine has (probed by the engines, assumed by the estimator)."""

    varlen: bool = False
    """torch.nn.attention.varlen (PyTorch >= 2.10) on CUDA."""
    flash_attn: bool = False
    """The flash-attn package on CUDA."""
    flex: bool = True
    """torch.nn.attention.flex_attention."""
    varlen_window: bool = True
    """torch's varlen_attn takes window_size (sliding-window layers need it)."""
    fa4: bool = False
    """flash-attn-4 (its CuTe kernels) on an SM 9.x/10.x GPU: runner.train.fa4."""
    liger: bool = False
    """liger-kernel on CUDA (its layer kernels, which the TRL engine applies)."""

    @classmethod
    def assumed(cls, device: str, fa4: bool = False) -> Kernels:
        """What a plan assumes without probing: on CUDA torch's varlen and flex, liger-kernel, no flash-attn, and
        flash-attn-4 when `fa4` (installed here, or asked for by the spec); on CPU none of the CUDA kernels."""
        return cls(varlen=device == "cuda", flash_attn=False, flex=True, fa4=fa4 and device == "cuda",
                   liger=device == "cuda")


@functools.cache  # the planner asks once per candidate it prices (thousands): one look at the installed packages
def fa4_installed() -> bool:
    """Whether the flash-attn-4 package is importable here (no import of it: a plan made on the GPU node assumes it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("flash_attn") is not None and \
            importlib.util.find_spec("flash_attn.cute") is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class AttentionChoice:
    """The HF attention implementation to load the model with, and why (recorded in the train_begin event)."""

    impl: str
    reason: str
    kernel: str = ""
    """The kernel behind varlen attention (`varlen_kernel`); empty for other paths."""

    def to_dict(self) -> dict[str, str]:
        out = {"attn": self.impl, "attn_reason": self.reason}
        if self.kernel:
            out["attn_kernel"] = self.kernel
        return out

    def with_kernel(self, requested: str, kernels: Kernels, config: Any) -> AttentionChoice:
        """This choice with its varlen kernel filled in (model.varlen_kernel `requested`)."""
        if self.impl != VARLEN:
            return self
        return dataclasses.replace(self, kernel=varlen_kernel(requested, kernels, head_dim(config)))


def packed_attention_paths(config: Any, device: str, supported: Iterable[str] | None = None,
                           packed: bool = True, family: Family | None = None) -> list[str]:
    """The attention paths that keep packed documents apart for this model on this device, fastest first.

    `config` (None = any attention-only model) gives the family's exact paths (runner.facts.families: attention sinks
    allow eager and, on CUDA, flex; attention softcapping excludes varlen and sdpa); `supported` is what the
    model class declares and can mask (runner.train.attention `supported_attention`, None = everything).
    On CPU only sdpa and eager train: varlen and flash are CUDA kernels, and flex attention has no backward on CPU.
    `packed=False` (one document per block): a family whose recurrent layers rule packing out may use any path.
    `family`: `family_of(config)`, where the caller has it (the planner decides many candidates of one model).
    """
    fam = family if family is not None or config is None else family_of(config)
    paths = list(fam.attention_paths) if fam is not None else []
    if not paths and (config is None or not packed):
        paths = [VARLEN, FLASH, FLEX, SDPA, EAGER]
    if supported is not None:
        allowed = set(supported)
        paths = [p for p in paths if p in allowed]
    if device != "cuda":
        paths = [p for p in paths if p not in (VARLEN, FLASH, FLEX)]
    return paths


def choose_attention(requested: str, device: str, tokens_per_forward: int, supported: Iterable[str] | None = None,
                     config: Any = None, kernels: Kernels | None = None, packed: bool = True,
                     varlen_request: str = "auto", family: Family | None = None) -> AttentionChoice:
    """Pick the attention path that keeps packed documents apart, fastest first, for this model on this device.

    `requested` other than "auto" is kept as given (`attention_refusal` says when it cannot work). `supported`:
    what the model class declares (None = everything); `config`: the model's config, for its family's exact paths
    (None = any attention-only model); `kernels`: what is installed (None = `Kernels.assumed(device)`). With no
    path left the choice is eager, which `attention_refusal` then refuses. `packed`: train.packing;
    `varlen_request`: model.varlen_kernel (varlen through flash-attn-4 is picked at any block length); `family`:
    `family_of(config)`, where the caller has it.
    """
    if requested != "auto":
        return AttentionChoice(requested, "set by model.attn_implementation")
    kernels = kernels or Kernels.assumed(device)
    fam = family if family is not None or config is None else family_of(config)
    paths = packed_attention_paths(config, device, supported, packed, fam)
    if fam is not None and fam.sliding_window and not kernels.varlen_window:
        paths = [p for p in paths if p != VARLEN]
    sinks = " (attention sinks)" if fam is not None and fam.attention_sinks else ""
    if device != "cuda":
        impl = next((p for p in (SDPA, EAGER) if p in paths), EAGER)
        return AttentionChoice(impl, f"CPU{sinks}: {impl} with the block-diagonal mask transformers builds from the "
                                     "restarting position_ids (varlen and flash kernels are CUDA-only)")
    if kernels.flash_attn and FLASH in paths:
        return AttentionChoice(FLASH, "flash-attn is installed: varlen kernel fed cu_seqlens")
    fa4 = varlen_kernel(varlen_request, kernels, head_dim(config)) == FA4_KERNEL
    if kernels.varlen and VARLEN in paths and fa4:
        return AttentionChoice(VARLEN, "flash-attn-4 is installed for this GPU: its varlen kernel fed cu_seqlens, "
                                       "no mask materialised")
    if kernels.varlen and VARLEN in paths and tokens_per_forward >= VARLEN_MIN_TOKENS:
        return AttentionChoice(VARLEN, f"{tokens_per_forward} tokens per forward >= {VARLEN_MIN_TOKENS}: "
                                       "torch varlen_attn fed cu_seqlens, no mask materialised")
    if kernels.flex and FLEX in paths:
        return AttentionChoice(FLEX, f"{tokens_per_forward} tokens per forward{sinks}: flex attention with a "
                                     "document block mask")
    if kernels.varlen and VARLEN in paths:
        return AttentionChoice(VARLEN, "torch varlen_attn fed cu_seqlens (flex attention unavailable for this "
                                       "model)")
    impl = next((p for p in (SDPA, EAGER) if p in paths), EAGER)
    return AttentionChoice(impl, f"no varlen, flash or flex kernel for this model: {impl} with a dense "
                                 "block-diagonal mask (slow)")


FA4_MAX_HEAD_DIM = 128
"""flash-attn-4 takes head sizes that are multiples of 8 up to this on every GPU it supports (SM90 goes to 256)."""
FA4_MIN_HEAD_DIM = 32
"""And from this up: with heads of 16 its SM90 backward returns wrong query gradients while the forward is right;
32, 64 and 128 are within bf16 rounding (an H100, flash-attn-4 4.0.0b40: benchmarks/fa4-head-sizes-h100.txt)."""

TORCH_KERNEL, FA4_KERNEL = "torch", "flash-attn-4"


def head_dim(config: Any) -> int | None:
    """The attention head size of a config (object or config.json dict); None when it cannot be read."""
    if config is None:
        return None
    text = text_config(config)
    get = text.get if isinstance(text, dict) else (lambda k, d=None: getattr(text, k, d))
    size = get("head_dim")
    if not size and get("hidden_size") and get("num_attention_heads"):
        size = get("hidden_size") // get("num_attention_heads")
    return int(size) if size else None


def varlen_kernel(requested: str, kernels: Kernels, head_dim: int | None) -> str:
    """The kernel behind varlen attention: flash-attn-4 where it is installed for this GPU and takes the model's
    head size, else PyTorch's varlen_attn (FlashAttention-2). `requested`: model.varlen_kernel; a request for
    flash-attn-4 that cannot be met falls back to torch's (preflight says why: `varlen_kernel_refusal`)."""
    fits = bool(head_dim) and head_dim % 8 == 0 and FA4_MIN_HEAD_DIM <= head_dim <= FA4_MAX_HEAD_DIM
    if requested != TORCH_KERNEL and kernels.fa4 and fits:
        return FA4_KERNEL
    return TORCH_KERNEL


def varlen_kernel_refusal(requested: str, kernels: Kernels, head_dim: int | None) -> str | None:
    """Why model.varlen_kernel=flash-attn-4 cannot be honoured here (None when it can, or was not asked for)."""
    if requested != FA4_KERNEL or varlen_kernel(requested, kernels, head_dim) == FA4_KERNEL:
        return None
    if not kernels.fa4:
        return ("model.varlen_kernel=flash-attn-4 needs the flash-attn-4 package and an SM 9.x/10.x GPU (H100, "
                "H200, B200...): install it (pip install flash-attn-4) or set model.varlen_kernel=auto")
    return (f"model.varlen_kernel=flash-attn-4 takes head sizes that are multiples of 8 from {FA4_MIN_HEAD_DIM} to "
            f"{FA4_MAX_HEAD_DIM}; "
            f"this model's is {head_dim}: set model.varlen_kernel=auto")


ULYSSES = "ulysses"
"""The attention of a sequence-parallel run (runner.train.ulysses): whatever the path picked for whole blocks."""


def sequence_parallel_attention(choice: AttentionChoice, size: int) -> AttentionChoice:
    """The attention a run with hardware.sequence_parallel=`size` loads: Ulysses over `choice` when size > 1."""
    if size <= 1:
        return choice
    return AttentionChoice(ULYSSES, f"hardware.sequence_parallel={size}: heads exchanged for sequence over {size} "
                           "ranks (Ulysses), SDPA over the whole block with its document mask")


def plan_attention(spec: Any, config: Any, device: str, kernels: Kernels | None = None) -> AttentionChoice:
    """The attention path a run of `spec` takes on `device`, from the model's config (object or config.json dict)
    alone: what the estimator plans. The engines make the same call with the model class's declared support, which
    the registry's paths already reflect for the families it lists (tests check both agree); `kernels` defaults to
    `Kernels.assumed(device)` (a machine with flash-attn installed picks flash_attention_2 at run time)."""
    t = spec.train
    kernels = kernels or Kernels.assumed(device, spec.model.varlen_kernel == FA4_KERNEL or (
        spec.model.varlen_kernel == "auto" and fa4_installed()))
    choice = choose_attention(spec.model.attn_implementation, device, tokens_per_forward(t), None, config,
                              kernels, t.packing, spec.model.varlen_kernel).with_kernel(spec.model.varlen_kernel,
                                                                                        kernels, config)
    return sequence_parallel_attention(choice, spec.hardware.sequence_parallel)


def attention_refusal(impl: str, device: str, config: Any = None, supported: Iterable[str] | None = None,
                      kernels: Kernels | None = None, packed: bool = True) -> tuple[str, str] | None:
    """(why `impl` cannot train this model on packed blocks here, the fix), or None when it can.

    Covers kernels missing on this device and paths that would mix documents or drop part of the family's attention
    (sinks, softcapping) or that the model class does not support.
    """
    kernels = kernels or Kernels.assumed(device)
    if impl == VARLEN and (device != "cuda" or not kernels.varlen):
        return "varlen needs CUDA and torch.nn.attention.varlen (PyTorch >= 2.10)", "use auto"
    if impl == FLASH and (device != "cuda" or not kernels.flash_attn):
        return "flash_attention_2 needs CUDA and the flash-attn package", "use auto"
    if impl == FLEX and not kernels.flex:
        return "flex_attention needs torch.nn.attention.flex_attention", "use auto"
    if impl == FLEX and device != "cuda":
        sinks = config is not None and family_of(config).attention_sinks
        return ("flex attention has no backward on CPU" + (" and applies attention sinks only on CUDA" if sinks
                                                            else ""), "use auto (eager or sdpa on CPU)")
    if impl == VARLEN and config is not None and family_of(config).sliding_window and not kernels.varlen_window:
        return "this PyTorch's varlen_attn has no window_size, and the model has sliding-window layers", "use auto"
    paths = packed_attention_paths(config, device, supported, packed)
    if impl in paths:
        return None
    fam = family_of(config) if config is not None else None
    name = fam.model_type if fam is not None else "this model"
    good = ", ".join(paths) or "none"
    if fam is not None and fam.attention_sinks:
        why = f"{name} adds attention-sink logits, which {impl} does not apply on {device}"
    elif fam is not None and fam.logit_softcapping and impl in (VARLEN, SDPA):
        why = f"{name} soft-caps its attention scores, which {impl} does not do"
    elif supported is not None and impl not in set(supported):
        why = f"{name} does not support {impl} on packed blocks"
    else:
        why = f"{impl} cannot keep packed documents apart for {name} on {device}"
    fix = f"use auto or one of: {good}" if paths else "set train.packing=false (one document per block)"
    return why, fix


# ---------------------------------------------------------------------------------------------
# FSDP and precision


def fsdp_wrapped(engine: str, world: int, device: str, fsdp_one_rank: bool, weights_bf16: bool = True) -> bool:
    """Whether the model is wrapped in FSDP2.

    Always with more than one rank. One process has nothing to shard: FSDP2 there only copies each layer in and its
    gradients out, and its hooks cost host time that short steps cannot hide, so one rank trains the plain module
    unless `train.fsdp_one_rank` asks. The native engine also wraps one GPU rank whose weights are not bf16 (FSDP's
    mixed precision is then what computes them in bf16); accelerate (the TRL engine) refuses FSDP for one CPU process.
    """
    if world > 1:
        return True
    e = engine_for(engine)
    if fsdp_one_rank:
        return device == "cuda" or e.fsdp_one_cpu_rank
    return e.fsdp_one_gpu_rank_unless_bf16 and device == "cuda" and not weights_bf16


@dataclass(frozen=True)
class Precision:
    """How an engine computes and what the optimizer steps."""

    compute: str
    """Dtype of the matmuls: bfloat16 | float32."""
    master: str
    """Dtype of the trainable weights the optimizer steps."""
    autocast: bool
    """bf16 autocast (the TRL engine's `bf16=True`) rather than bf16 weights / FSDP mixed precision."""

    def describe(self) -> str:
        if self.autocast:
            return f"bf16 autocast over {'fp32' if self.master == 'float32' else self.master} trainable weights"
        if self.compute == self.master:
            return self.compute
        return f"{self.compute} compute over {self.master} weights"


def precision(engine: str, device: str, model_dtype: str, fsdp: bool) -> Precision:
    """The engine's precision for a resolved `model.dtype` (bfloat16 | float32).

    TRL: bf16 autocast on CUDA unless model.dtype is float32; its trainable weights are made fp32 (accelerate does it
    under FSDP; one unwrapped process casts them, `fp32_master_weights`). Native: on CUDA FSDP's mixed precision
    computes in bf16 over weights kept in model.dtype (an unwrapped rank holds bf16 weights, `fsdp_wrapped`); on CPU
    everything stays in model.dtype (exact replays).
    """
    if engine_for(engine).autocast:
        bf16 = device == "cuda" and model_dtype != "float32"
        if bf16:
            return Precision("bfloat16", "float32", True)
        return Precision(model_dtype, model_dtype, False)
    if device == "cuda" and (fsdp or model_dtype == "bfloat16"):
        return Precision("bfloat16", model_dtype, False)
    return Precision(model_dtype, model_dtype, False)


# ---------------------------------------------------------------------------------------------
# Loss

CHUNK_LOGIT_BYTES = 2**28
"""Logits of one chunk of the chunked loss in float32: about 256 MiB whatever the vocabulary."""
FUSED_CHUNK_BYTES = 2**29
"""The fused loss holds a chunk's bf16 logits and their bf16 gradient: about 512 MiB. Larger chunks than the chunked
loss's because each chunk re-reads and re-writes lm_head's whole weight gradient (addmm_): at 256 tokens that
traffic, not the matrix products, set the chunk's time."""


def _tokens_within(budget: int, bytes_per_elem: int, vocab_size: int) -> int:
    n = budget // (bytes_per_elem * max(1, vocab_size))
    return max(256, min(8192, n // 256 * 256))


def chunk_tokens_for(vocab_size: int) -> int:
    """Tokens per lm_head chunk of the chunked loss (multiples of 256, 256..8192): one chunk's float32 logits stay
    near CHUNK_LOGIT_BYTES."""
    return _tokens_within(CHUNK_LOGIT_BYTES, 4, vocab_size)


def fused_chunk_tokens_for(vocab_size: int) -> int:
    """Tokens per chunk of the fused loss (multiples of 256, 256..8192): bf16 logits + their bf16 gradient near
    FUSED_CHUNK_BYTES."""
    return _tokens_within(FUSED_CHUNK_BYTES, 2 + 2, vocab_size)


def loss_chunk_tokens(loss_impl: str, vocab_size: int) -> int | None:
    """Tokens per lm_head chunk of the native engine's `loss_impl` (None for a loss that is not chunked)."""
    if loss_impl == "chunked":
        return chunk_tokens_for(vocab_size)
    if loss_impl == "fused":
        return fused_chunk_tokens_for(vocab_size)
    return None


def chunked_supported(config: Any) -> str | None:
    """Why a chunked/fused loss over lm_head would differ from the model's own logits (None when it is exact)."""
    text = text_config(config)
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling"):
        value = text.get(name) if isinstance(text, dict) else getattr(text, name, None)
        if value not in (None, 1, 1.0):
            return f"the model transforms its logits ({name})"
    return None


def resolve_loss_impl(requested: str, config: Any) -> tuple[str, str]:
    """The native engine's loss: (full | chunked | fused, reason); auto = chunked unless the model post-processes its
    logits. Raises ValueError when chunked/fused is asked for such a model."""
    if requested == "full":
        return "full", "set by train.loss_impl"
    problem = chunked_supported(config)
    if requested in ("chunked", "fused"):
        if problem:
            raise ValueError(f"train.loss_impl={requested} cannot reproduce this model's loss: {problem}; use full")
        return requested, "set by train.loss_impl"
    if problem:
        return "full", f"{problem}: chunked lm_head would differ"
    return "chunked", "no full logits tensor; lm_head over target tokens in checkpointed chunks"


def choose_loss(engine: str, requested: str, config: Any) -> tuple[str, str]:
    """(loss implementation, reason) for either engine: the native engine's `resolve_loss_impl`; `trl-fused` for the
    TRL engine (SFTTrainer's fused LM head, whatever train.loss_impl says)."""
    fixed = engine_for(engine).fixed_loss
    if fixed is not None:
        return fixed
    return resolve_loss_impl(requested, config)


# ---------------------------------------------------------------------------------------------
# LoRA target matching (peft's rules, as runner.train.lora applies them)

ALL_LINEAR = "all-linear"


def lora_module_targeted(name: str, target_modules: str | Iterable[str], is_output_head: bool = False) -> bool:
    """Whether peft's LoRA adapts the module with full dotted `name` ("model.layers.0.self_attn.q_proj").

    peft's rules: "all-linear" = every Linear except the output head (the caller says which names are Linear); a
    single string is a regex over the full name (re.fullmatch); a list entry matches the full name or a suffix at a
    dot boundary.
    """
    if isinstance(target_modules, str):
        if target_modules == ALL_LINEAR:
            return not is_output_head
        return re.fullmatch(target_modules, name) is not None
    return any(name == t or name.endswith("." + t) for t in target_modules)


def lora_parameter_targeted(name: str, target_parameters: Iterable[str]) -> bool:
    """Whether peft adapts the tensor with full dotted `name` ("model.layers.0.mlp.experts.gate_up_proj") through
    `target_parameters`: the full name, or a suffix at a dot boundary."""
    return any(name == t or name.endswith("." + t) for t in target_parameters)


def lora_rank_key(name: str, rank_pattern: dict[str, int]) -> str | None:
    """The rank_pattern key that applies to the adapted module or tensor `name` (peft's get_pattern_key: the first
    key, in order, whose regex matches the name's end at a dot boundary), or None."""
    for key in rank_pattern:
        if re.match(rf"(.*\.)?({key})$", name):
            return key
    return None


def lora_rank(name: str, r: int, rank_pattern: dict[str, int]) -> int:
    """The LoRA rank peft gives `name`: its rank_pattern entry, else r."""
    key = lora_rank_key(name, rank_pattern)
    return int(rank_pattern[key]) if key is not None else int(r)
