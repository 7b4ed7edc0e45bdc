"""Per-GPU memory and time before launch."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.catalog import (
    LAYER_LINEAR,
    LAYER_SLIDING,
    Arch,
    GpuType,
    LoadedArch,
    detect_gpu,
    gpu_type,
    load_arch,
)
from runner.errors import Problem, UserError
from runner.spec import RunSpec, apply_override, load_spec

GIB = 1024**3

# =============================================================================================
# Constants. Each is named once here with its source (benchmarks/estimator-notes.md has the derivations and the
# measured rows they were fitted on or checked against: benchmarks/memory-calibration-h200.json, native-h200.json).

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
ADAM_STATES_PER_PARAM = 2
"""torch.optim.AdamW keeps exp_avg and exp_avg_sq in the parameter's dtype."""
TRL_TRAINABLE_BYTES = 4
"""accelerate's FSDP2 preparation upcasts every trainable parameter to fp32 when mixed precision is on
(accelerate/utils/fsdp_utils.py, fsdp2_prepare_model), and one unwrapped TRL process does the same
(trl_engine.fp32_master_weights): fp32 master + fp32 grad + 2 fp32 Adam states = 16 B."""
NATIVE_REDUCE_BYTES = 4
"""runner/train/model.py: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): reduce-scatter input in fp32."""
TRL_REDUCE_BYTES = 2
"""accelerate's bf16 FSDP2 policy reduces in bf16 (utils/dataclasses.py: param_dtype = reduce_dtype = bf16)."""

LOGITS_BYTES_PER_ELEM = 14.0
"""Peak bytes per (token × vocab) of a full cross-entropy. Counted: bf16 logits (2) + fp32 upcast (4) + log_softmax
output (4) in forward; in backward the saved log_softmax output (4) + its incoming grad (4) + the upcast's grad (4)
= 12, plus the bf16 logits (2) when the loop still holds the model output (the 27B notebook's `out`). Calibrated
to 14: the H200 plain-loop peaks (Qwen3 1.72B, 36.5 GiB at 8k and 88.0 GiB at 32k) rise by 2.25 MB per token."""
CHUNKED_LOSS_BYTES_PER_ELEM = 12.0
"""Peak bytes per (token × vocab) of one chunk's backward in the chunked loss: the recomputed fp32 log-softmax
output, its incoming gradient and the gradient of the fp32 logits (4 + 4 + 4)."""
CHUNKED_LOSS_FORWARD_BYTES_PER_ELEM = 10.0
"""The same in one chunk's forward: bf16 logits (2), their fp32 copy (4) and the log-softmax output (4); nothing
of it is kept (the chunk is checkpointed)."""
FUSED_LOSS_BYTES_PER_ELEM = 6.0
"""Peak bytes per (token × vocab) of one chunk in the native fused loss (runner/train/loss.py
FusedLinearCrossEntropy) run eagerly: the bf16 logits and their fp32 copy (2 + 4), later the fp32 softmax and its
bf16 cast (4 + 2); the softmax is made in place of the fp32 logits."""
FUSED_LOSS_COMPILED_BYTES_PER_ELEM = 4.0
"""The same with train.compile on GPU: the chunk's softmax and gradient are one compiled pass that keeps the fp32
values in registers, so only the bf16 logits and their bf16 gradient exist (2 + 2)."""
TRL_FUSED_LOSS_BYTES_PER_TOKEN_EXTRA = 16.0
"""TRL ≥ 1.16 SFTTrainer computes the loss with its fused LM head (trl/trainer/utils.py add_fused_lm_head: chunked
log-probs, a Triton kernel on CUDA) and never holds a tokens × vocab tensor: what remains per token is the gathered
hidden state and a few per-token outputs (log-prob, entropy, top-1 flag)."""
CHUNK_LOGIT_BYTES = 2**28
"""Mirrors runner/train/loss.py: a chunk holds about 256 MiB of fp32 logits (256..8192 tokens, multiples of 256)."""


FUSED_CHUNK_BYTES = 2**29
"""Mirrors runner/train/loss.py: a fused-loss chunk holds about 512 MiB of bf16 logits and their gradient."""


def _chunk_tokens(budget: int, bytes_per_elem: int, vocab: int) -> int:
    n = budget // (bytes_per_elem * max(1, vocab))
    return max(256, min(8192, n // 256 * 256))


def loss_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk of the native engine's chunked loss (runner/train/loss.py chunk_tokens_for)."""
    return _chunk_tokens(CHUNK_LOGIT_BYTES, 4, vocab)


def fused_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk of the native engine's fused loss (runner/train/loss.py fused_chunk_tokens_for)."""
    return _chunk_tokens(FUSED_CHUNK_BYTES, 2 + 2, vocab)

ACTIVATION_CALIBRATION = 1.0
"""Measured / counted per-layer activations. Fitted on the native engine's Qwen3-0.6B 8k run without checkpointing
(H200, memory-calibration-h200.json: 15.3 GiB of its 20.0 GiB peak is activations): 1.01, i.e. the count itself.
The reference plain loop (references.md, 1.72B, 66.7 GiB without checkpointing) implies 1.28: it is not our
engine, and its extra has not been traced."""
NORM_UPCAST_BYTES = 4
"""HF RMSNorm casts its input to fp32 and keeps that copy for backward (plus the normalised output)."""
FP32_WEIGHT_PRODUCT_NORMS = frozenset({"gpt_oss", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text",
                                       "qwen3_5_moe_text"})
"""Families whose RMSNorm multiplies by its weight in fp32 before casting back (`(x * w).to(bf16)`), so the
tensor kept for the weight's gradient is fp32; llama-style norms keep the bf16 cast (`w * x.to(bf16)`)."""
MOE_ROUTE_INTERMEDIATES: dict[str, int] = {"gpt_oss": 7}
"""Expert-intermediate-sized tensors kept per routed token, in units of the expert width (bytes = units × b ×
width). SwiGLU experts (qwen3_moe, mixtral, the default 4): the gate/up projection output (2), silu's output and
the product. gpt-oss's clamped SwiGLU with bias: the gate/up output (2), the clamped gate, its sigmoid,
up + 1, their product and the down projection's input (7)."""
GDN_CHUNK = 64
"""Chunk length of the gated-delta-rule kernels (flash-linear-attention chunk_gated_delta_rule)."""
GDN_TORCH_PATH_BYTES = 80.0
"""Extra bytes a gated-delta layer keeps for backward per token and per element of its value width (value heads ×
value head dim) when flash-linear-attention is not installed and the layer runs transformers' PyTorch chunk rule
(once per document, runner/train/attention.py): that path computes in fp32 and autograd keeps its intermediates
(about 20 fp32 tensors of the value width). Fitted on the H200 hybrid LoRA 8k row (10.97 GiB measured, 2.49 GiB
above the kernel count); the 2k and 32k rows are held out (memory-calibration-h200.md)."""
COMPILED_ACTIVATION_FACTOR = 0.72
"""Share of a decoder layer's saved activations that remains when the layer is torch.compile'd (train.compile):
inductor fuses the norms, rotary and SwiGLU elementwise chains and keeps fewer intermediates. Fitted on the
H200 1.72B 32k bench row with 4 layers not recomputed (24.6 GiB measured); the other compiled rows are held out."""
SDPA_MASK_BYTES_PER_ELEM = 7.0
"""sdpa on packed documents: transformers builds a dense s × s mask for the step (bool, 1 B) and the efficient
kernel takes an additive bf16 copy of it during each call. Calibrated: the H200 reference at 32k tokens peaked
7.4 GiB higher with sdpa than with flex attention (96.2 vs 88.8 GiB), i.e. ~7 B per s² element."""
EAGER_SCORE_COPIES_TRANSIENT = 2.0
"""Eager attention: besides the saved softmax probabilities, the scores / masked / shifted copies (forward) or the
probabilities' and scores' gradients (backward) of one layer are alive at once."""
PARAMWRAPPER_MERGED_COPIES = 1.0
"""Copies of a layer's expert stack alive at that layer's backward under peft's ParamWrapper (LoRA on 3-D expert
tensors, bf16 base). peft 0.21 folds the adapter into one `baddbmm(W, A, B)` (peft/tuners/lora/layer.py,
_LoraFactorsProxy), so the merged weight W + B·A exists once and the matmuls keep it for backward; its gradient
comes after the layer's expert activations have started to go. Was 2 (counted merged weight + gradient); the
2-layer GPT-OSS LoRA run on the H200 peaked 0.74 GiB (one stack is 0.37) below that figure: fitted to 1 there."""

CUDA_CONTEXT_GIB = 0.6
"""CUDA context and kernels outside PyTorch's allocator (~500–600 MiB on Hopper with lazy module loading)."""
NCCL_GIB = 1.0
"""NCCL communicator buffers with more than one rank."""
FRAGMENTATION_FRACTION = 0.15
"""Reserved beyond the allocated peak and the streams' pools (memory_model's default_pool + reduce_pool), as a
share of the allocated peak: blocks cached at one phase's sizes that another phase cannot reuse. Fitted on the
seven native runs of memory-calibration-h200.json (H200): their median is 0.16 (range 0.02 to 0.29)."""
TRL_FRAGMENTATION_FRACTION = 0.04
"""The same share for the TRL engine, whose allocation pattern leaves fewer holes. With 0.15 the reserved peak of
the TRL rows of memory-calibration-h200.md (dense 0.6B, 1.72B and 4B, 8k and 32k, full and LoRA) was over-predicted
by 5 to 14 %, with 0.04 it is within -4 to +4 %; and TRL's limit on one H200 (4.02B, full, bench-h200/
limit-4b-trl.json) fits at 229,376 tokens with 133.2 GiB allocated as counted, which leaves room for at most 4.5 %
(0.15 predicted 196,608)."""
TIGHT_FRACTION = 0.05
"""Headroom below this share of device memory is 'tight': it should fit, but a longer document or a different
allocator pattern can tip it over."""

DEFAULT_DOC_LEN = 2048
"""Average document length for causal-attention FLOPs when the dataset cannot be sampled."""
TEMPLATE_TOKENS_PER_MESSAGE = 5
"""Chat-template tokens around each message (ChatML: <|im_start|>role\\n ... <|im_end|>\\n)."""
CHARS_PER_TOKEN = 4.0
DATASET_SAMPLE_ROWS = 256

PARAMWRAPPER_TRAFFIC = 3.0
"""Bytes moved per byte of a layer's expert stack each time ParamWrapper merges it (write B·A, read W and the delta,
write W + delta); it happens in the forward, in the recompute and once more for the merged weight's gradient."""
HBM_EFFICIENCY = 0.7
"""Share of the datasheet memory bandwidth that large elementwise kernels reach."""
EAGER_ATTENTION_EFFICIENCY = 0.5
"""Eager attention (two matmuls and a softmax over materialised scores) runs at this share of the matmul rate:
an assumption until measured."""
CALIBRATION: dict[tuple[str, str, bool], tuple[float, str]] = {
    ("native", "H200", True): (0.75, "runner bench on one H200, Qwen3 1.72B and 4.02B, compiled layers with the "
                                     "checkpoint inside them: 0.701 s (1.72B), 1.698 s (4.02B) at 32k on the "
                                     "embedded chats, 0.819 s on 400-3,000-token ones (bench-1p7b-32k, bench-4b-32k, "
                                     "bench-1p7b-longchat-32k); all within 7.3%"),
    ("native", "H200", False): (0.43, "runner bench on one H200, Qwen3 1.72B at 32k without compile: 1.388 s "
                                      "(ablation-1p7b-nocompile)"),
    ("trl", "H200", True): (0.77, "runner bench on one H200, Qwen3 1.72B, TRL with liger and compile: 0.925 s at 32k "
                                  "and 0.339 s at 8k with TRL_STEP_OVERHEAD_S (bench-1p7b-longchat)"),
    ("native", "B300", False): (0.43, "the 27B notebook: 995 steps of 8 × 32,768 tokens in ~2.5 h with setup on "
                                      "8×B300"),
}
"""Hardware FLOPs utilisation (recompute included) against the GPU's practical matmul ceiling, by (engine, GPU,
compiled decoder layers). TRL's was fitted on the 1.72B long-conversation rows, where the 32k and 8k steps give
the rate and the per-step overhead together; the compiled native rate on the latest 32k rows of the engine as it is
(each source says which). tests/unit/test_estimate.py checks every 32k bench row against the time model, the
exceptions listed there with their reasons. A missing (engine, GPU, compiled) falls back to the same engine on
the H200, then to the other compile setting."""
HOST_LINK_GB_S = 47.0
"""Host-to-GPU copy rate from pinned memory that offloaded activations come back at. Measured on one H200
(benchmarks/host_link_bw.py, benchmarks/host-link-h200.json): 55.3 GB/s each way alone, 47.4 GB/s each way with
both directions at once (offload copies out and back can overlap), 55.2 GB/s beside a running matmul, which kept
its rate (678 vs 676 TFLOP/s). The conservative figure is used."""
GPU_STEP_OVERHEAD_S = 0.05
"""Per-step host work (data, logging, the ranks' agreement all-reduce) not hidden by the GPU."""
UNWRAPPED_RATE_FACTOR = 1.064
UNWRAPPED_STEP_OVERHEAD_S = 0.021
"""One native rank that trains the plain module (no FSDP2): the CALIBRATION rates and GPU_STEP_OVERHEAD_S were
fitted on wrapped runs, whose per-layer copies cost GPU and host time. Both fitted on the 1.72B runs of the same
commands unwrapped: 0.681 s at 32k (bench-1p7b-32k-unwrapped; 0.701 wrapped) and 0.165 s at 8k
(bench-1p7b-8k-unwrapped, -b; 0.185-0.215 wrapped, host-bound)."""
TRL_STEP_OVERHEAD_S = 0.14
"""The same for the TRL engine (Trainer callbacks, logging, accelerate's step): fitted with its H200 rate above."""
TRL_UNWRAPPED_RATE_FACTOR = 0.93
"""One TRL process training the plain module (autocast casts each fp32 weight to bf16 in forward, in the
recompute and in backward, where FSDP2 copied each layer once per pass): its H200 rate was fitted wrapped. Fitted
on the 32k rows of the same commands plain: 0.919 s at 1.72B (bench-1p7b-32k-plain; 0.821-0.852 wrapped) and
2.074 s at 4.02B (bench-4b-32k-plain; 1.939 wrapped)."""
CPU_GFLOPS_PER_CORE = 20.0
CPU_EFFICIENCY = 0.25
CPU_STEP_OVERHEAD_S = 0.1
SETUP_BASE_S = {"cuda": 90.0, "cpu": 10.0}
"""Launch, imports, process group, tokenizer and first data before step 1."""
LOAD_GB_PER_S = 1.5
"""Reading a checkpoint from local disk / page cache into every rank of a node (each rank loads it all)."""

KNOWN_DATASETS: dict[tuple[str, str], dict[str, Any]] = {
    ("HuggingFaceH4/ultrachat_200k", "train_sft"): {
        "rows": 207_865, "tokens": 995 * 8 * 32768,
        "source": "rows: dataset card; tokens: the 27B notebook's 995 steps × 8 ranks × 32,768 tokens"},
    ("HuggingFaceH4/Multilingual-Thinking", "train"): {
        "rows": 1000, "tokens": 1_113_000,
        "source": "dataset card: 1,000 rows, 8.9 MB of which about half is the messages column; 4 chars per token"},
}

PHASES = ("loss", "backward_start", "backward_end", "optimizer")
BREAKDOWN_KEYS = ("params", "grads", "optimizer", "fsdp_buffers", "activations", "logits_loss", "lora",
                  "cuda_context_nccl", "fragmentation")


# =============================================================================================
# Result


@dataclass
class Estimate:
    """What `runner estimate` prints and the record keeps. GiB are 2^30 bytes."""

    fits: bool
    verdict: str
    headroom_gib: float
    per_gpu_gib: float
    """Predicted device memory per GPU that the run needs: PyTorch's peak allocated + fragmentation + CUDA context +
    NCCL. The verdict compares this with the device's memory."""
    per_gpu_allocated_gib: float
    per_gpu_reserved_gib: float
    """What nvidia-smi would show at the peak on a GPU with room to spare: `per_gpu_gib` plus the blocks the
    reduce-scatter stream's pool holds idle at that moment (released by the allocator under memory pressure)."""
    gpu_memory_gib: float
    gpu: str
    world_size: int
    breakdown: dict[str, float]
    step_s: float
    steps: int | None
    total_s: float | None
    tokens_per_step: int
    flops_per_step: float
    mfu_assumed: float
    approximate: bool
    approximate_reason: str
    suggestion: str | None
    arch: dict[str, Any]
    peak_phase: str = ""
    per_gpu_basis: str = ("peak allocated by PyTorch plus fragmentation, CUDA context and NCCL buffers; "
                          "per_gpu_reserved_gib adds the reduce-scatter pool's idle blocks (what nvidia-smi shows)")
    device: str = "cuda"
    engine: str = "native"
    method: str = "full"
    seq_len: int = 0
    attn_implementation: str = ""
    loss_impl: str = ""
    activation_checkpointing: bool = False
    params_trainable: int = 0
    arch_source: str = ""
    doc_len: int = DEFAULT_DOC_LEN
    dataset_tokens: int | None = None
    mfu_source: str = ""
    phases_gib: dict[str, float] = field(default_factory=dict)
    host_offload_gib: float = 0.0
    """Pinned host memory per rank for offloaded activations (train.offload_activations); not in per_gpu_gib."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# =============================================================================================
# Planning context: the spec with its `auto` fields filled for planning (no GPU needed)


@dataclass(frozen=True)
class Plan:
    spec: RunSpec
    device: str
    gpu: GpuType | None
    nproc: int
    world: int
    dtype: str
    attn: str
    loss_impl: str
    loaded: LoadedArch
    reasons: tuple[str, ...]
    gdn_torch: bool = False
    """Gated-delta layers run transformers' PyTorch path (flash-linear-attention is not installed here)."""

    @property
    def arch(self) -> Arch:
        return self.loaded.arch

    @property
    def sharded(self) -> bool:
        """Whether the model is wrapped in FSDP2: as runner/train/model.py needs_fsdp decides for the native engine
        (one rank trains the plain module unless its weights are not bf16 on GPU, or train.fsdp_one_rank), and as
        trl_engine.needs_fsdp decides for the TRL engine (one GPU process only with train.fsdp_one_rank)."""
        if self.world > 1:
            return True
        if self.spec.engine == "trl":
            return self.device == "cuda" and self.spec.train.fsdp_one_rank
        return self.spec.train.fsdp_one_rank or (self.device == "cuda" and self.dtype != "bfloat16")


VARLEN_MIN_TOKENS = 32_768
"""Mirrors runner/train/attention.py: auto on CUDA picks varlen from this many tokens per forward, flex below."""


def planned_attention(spec: RunSpec, device: str) -> str:
    """The attention backend the engine will pick, as runner/train/attention.py choose_attention does, without
    importing torch. On CUDA flash-attn (when installed), varlen and flex cost the same memory here: no s² term."""
    choice = spec.model.attn_implementation
    if choice != "auto":
        return choice
    if device != "cuda":
        return "sdpa"
    return "varlen" if spec.train.seq_len * spec.train.micro_batch >= VARLEN_MIN_TOKENS else "flex_attention"


def planned_loss(spec: RunSpec) -> str:
    """full | chunked | fused (native engine, runner/train/loss.py) | trl-fused (the TRL engine: SFTTrainer's
    fused LM head, whatever train.loss_impl says)."""
    if spec.engine == "trl":
        return "trl-fused"
    return spec.train.loss_impl if spec.train.loss_impl in ("full", "fused") else "chunked"


def make_plan(spec: RunSpec) -> Plan:
    hw = spec.hardware
    reasons: list[str] = []
    device = hw.device
    gpu: GpuType | None = None
    detected: tuple[GpuType, int] | None = None
    if device != "cpu":
        if hw.gpu != "auto":
            gpu = gpu_type(hw.gpu)
        else:
            detected = detect_gpu()
            if detected is None:
                raise UserError("hardware.gpu=auto, but no GPU is visible on this machine to plan for",
                                [Problem("hardware.gpu", "auto needs a visible GPU",
                                         "name the GPU type to plan for, e.g. --set hardware.gpu=H100-80GB "
                                         "(or hardware.device=cpu for a CPU run)")])
            gpu = detected[0]
            if gpu.name.startswith("unknown:"):
                reasons.append(f"GPU '{gpu.name[8:]}' is not in the catalog: throughput assumed equal to an H100")
        device = "cuda"
    nproc = hw.nproc_per_node
    if nproc == "auto":
        if device == "cpu":
            nproc = 2
        else:
            if detected is None:
                found = detect_gpu()
                detected = found if found and found[0].name == (gpu.name if gpu else "") else None
            nproc = detected[1] if detected else 8
    nproc = int(nproc)
    if nproc < 1:
        raise UserError("invalid spec", [Problem("hardware.nproc_per_node", f"must be at least 1, got {nproc}",
                                                 "use 1 or more")])
    dtype = spec.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    loaded = _load_arch_cached(spec.model.id, spec.model.revision, spec.model.path)
    return Plan(spec, device, gpu, nproc, nproc * hw.nodes, dtype, planned_attention(spec, device), planned_loss(spec),
                loaded, tuple(reasons), gdn_torch=not gdn_kernels_installed())


@functools.lru_cache(maxsize=64)
def _load_arch_cached(model_id: str, revision: str | None, path: str | None) -> LoadedArch:
    from types import SimpleNamespace

    return load_arch(SimpleNamespace(model=SimpleNamespace(id=model_id, revision=revision, path=path)))


# =============================================================================================
# LoRA: trainable parameters and their shapes


def _matches(name: str, targets: str | list[str]) -> bool:
    if targets == "all-linear":
        return True
    if isinstance(targets, str):
        targets = [targets]
    return any(name == t or name.endswith("." + t) or name.split(".")[-1] == t for t in targets)


def _rank_for(name: str, default: int, pattern: dict[str, int]) -> int:
    for key, r in pattern.items():
        if name == key or name.endswith(key) or key.endswith(name):
            return int(r)
    return default


def lora_params(arch: Arch, lora: Any) -> tuple[int, int, list[str]]:
    """(trainable adapter params, largest adapted expert stack of one layer in params, notes).

    A linear (in → out) gets r·(in + out); an expert tensor (E × in × out) via target_parameters gets
    r·E·(in + out) (peft ParamWrapper: lora_A = Linear(in, r·E), lora_B = Linear(r·E, out)).
    """
    total = 0
    max_expert_stack = 0
    notes: list[str] = []
    for i in range(arch.layers):
        for lin in arch.linears(i):
            if _matches(lin.name, lora.target_modules):
                total += _rank_for(lin.name, lora.r, lora.rank_pattern) * (lin.in_features + lin.out_features)
        stack = 0
        for t in arch.expert_tensors(i):
            if any(t.name == p or t.name.endswith(p) or p.endswith(t.name) for p in lora.target_parameters):
                total += _rank_for(t.name, lora.r, lora.rank_pattern) * t.experts * (t.in_features + t.out_features)
                stack += t.experts * t.in_features * t.out_features
        max_expert_stack = max(max_expert_stack, stack)
    if arch.vision_linears and lora.target_modules == "all-linear":
        total += sum(lora.r * (x.in_features + x.out_features) for x in arch.vision_linears)
        notes.append("all-linear also adapts the vision tower's linears (counted)")
    if lora.target_parameters and max_expert_stack == 0:
        notes.append(f"target_parameters {lora.target_parameters} match no expert tensor of this model")
    return total, max_expert_stack, notes


# =============================================================================================
# Activations (bytes per token of one layer)


def _norm_bytes(arch: Arch, b: int, frozen: bool) -> tuple[int, int]:
    """(bytes per element an RMSNorm keeps for backward besides its output, the output's bytes).

    HF's RMSNorm keeps its fp32 copy of the input (pow and the rsqrt product save it) and, only when its weight
    trains, the normalised tensor the weight multiplies: bf16 in llama-style norms (`weight * x.to(bf16)`), fp32
    where the product is taken before the cast (gpt-oss, qwen3_next, qwen3_5: `(x * w).to(bf16)`). The output is
    kept by the linears that read it (their weight's gradient, or LoRA's lora_A).
    """
    up = max(b, NORM_UPCAST_BYTES)  # fp32 runs: the input itself is what is kept
    cast = up if arch.model_type in FP32_WEIGHT_PRODUCT_NORMS else b
    return up + (0 if frozen else cast), b


def gdn_kernels_installed() -> bool:
    """flash-linear-attention importable (the gated-delta kernels); checked without importing it."""
    return importlib.util.find_spec("fla") is not None


def layer_activation_bytes(arch: Arch, i: int, attn: str, b: int, seq_len: int, frozen: bool = False,
                           gdn_torch: bool = False) -> float:
    """Tensors one decoder layer keeps for backward, per token, counted from the HF implementation.

    `frozen`: LoRA, the base weights take no gradient, so the tensors kept only for a weight's gradient are not
    kept (the norms' normalised input). Rotary embeddings keep nothing per token: cos and sin need no gradient,
    so `q * cos` keeps cos, not q.
    """
    h = arch.hidden
    norm_kept, norm_out = _norm_bytes(arch, b, frozen)
    n = 2 * (norm_kept + norm_out) * h  # input and post-attention RMSNorm
    kind = arch.layer_type(i)
    if kind == LAYER_LINEAR:
        kd, vd, vh = arch.linear_key_dim, arch.linear_value_dim, arch.linear_value_heads
        conv = 2 * kd + vd
        rep = max(1, vh // max(1, arch.linear_key_heads))
        n += b * conv * 2  # projection output (saved by the conv) and the conv + silu output
        n += b * vd  # z gate
        n += b * 2 * kd * rep  # q, k repeated to the value heads
        n += 4 * 2 * vh  # g and beta (fp32)
        n += b * vh * GDN_CHUNK  # the chunk kernel's within-chunk matrix
        n += b * vd  # kernel output
        # Gated RMSNorm: fp32 copy (in fp32 runs that is the kernel output itself), normalised output, silu(z).
        n += ((NORM_UPCAST_BYTES if b < NORM_UPCAST_BYTES else 0) + 2 * b) * vd
        n += b * vd  # out_proj input
        if gdn_torch:
            n += GDN_TORCH_PATH_BYTES * vd
    else:
        q, kv = arch.q_dim, arch.kv_dim
        if arch.qk_norm:
            n += norm_kept * (q + kv)  # the q/k norms' output goes to rotary, which keeps nothing of it
        explicit = attn in ("sdpa", "eager")
        kv_saved = q if explicit else kv  # repeat_kv materialises k, v at the query heads for these two
        n += b * (q + 2 * kv_saved)  # rotated q and k, and v, kept by the kernel
        n += b * q + 4 * arch.heads  # kernel output (o_proj reads a view of it) and logsumexp (fp32)
        if attn == "eager":
            n += b * q  # eager's output is transposed and made contiguous: o_proj keeps the copy
        if arch.attn_output_gate:
            n += 2 * b * q  # sigmoid(gate) and the gated o_proj input
        if attn == "eager":
            n += b * arch.heads * (seq_len + (1 if arch.attention_sinks else 0))  # softmax probabilities
    if arch.is_moe_layer(i):
        e_im, k = arch.expert_intermediate, arch.experts_per_token
        n += b * arch.num_experts  # router logits
        # Per route: the gathered input, the expert intermediates and the expert output the routing weight
        # multiplies (transformers' grouped_mm experts path).
        n += k * b * (MOE_ROUTE_INTERMEDIATES.get(arch.model_type, 4) * e_im + 2 * h)
        if arch.shared_expert_intermediate:
            n += 4 * b * arch.shared_expert_intermediate + 2 * b
    else:
        n += 4 * b * arch.intermediate  # silu input, silu output, up, their product (down_proj's input)
    return n * ACTIVATION_CALIBRATION


def backward_transient_bytes(arch: Arch, b: int) -> float:
    """Gradient tensors alive at once inside one layer's backward, per token."""
    widest = max(arch.intermediate if not arch.num_experts else 2 * arch.expert_intermediate * arch.experts_per_token,
                 2 * arch.linear_key_dim + arch.linear_value_dim, 2 * arch.q_dim)
    return b * (2 * arch.hidden + 2 * widest)


# =============================================================================================
# Memory


@dataclass
class _Memory:
    phases: dict[str, dict[str, float]]
    peak_phase: str
    allocated: float
    breakdown: dict[str, float]
    trainable: int
    reasons: list[str]
    expert_stack: int = 0
    reduce_pool: float = 0.0
    """Bytes the reduce-scatter stream's pool holds at its largest: the sharded gradients and the root's reduce
    output are allocated there, and the caching allocator does not hand that stream's free blocks to the default
    stream."""
    default_pool: float = 0.0
    """The default stream's largest live set over the phases (the allocated peak minus what the reduce-scatter
    stream holds at that moment, at the phase where that is largest)."""
    host_offload: float = 0.0
    """Bytes of pinned host memory the offloaded layer inputs take at the end of forward (train.offload_activations)."""
    state_holes: float = 0.0
    """Reserved, not allocated: the first step's working set that one unwrapped TRL process reserves again in its
    second step, after the AdamW states (created at the first optimizer step) took the blocks it had freed."""


def memory_model(plan: Plan) -> _Memory:
    """Bytes per GPU (or per CPU rank) at each phase of a step; the peak phase gives the breakdown.

    Phases (the largest is the peak): `loss` (end of the forward, the loss computed), `backward_start` (the loss's
    backward or the last layer's, whichever holds more), `backward_end` (the first layer's backward or the root's
    gradient reduce-scatter, whichever holds more) and `optimizer`.
    """
    spec, arch = plan.spec, plan.arch
    t = spec.train
    n = plan.world
    reasons: list[str] = []
    b = DTYPE_BYTES[plan.dtype]  # weights as loaded
    cb = 2 if plan.device == "cuda" else b  # compute dtype (FSDP param_dtype) — bf16 on GPU
    tokens = t.seq_len * t.micro_batch
    lora = spec.method.kind == "lora"
    trl = spec.engine == "trl"
    ac = t.activation_checkpointing

    text = arch.text_params
    vision = arch.vision_params
    lora_n, expert_stack, lora_notes = lora_params(arch, spec.method.lora) if lora else (0, 0, [])
    reasons += lora_notes

    # -- sharded model states -----------------------------------------------------------
    tb = TRL_TRAINABLE_BYTES if trl and plan.device == "cuda" else b  # trainable parameters as FSDP holds them
    if lora:
        trainable = lora_n
        params_b, grads_b, opt_b = (text + vision) * b / n, 0.0, 0.0
        lora_b = trainable * tb * (2 + ADAM_STATES_PER_PARAM) / n  # adapter weights, grads, AdamW states
        lora_no_grads = trainable * tb * (1 + ADAM_STATES_PER_PARAM) / n
    else:
        trainable = text
        # The vision tower gets no gradient in text-only training: no grads, no optimizer state (AdamW skips it).
        params_b = (text + vision) * tb / n
        grads_b = text * tb / n
        opt_b = text * tb * ADAM_STATES_PER_PARAM / n
        lora_b = lora_no_grads = 0.0
    g_accum = grads_b if t.grad_accum > 1 else 0.0
    lora_kept = lora_b if t.grad_accum > 1 else lora_no_grads

    # -- FSDP2 unsharded working set ----------------------------------------------------
    # Unsharded parameters are all-gathered (on one rank: copied) into buffers of their own in the compute dtype.
    # A trained unit's gradient is reduce-scattered after its backward: the unsharded bf16 gradient is copied into
    # a reduce-dtype input, then the reduce-scatter output (1/N of it) is cast to the parameter's dtype, which
    # becomes the sharded gradient. The unit's parameters are resharded before that.
    reduce_bytes = (TRL_REDUCE_BYTES if trl else NATIVE_REDUCE_BYTES) if plan.device == "cuda" else b
    sharded = plan.sharded

    def reduce_peak(params: int) -> float:
        cast = tb if tb != reduce_bytes else 0
        return params * max(cb + reduce_bytes, reduce_bytes + (reduce_bytes + cast) / n)

    layer_u = arch.max_layer_params
    root_u = arch.root_params
    # FSDP2 keeps the root unsharded from its forward to the end of backward; unwrapped, the weights are used
    # where they are.
    root_unsharded = root_u * cb if sharded else 0.0
    # ... unless reshard_after_forward is set explicitly, as accelerate does (TRL): then the root is gathered again
    # for the loss's backward, and with LoRA (no root gradient to wait for) let go before the layers' backward.
    # The allocator trace of the TRL GPT-OSS LoRA run shows no root copy at its training peak (estimator-notes.md).
    root_in_layers_bwd = 0.0 if trl and lora else root_unsharded
    # Gradients made in backward: FSDP2 makes them in the compute dtype; unwrapped, in the parameter's own.
    gb = cb if sharded else tb
    head_grad = 0 if lora else (arch.lm_head_params or arch.embed_params) * gb  # lm_head grad, from the loss on
    layer_grad = 0 if lora else layer_u * gb
    # The layer just reduced keeps its reduce-scatter input until the next layer's reduce starts.
    layer_reduce_input = 0.0 if lora or not sharded else layer_u * reduce_bytes
    root_reduce = 0.0 if lora or not sharded else reduce_peak(root_u)
    root_grad_shard = 0.0 if lora or not sharded else root_u * tb / n
    layer_grad_shard = 0.0 if lora or not sharded else layer_u * tb / n
    # FSDP2 gathers the layer being run (and prefetches the next) into buffers of their own.
    gathered = layer_u * cb if sharded else 0.0
    if n == 1 and sharded:
        reasons.append("one rank: FSDP still all-gathers into unsharded buffers (counted)")

    # -- activations --------------------------------------------------------------------
    compiled = COMPILED_ACTIVATION_FACTOR if t.compile and plan.device == "cuda" else 1.0
    per_layer = [layer_activation_bytes(arch, i, plan.attn, cb, t.seq_len, frozen=lora, gdn_torch=plan.gdn_torch)
                 * tokens * compiled for i in range(arch.layers)]
    if plan.gdn_torch and any(arch.layer_type(i) == LAYER_LINEAR for i in range(arch.layers)):
        reasons.append("gated-delta layers through the PyTorch path (flash-linear-attention not installed): "
                       "fp32 intermediates counted")
    transient = backward_transient_bytes(arch, cb) * tokens
    layer_input = cb * arch.hidden * tokens
    k = recomputed_layers(spec, arch.layers)  # the first k layers recompute, the others keep their activations
    # Offloaded, a recomputed layer's input waits in host memory and comes back for its own recompute only.
    offload = offloads_activations(spec, plan.device)
    on_gpu_input = 0.0 if offload else layer_input
    kept = k * on_gpu_input + sum(per_layer[k:])
    # A checkpointed layer is recomputed at the start of its own backward, when the layers after it have freed
    # what they kept: the largest of these moments, over and above `kept` (layer types differ in hybrids).
    kept_at = 0.0
    worst = 0.0
    for i in range(arch.layers):
        kept_at += on_gpu_input if i < k else per_layer[i]
        worst = max(worst, kept_at + (per_layer[i] + layer_input - on_gpu_input if i < k else 0.0))
    host_offload = k * layer_input if offload else 0.0
    if offload:
        reasons.append(f"activation offload: {_gib(host_offload):.1f} GiB of pinned host memory per rank")
    recompute_last = worst - kept
    recompute_first = per_layer[0] if k else 0.0
    kept_first = layer_input if k else per_layer[0]  # by the first layer's backward the others' are freed
    mask = 0.0
    score_transient = 0.0
    if plan.attn in ("sdpa", "eager") and spec.train.packing:
        mask = SDPA_MASK_BYTES_PER_ELEM * t.seq_len * t.seq_len * t.micro_batch
    if plan.attn == "eager":
        score_transient = EAGER_SCORE_COPIES_TRANSIENT * cb * arch.heads * t.seq_len * t.seq_len * t.micro_batch
        mask = cb * t.seq_len * t.seq_len * t.micro_batch  # additive float mask, kept for the step

    # -- logits and loss ----------------------------------------------------------------
    # The final norm's saved tensors and the gathered hidden states the loss reads (the size of the norm's output)
    # stay until the loss's backward.
    norm_kept, norm_out = _norm_bytes(arch, cb, lora)
    final_norm = (norm_kept + norm_out) * arch.hidden * tokens
    v = arch.vocab
    if plan.loss_impl == "full":
        loss_fwd = LOGITS_BYTES_PER_ELEM * tokens * v
        loss_bwd = LOGITS_BYTES_PER_ELEM * tokens * v
    elif plan.loss_impl == "chunked":
        chunk = min(tokens, loss_chunk_tokens(v))
        loss_fwd = CHUNKED_LOSS_FORWARD_BYTES_PER_ELEM * chunk * v
        # Backward of a chunk: recomputed log-softmax output, its gradient and the logits' gradient (fp32); and,
        # when lm_head trains, the chunk's weight gradient before it is added to the accumulated one.
        loss_bwd = max(CHUNKED_LOSS_BYTES_PER_ELEM * chunk * v, 2 * chunk * v + head_grad)
    elif plan.loss_impl == "fused":
        chunk = min(tokens, fused_chunk_tokens(v))
        per_elem = FUSED_LOSS_COMPILED_BYTES_PER_ELEM if t.compile and plan.device == "cuda" else \
            FUSED_LOSS_BYTES_PER_ELEM
        # Made in forward and held to backward: the targets' hidden-state gradient and lm_head's weight gradient
        # (the latter is the head_grad that the backward phases count). In backward the hidden-state gradient
        # is scattered back into a zero tensor of the whole block.
        grad_hidden = cb * arch.hidden * tokens
        loss_fwd = per_elem * chunk * v + grad_hidden + head_grad
        loss_bwd = 2 * grad_hidden
    else:
        loss_fwd = loss_bwd = (cb * arch.hidden + TRL_FUSED_LOSS_BYTES_PER_TOKEN_EXTRA) * tokens
    if plan.device == "cpu":
        reasons.append("CPU run: host RAM per rank, fp32 throughout; allocator behaviour differs from CUDA")

    # -- LoRA on expert stacks (ParamWrapper) -------------------------------------------
    # The merged weight W + B·A of a layer is kept for that layer's backward, where its gradient joins it.
    # Without checkpointing every MoE layer's merged weight stays from its forward to its backward.
    moe_layers = sum(1 for i in range(arch.layers) if arch.is_moe_layer(i))
    merged_bwd = PARAMWRAPPER_MERGED_COPIES * expert_stack * cb if lora else 0.0
    merged_kept = 0.0 if ac or not lora else moe_layers * expert_stack * cb
    last_merged = merged_bwd if ac or not lora else merged_kept + expert_stack * cb  # + the last one's gradient

    # One unwrapped TRL process computes its fp32 trainable weights in bf16 under autocast, which keeps the bf16
    # copy of every weight it casts until the forward (the loss included) returns: the decoder layers' and
    # lm_head's matmul weights, not the input embedding's lookup. Counted with FSDP's gathered copies (the
    # breakdown's fsdp_buffers): the same bf16 weight copies, made by autocast instead.
    cast_cache = 0.0
    if trl and not sharded and plan.device == "cuda" and plan.dtype != "float32":  # the engine's autocast rule
        cast_cache = trainable * cb if lora else (text - (arch.embed_params if arch.lm_head_params else 0)) * cb
    base = {"params": params_b, "optimizer": opt_b}
    acts_common = mask
    loss_phase = {**base, "grads": g_accum, "fsdp_buffers": root_unsharded + cast_cache,
                  "activations": kept + acts_common, "logits_loss": final_norm + loss_fwd,
                  "lora": lora_kept + merged_kept}
    # Gradients that backward has made and FSDP2 has not yet reduced sit in its buffers; unwrapped they are the
    # parameters' own .grad.
    grads_at_loss, held_at_loss = (0.0, head_grad) if sharded else (head_grad, 0.0)
    grads_at_last, held_at_last = (0.0, head_grad + layer_grad) if sharded else (head_grad + layer_grad, 0.0)
    loss_back = {**base, "grads": g_accum + grads_at_loss, "fsdp_buffers": root_unsharded + held_at_loss + gathered,
                 "activations": kept + acts_common, "logits_loss": final_norm + loss_bwd,
                 "lora": lora_kept + merged_kept}
    last_layer = {**base, "grads": g_accum + grads_at_last,
                  "fsdp_buffers": root_in_layers_bwd + held_at_last + 2 * gathered,
                  "activations": kept + recompute_last + transient + acts_common + score_transient,
                  "logits_loss": 0.0, "lora": lora_b + last_merged}
    # Unwrapped, `grads` holds every gradient here (the input embedding's, still to come, is lm_head's when tied).
    first_layer = {**base, "grads": max(g_accum, grads_b - root_grad_shard - layer_grad_shard),
                   "fsdp_buffers": root_in_layers_bwd + held_at_last + gathered + layer_reduce_input,
                   "activations": kept_first + recompute_first + transient + acts_common + score_transient,
                   "logits_loss": 0.0, "lora": lora_b + merged_bwd}
    root_phase = {**base, "grads": max(g_accum, grads_b - root_grad_shard), "fsdp_buffers": root_reduce,
                  "activations": acts_common, "logits_loss": 0.0, "lora": lora_b}
    optimizer = {**base, "grads": grads_b, "fsdp_buffers": 0.0, "activations": 0.0, "logits_loss": 0.0,
                 "lora": lora_b}

    def total(phase: dict[str, float]) -> float:
        return sum(phase.values())

    phases = {
        "loss": loss_phase,
        "backward_start": max(loss_back, last_layer, key=total),
        "backward_end": max(first_layer, root_phase, key=total),
        "optimizer": optimizer,
    }
    if plan.device == "cuda" and spec.model.init == "random":
        # Random init draws the whole model on each GPU (runner.train.model.load_model), then FSDP2 keeps the
        # rank's shard. fully_shard (native) swaps one layer's parameters at a time; accelerate's
        # fsdp2_prepare_model (TRL) keeps the drawn state dict until the sharded model holds all of it. Unwrapped,
        # the model is trained as drawn (TRL casts its trainable weights to fp32 one tensor at a time).
        whole = (text + vision) * b
        copy = (params_b if trl else layer_u * b / n) if sharded else 0.0
        phases["setup"] = {"params": whole + copy}
    if trl and not lora:
        reasons.append("TRL full fine-tune: fp32 master weights (16 B per parameter)")
    totals = {k: total(v) for k, v in phases.items()}
    peak_phase = max(totals, key=lambda k: totals[k])
    allocated = totals[peak_phase]
    breakdown = dict(phases[peak_phase])

    # -- the reduce-scatter stream's pool -------------------------------------------------
    # Held on the reduce-scatter stream at each phase: the sharded gradients, and the root's reduce output.
    root_out = 0.0 if lora else root_u * reduce_bytes / n
    on_reduce = {"loss": phases["loss"]["grads"], "backward_start": phases["backward_start"]["grads"],
                 "backward_end": phases["backward_end"]["grads"] + (root_out if phases["backward_end"] is root_phase
                                                                    else 0.0),
                 "optimizer": grads_b, "setup": 0.0}
    reduce_pool = 0.0 if plan.device != "cuda" or lora or not sharded else grads_b + root_out
    default_pool = max(totals[k] - (on_reduce[k] if reduce_pool else 0.0) for k in phases)

    # -- blocks the AdamW states take over (one unwrapped TRL process) ----------------------
    # Its fp32 AdamW states are created at the first optimizer step, in the blocks the first step freed (layer
    # inputs, autocast's weight copies, the loss's and the recompute's buffers) wherever a state tensor fits in
    # one; the second step then reserves that working set again. Measured on the H200 (trl_reserved_steps.py):
    # 1.72B at 32k reserved 25.9 GiB after step 1 and 38.7 from step 2 on, 31.0 allocated; at 8k, where a layer
    # input (32 MiB) is smaller than an MLP weight's state (48 MiB), 28.1 with 27.0 allocated.
    state_holes = 0.0
    if trl and not sharded and plan.device == "cuda" and opt_b:
        state_tensor = tb * arch.hidden * arch.intermediate
        freed = transient + (kept + cast_cache + final_norm + loss_fwd if layer_input >= state_tensor else 0.0)
        state_holes = min(opt_b, freed)
    return _Memory({k: {**v} for k, v in phases.items()}, peak_phase, allocated, breakdown, trainable, reasons,
                   expert_stack, reduce_pool, default_pool, host_offload, state_holes)


# =============================================================================================
# Time


def offloads_activations(spec: RunSpec, device: str) -> bool:
    """Recomputed layers' inputs go to host memory: the native engine on a GPU with train.offload_activations."""
    t = spec.train
    return t.offload_activations and t.activation_checkpointing and spec.engine == "native" and device == "cuda"


def recomputed_layers(spec: RunSpec, layers: int) -> int:
    """Decoder layers that recompute their forward in backward (train.recompute_layers, the first ones)."""
    t = spec.train
    if not t.activation_checkpointing:
        return 0
    return layers if t.recompute_layers is None else min(t.recompute_layers, layers)


def recompute_skipped_params(plan: Plan) -> int:
    """Matmul parameters per token that recomputation does not run again. The native engine's compiled layers hold
    their checkpoint inside the compiled graph (runner.train.model.checkpoint_in_compile), and backward never reads
    a dense MLP's output projection, so it is not recomputed; a MoE layer's expert outputs feed the routing
    weights' gradient and are. Offloaded layers keep transformers' eager checkpoint."""
    spec = plan.spec
    if spec.engine != "native" or not spec.train.compile or plan.device != "cuda" \
            or offloads_activations(spec, plan.device):
        return 0
    arch = plan.arch
    return sum(x.params for i in range(recomputed_layers(spec, arch.layers)) if not arch.is_moe_layer(i)
               for x in arch.linears(i) if x.name == "mlp.down_proj")


def flops_per_step(plan: Plan, doc_len: int, tokens_per_step: int) -> tuple[float, float]:
    """(hardware FLOPs of one optimizer step over all ranks, the attention part of it)."""
    arch, t = plan.arch, plan.spec.train
    share = recomputed_layers(plan.spec, arch.layers) / max(1, arch.layers)  # of the layers' forward, again
    n_flops = arch.params_flops
    if plan.spec.method.kind == "lora":
        # Frozen weights: forward + input gradients only (no weight gradients); adapters are negligible.
        per_token = (4 + 2 * share) * n_flops
    else:
        per_token = (6 + 2 * share) * n_flops
    per_token -= 2 * recompute_skipped_params(plan)
    passes = 3 + share  # attention: forward, two backward matmuls' worth, recompute
    s = t.seq_len
    d = max(1, min(doc_len, s))
    # Eager attention computes the whole score matrix of each sequence; sdpa does too when a packed block needs a
    # dense mask. Without packing a sequence is one document.
    square = plan.attn == "eager" or (plan.attn == "sdpa" and t.packing)
    square_len = s if t.packing else d
    attn_per_token = 0.0
    for i in range(arch.layers):
        kind = arch.layer_type(i)
        if kind == LAYER_LINEAR:
            vh, dk, dv = arch.linear_value_heads, arch.linear_key_head_dim, arch.linear_value_head_dim
            attn_per_token += passes * 2 * vh * (4 * dk * dv + GDN_CHUNK * (dk + dv))
            continue
        q = arch.q_dim
        if square:
            attn_per_token += passes * 4 * square_len * q
        else:
            span = d
            if kind == LAYER_SLIDING and arch.sliding_window:
                span = min(d, arch.sliding_window)
            causal = 0.5 if span == d else 1.0
            attn_per_token += passes * 4 * span * q * causal
    total = (per_token + attn_per_token) * tokens_per_step
    return total, attn_per_token * tokens_per_step


def calibration(plan: Plan) -> tuple[float, str]:
    name = plan.gpu.name if plan.gpu else "cpu"
    engine, compiled = plan.spec.engine, plan.spec.train.compile
    for key in ((engine, name, compiled), (engine, name, not compiled), (engine, "H200", compiled),
                (engine, "H200", not compiled)):
        if key in CALIBRATION:
            rate, source = CALIBRATION[key]
            return rate, source if key[1] == name else f"the H200 figure, for lack of a measurement here ({source})"
    raise AssertionError(f"no calibration for the {engine} engine")  # every engine has an H200 entry


# =============================================================================================
# Dataset size


@dataclass(frozen=True)
class DataSize:
    rows: int | None
    tokens: int | None
    avg_tokens: float | None
    source: str


def dataset_size(spec: RunSpec, loaded: LoadedArch) -> DataSize:
    d = spec.dataset
    if d.path:
        from runner.spec import resolve_embedded

        return _local_size(str(resolve_embedded(d.path)), d.messages_field, str(loaded.config_dir or ""))
    known = KNOWN_DATASETS.get((d.id or "", d.split))
    if known:
        return DataSize(known["rows"], known["tokens"], known["tokens"] / known["rows"], known["source"])
    return DataSize(None, None, None, "")


@functools.lru_cache(maxsize=16)
def _local_size(path: str, field_name: str, model_dir: str) -> DataSize:
    p = Path(path)
    files = sorted(x for x in p.rglob("*") if x.suffix in (".jsonl", ".json", ".parquet")) if p.is_dir() else [p]
    rows: list[dict[str, Any]] = []
    n_rows = 0
    for f in files:
        try:
            if f.suffix == ".jsonl":
                size = f.stat().st_size
                with f.open("rb") as fh:
                    head = [line for _, line in zip(range(DATASET_SAMPLE_ROWS), fh) if line.strip()]
                rows += [json.loads(x) for x in head]
                if size <= 64 << 20:
                    with f.open("rb") as fh:
                        n_rows += sum(1 for line in fh if line.strip())
                else:
                    n_rows += int(size / max(1.0, sum(map(len, head)) / max(1, len(head))))
            elif f.suffix == ".json":
                data = json.loads(f.read_text())
                data = data if isinstance(data, list) else data.get("data", [])
                rows += data[:DATASET_SAMPLE_ROWS]
                n_rows += len(data)
            else:
                import pyarrow.parquet as pq

                meta = pq.ParquetFile(f)
                n_rows += meta.metadata.num_rows
                rows += meta.read_row_group(0).slice(0, DATASET_SAMPLE_ROWS).to_pylist()
        except Exception:
            continue
    if not rows or not n_rows:
        return DataSize(None, None, None, "")
    texts: list[str] = []
    messages = 0
    for r in rows:
        conv = r.get(field_name) if isinstance(r, dict) else None
        if isinstance(conv, list):
            for m in conv:
                if isinstance(m, dict):
                    texts.append(str(m.get("content") or ""))
                    messages += 1
    if not texts:
        return DataSize(n_rows, None, None, "")
    tokens, how = _count_tokens(texts, model_dir)
    per_row = (tokens + TEMPLATE_TOKENS_PER_MESSAGE * messages) / len(rows)
    return DataSize(n_rows, int(per_row * n_rows), per_row, f"{how} over {len(rows)} of {n_rows} rows")


def _count_tokens(texts: list[str], model_dir: str) -> tuple[int, str]:
    tok_file = Path(model_dir) / "tokenizer.json" if model_dir else None
    if tok_file and tok_file.is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tok_file))
            return sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)), "model tokenizer"
        except Exception:
            pass
    return int(sum(len(x) for x in texts) / CHARS_PER_TOKEN), "chars/4"


# =============================================================================================
# The estimate


def _gib(x: float) -> float:
    return round(x / GIB, 2)


def estimate(spec: RunSpec, doc_len: int | None = None, suggest: bool = True) -> Estimate:
    """Predict per-GPU memory and time for a spec (its `auto` fields are resolved for planning, not for running)."""
    plan = make_plan(spec)
    arch, t = plan.arch, spec.train
    mem = memory_model(plan)
    reasons = list(arch.approximate_reasons) + list(plan.reasons) + mem.reasons
    if arch.num_experts:
        reasons.append("MoE step time assumes dense-matmul efficiency for the experts (not calibrated)")

    if plan.device == "cuda":
        assert plan.gpu is not None
        capacity = plan.gpu.memory_gib * GIB
        context = (CUDA_CONTEXT_GIB + (NCCL_GIB if plan.world > 1 else 0.0)) * GIB
        fragmentation = (TRL_FRAGMENTATION_FRACTION if spec.engine == "trl" else FRAGMENTATION_FRACTION) * mem.allocated
        # What the allocator holds beyond that at its peak: each stream's pool at its own largest. The reduce-scatter
        # stream's idle blocks show in nvidia-smi but are free segments the allocator releases before it reports an
        # out-of-memory, so the verdict does not count them.
        idle_pools = max(0.0, mem.default_pool + mem.reduce_pool - mem.allocated)
        # The same for the blocks around the AdamW states: free space inside segments that the working set, at the
        # sizes it asks for, takes again (TRL's limit sat at its allocated peak, limit-4b-trl).
        idle_pools += mem.state_holes
        gpu_name = plan.gpu.name
    else:
        import psutil

        capacity = psutil.virtual_memory().total / plan.nproc
        context = 0.3 * GIB  # interpreter, torch and gloo per rank
        fragmentation = FRAGMENTATION_FRACTION * mem.allocated
        idle_pools = 0.0
        gpu_name = "cpu"
    per_gpu = mem.allocated + fragmentation + context
    breakdown = {k: _gib(mem.breakdown.get(k, 0.0)) for k in BREAKDOWN_KEYS}
    breakdown["cuda_context_nccl"] = _gib(context)
    breakdown["fragmentation"] = _gib(fragmentation)
    headroom = capacity - per_gpu
    if headroom < 0:
        verdict = "does not fit"
    elif headroom < TIGHT_FRACTION * capacity:
        verdict = "tight"
    else:
        verdict = "fits"

    # -- time ---------------------------------------------------------------------------
    data = dataset_size(spec, plan.loaded)
    if doc_len is None:
        doc_len = int(round(data.avg_tokens)) if data.avg_tokens else DEFAULT_DOC_LEN
    packed = spec.engine == "native" or t.packing
    per_rank_seqs = t.micro_batch * t.grad_accum
    if packed:
        tokens_per_step = t.seq_len * per_rank_seqs * plan.world
    else:
        tokens_per_step = min(doc_len, t.seq_len) * per_rank_seqs * plan.world
    flops, attn_flops = flops_per_step(plan, doc_len, tokens_per_step)
    mfu, mfu_source = calibration(plan)
    unwrapped = plan.device == "cuda" and spec.engine == "native" and not plan.sharded
    if unwrapped:
        mfu *= UNWRAPPED_RATE_FACTOR
        mfu_source += f"; × {UNWRAPPED_RATE_FACTOR} for one unwrapped rank"
    elif plan.device == "cuda" and spec.engine == "trl" and not plan.sharded:
        mfu *= TRL_UNWRAPPED_RATE_FACTOR
        mfu_source += f"; × {TRL_UNWRAPPED_RATE_FACTOR} for one unwrapped process (autocast casts)"
    if plan.device == "cuda":
        assert plan.gpu is not None
        rate = plan.world * plan.gpu.ceiling_tflops * 1e12 * mfu
        if plan.attn == "eager":
            step_s = (flops - attn_flops) / rate + attn_flops / (rate * EAGER_ATTENTION_EFFICIENCY)
        else:
            step_s = flops / rate
        if spec.method.kind == "lora" and mem.expert_stack:
            uses = (3 if t.activation_checkpointing else 2) * t.grad_accum
            moved = PARAMWRAPPER_TRAFFIC * uses * mem.expert_stack * 2 * sum(
                1 for i in range(arch.layers) if arch.is_moe_layer(i))
            step_s += moved / (plan.gpu.hbm_tb_s * 1e12 * HBM_EFFICIENCY)
        if mem.host_offload:
            # Each offloaded input comes back over the host link on the compute stream, just before its recompute
            # (the forward copies run on a side stream, overlapped).
            step_s += t.grad_accum * mem.host_offload / (HOST_LINK_GB_S * 1e9)
        step_s += TRL_STEP_OVERHEAD_S if spec.engine == "trl" else \
            UNWRAPPED_STEP_OVERHEAD_S if unwrapped else GPU_STEP_OVERHEAD_S
    else:
        cores = max(1, (os.cpu_count() or 2))
        step_s = flops / (cores * CPU_GFLOPS_PER_CORE * 1e9 * CPU_EFFICIENCY) + CPU_STEP_OVERHEAD_S
        mfu, mfu_source = CPU_EFFICIENCY, "CPU: an assumed share of 20 GFLOP/s per core"
    if t.max_steps is not None:
        steps: int | None = t.max_steps
    elif packed and data.tokens:
        steps = max(1, math.ceil(data.tokens * t.epochs / tokens_per_step))
    elif not packed and data.rows:
        steps = max(1, math.ceil(data.rows * t.epochs / (per_rank_seqs * plan.world)))
    else:
        steps = None
        reasons.append("dataset size unknown offline: set train.max_steps for a total time")
    if data.source and t.max_steps is None:
        reasons.append(f"dataset size: {data.source}")
    setup_s = SETUP_BASE_S[plan.device] + arch.params_total * DTYPE_BYTES[plan.dtype] / (LOAD_GB_PER_S * 1e9)
    total_s = None if steps is None else setup_s + steps * step_s

    notes = ("dataset size:", "one rank", "activation offload:")  # said, but nothing approximate about them
    approx_reasons = [r for r in reasons if not r.startswith(notes)]
    if plan.loaded.note:
        reasons.append(plan.loaded.note)
    approximate = bool(approx_reasons) or plan.device == "cpu"
    est = Estimate(
        fits=verdict != "does not fit", verdict=verdict, headroom_gib=_gib(headroom), per_gpu_gib=_gib(per_gpu),
        per_gpu_allocated_gib=_gib(mem.allocated), per_gpu_reserved_gib=_gib(per_gpu + idle_pools),
        gpu_memory_gib=round(capacity / GIB, 2), gpu=gpu_name,
        world_size=plan.world, breakdown=breakdown, step_s=round(step_s, 3), steps=steps,
        total_s=None if total_s is None else round(total_s, 1), tokens_per_step=tokens_per_step,
        flops_per_step=float(f"{flops:.4g}"), mfu_assumed=mfu, approximate=approximate,
        approximate_reason="; ".join(reasons), suggestion=None,
        arch={"model_type": arch.model_type, "params_total": arch.params_total, "params_active": arch.params_active,
              "layers": arch.layers, "vocab": arch.vocab},
        peak_phase=mem.peak_phase, device=plan.device, engine=spec.engine, method=spec.method.kind,
        seq_len=t.seq_len, attn_implementation=plan.attn, loss_impl=plan.loss_impl,
        activation_checkpointing=t.activation_checkpointing, params_trainable=mem.trainable,
        arch_source=plan.loaded.source, doc_len=doc_len, dataset_tokens=data.tokens, mfu_source=mfu_source,
        phases_gib={k: _gib(sum(v.values())) for k, v in mem.phases.items()},
        host_offload_gib=_gib(mem.host_offload),
    )
    if suggest and verdict != "fits":
        est.suggestion = suggestion(spec, est, doc_len)
    return est


# =============================================================================================
# What-if: the cheapest change that fits


def _candidates(spec: RunSpec, plan_world: int, nproc: int) -> list[tuple[str, list[str]]]:
    t, hw = spec.train, spec.hardware
    out: list[tuple[str, list[str]]] = []
    if spec.engine == "native" and planned_loss(spec) == "full":
        out.append(("chunked loss", ["train.loss_impl=chunked"]))
    if not t.activation_checkpointing:
        out.append(("activation checkpointing on", ["train.activation_checkpointing=true"]))
    s = t.seq_len // 2
    while s >= 256:
        out.append((f"{s:,} tokens per block", [f"train.seq_len={s}"]))
        s //= 2
    if spec.method.kind == "full":
        out.append(("LoRA", ["method.kind=lora"]))
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
    for label, overrides in _candidates(spec, est.world_size, nproc):
        try:
            alt = estimate(load_spec(base, overrides), doc_len=doc_len, suggest=False)
        except UserError:
            continue
        tried.append((label, alt))
        if alt.verdict in target:
            return (f"{label} ({' '.join('--set ' + o for o in overrides)}): predicted {alt.per_gpu_gib:.1f} of "
                    f"{alt.gpu_memory_gib:.1f} GiB per GPU")
    if est.verdict == "tight":
        return "tight: no single change makes room; consider more GPUs or fewer tokens per block"
    return "no single change fits: combine them (e.g. LoRA with fewer tokens per block) or plan for a larger GPU"


# =============================================================================================
# Sweeps and the CLI


def parse_sweep(arg: str) -> tuple[str, list[Any]]:
    """`train.seq_len=8192,32768` → ('train.seq_len', [8192, 32768]); bad syntax or fields are UserErrors."""
    if "=" not in arg:
        raise UserError("bad --sweep", [Problem("--sweep", f"'{arg}' has no '='",
                                                "write it as train.seq_len=8192,32768")])
    key, raw = arg.split("=", 1)
    key = key.strip()
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not key:
        raise UserError("bad --sweep", [Problem("--sweep", f"'{arg}' names no field", "write it as field=v1,v2")])
    if not values:
        raise UserError("bad --sweep", [Problem(key, f"--sweep {arg} has no values", f"write it as {key}=v1,v2")])
    apply_override({}, f"{key}={values[0]}")  # unknown fields raise SpecError naming the field
    return key, values


def sweep(spec: RunSpec, sweeps: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """The estimate for every combination of the swept values; each row carries the values it used."""
    base = spec.to_dict()
    rows: list[dict[str, Any]] = []
    keys = [k for k, _ in sweeps]
    for combo in itertools.product(*(vals for _, vals in sweeps)):
        overrides = [f"{k}={v}" for k, v in zip(keys, combo)]
        row_spec = load_spec(base, overrides)
        est = estimate(row_spec).to_dict()
        values = {}
        for k in keys:
            node: Any = row_spec.to_dict()
            for part in k.split("."):
                node = node[part]
            values[k] = node
        rows.append({**values, "swept": values, **est})
    return rows


def estimate_cli(spec_ref: str, overrides: list[str], sweeps: list[str], as_json: bool) -> int:
    parsed = [parse_sweep(s) for s in sweeps]
    spec = load_spec(spec_ref, overrides)
    if parsed:
        rows = sweep(spec, parsed)
        if as_json:
            print(json.dumps(rows))
        else:
            _print_sweep(spec, rows, [k for k, _ in parsed])
        return 0
    est = estimate(spec)
    if as_json:
        print(json.dumps(est.to_dict()))
    else:
        _print_estimate(spec, est)
    return 0


VERDICT_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "red"}


def _hours(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _print_estimate(spec: RunSpec, est: Estimate) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    a = est.arch
    active = f", {_count(a['params_active'])} active" if a["params_active"] != a["params_total"] else ""
    console.print(f"[bold]{spec.name}[/bold]: {spec.model.id} ({a['model_type']}, {_count(a['params_total'])} params"
                  f"{active}), {est.engine} {est.method}, {est.world_size} × {est.gpu}, "
                  f"{est.seq_len:,} tokens per block, "
                  f"{est.attn_implementation}, loss {est.loss_impl}, checkpointing "
                  f"{'on' if est.activation_checkpointing else 'off'}")
    table = Table(title=f"per-{'GPU' if est.device == 'cuda' else 'rank'} memory at the peak ({est.peak_phase})",
                  show_header=True)
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for k, v in est.breakdown.items():
        table.add_row(k, f"{v:.2f}")
    table.add_row("[bold]total (needed)[/bold]", f"[bold]{est.per_gpu_gib:.2f}[/bold]")
    table.add_row("allocated peak", f"{est.per_gpu_allocated_gib:.2f}")
    if est.per_gpu_reserved_gib > est.per_gpu_gib:
        table.add_row("reserved, as nvidia-smi shows it", f"{est.per_gpu_reserved_gib:.2f}")
    console.print(table)
    style = VERDICT_STYLE[est.verdict]
    console.print(f"[{style}]{est.verdict}[/{style}]: {est.per_gpu_gib:.1f} of {est.gpu_memory_gib:.1f} GiB "
                  f"(headroom {est.headroom_gib:.1f} GiB)")
    console.print(f"time: {est.step_s:.2f} s/step × {est.steps if est.steps is not None else '?'} steps = "
                  f"{_hours(est.total_s)} with setup ({est.tokens_per_step:,} tokens/step, "
                  f"{est.flops_per_step:.3g} FLOP/step, utilisation {est.mfu_assumed:.2f} assumed)")
    if est.suggestion:
        console.print(f"suggestion: {est.suggestion}")
    if est.approximate_reason:
        console.print(f"[dim]{'approximate: ' if est.approximate else 'notes: '}{est.approximate_reason}[/dim]")


def _print_sweep(spec: RunSpec, rows: list[dict[str, Any]], keys: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{spec.name}: {spec.model.id}")
    short = [k.split(".")[-1] for k in keys]
    for k, name in zip(keys, short):
        table.add_column(name if short.count(name) == 1 else k, no_wrap=True)
    for col in ("GiB/GPU", "of GiB", "verdict", "s/step", "total h"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        style = VERDICT_STYLE[r["verdict"]]
        total = "-" if r["total_s"] is None else f"{r['total_s'] / 3600:.2f}"
        table.add_row(*[str(r["swept"][k]) for k in keys], f"{r['per_gpu_gib']:.1f}", f"{r['gpu_memory_gib']:.1f}",
                      f"[{style}]{r['verdict']}[/{style}]", f"{r['step_s']:.2f}", total)
    Console(highlight=False).print(table)
