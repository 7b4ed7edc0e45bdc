"""The estimator's constants, each with its source (benchmarks/estimator-notes.md has the derivations and the
measured rows they were fitted on or checked against: benchmarks/memory-calibration-h200.json, native-h200.json)."""

from __future__ import annotations

from typing import Any

from runner.facts.flops import GDN_CHUNK  # noqa: F401 (the kernels' chunk length, for the activation count)

GIB = 1024**3


def gib(x: float) -> float:
    """Bytes as GiB, rounded to what the estimate reports."""
    return round(x / GIB, 2)


DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
ADAM_STATES_PER_PARAM = 2
"""torch.optim.AdamW keeps exp_avg and exp_avg_sq in the parameter's dtype."""
NF4_BYTES_PER_PARAM = 0.5
"""method.kind=qlora: a frozen Linear weight in NF4 is one 4-bit code."""
NF4_SCALE_BYTES_PER_PARAM = 1 / 64 + 4 / (64 * 256)
"""Its scales: one int8 absmax per block of 64 weights (double-quantized), and per 256 of those one 4-byte factor
(torchao: a bf16 factor; bitsandbytes: an fp32 one; the larger is counted)."""
NATIVE_REDUCE_BYTES = 4
"""runner/train/model.py: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): reduce-scatter input in fp32."""
TRL_REDUCE_BYTES = 2
"""accelerate's bf16 FSDP2 policy reduces in bf16 (utils/dataclasses.py: param_dtype = reduce_dtype = bf16)."""

LOGITS_BYTES_PER_ELEM = 14.0
"""Peak bytes per (token × vocab) of a full cross-entropy. Counted: bf16 logits (2) + fp32 upcast (4) + log_softmax
output (4) in forward; in backward the saved log_softmax output (4) + its incoming grad (4) + the upcast's grad (4)
= 12, plus the bf16 logits (2) when the loop still holds the model output (the 27B notebook's `out`). Calibrated
to 14 on the H200 plain-loop peaks (benchmarks/estimator-notes.md)."""
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
ACTIVATION_CALIBRATION = 1.0
"""Measured / counted per-layer activations. Fitted on the native engine's Qwen3-0.6B 8k run without checkpointing
(H200, memory-calibration-h200.json): the count itself. The reference plain loop (references.md, 1.72B) implies
more: it is not our engine, and its extra has not been traced (benchmarks/estimator-notes.md)."""
NORM_UPCAST_BYTES = 4
"""HF RMSNorm casts its input to fp32 and keeps that copy for backward (plus the normalised output)."""
GDN_TORCH_PATH_BYTES = 80.0
"""Extra bytes a gated-delta layer keeps for backward per token and per element of its value width (value heads ×
value head dim) when flash-linear-attention is not installed and the layer runs transformers' PyTorch chunk rule
(once per document, runner/train/attention.py): that path computes in fp32 and autograd keeps its intermediates
(about 20 fp32 tensors of the value width). Fitted on the H200 hybrid LoRA 8k row; the 2k and 32k rows are held
out (memory-calibration-h200.md, benchmarks/estimator-notes.md)."""
COMPILED_ACTIVATION_FACTOR = 0.72
"""Share of a decoder layer's saved activations that remains when the layer is torch.compile'd (train.compile):
inductor fuses the norms, rotary and SwiGLU elementwise chains and keeps fewer intermediates. Fitted on the
H200 1.72B 32k bench row with 4 layers not recomputed; the other compiled rows are held out
(benchmarks/estimator-notes.md)."""
SDPA_MASK_BYTES_PER_ELEM = 7.0
"""sdpa on packed documents: transformers builds a dense s × s mask for the step (bool, 1 B) and the efficient
kernel takes an additive bf16 copy of it during each call. Calibrated on the H200 reference at 32k tokens,
sdpa against flex attention: ~7 B per s² element (benchmarks/estimator-notes.md)."""
SDPA_MASK_BYTES_PER_ELEM_CPU = 1.0
"""The same on CPU: the bool mask as transformers builds it, once per step."""
SDPA_CPU_MASK_COPIES_PER_LAYER = 1.0
"""With a mask, torch's CPU sdpa (its flash kernel) converts the bool mask at every call into an additive one in the
query's dtype, which its backward saves: each layer that keeps its activations keeps its own s × s copy (4 B in
fp32), and a recomputed layer makes it again in its recompute (the mask's negation the conversion passes through is
gone before the step's peak: counting it put every capped probe below 10% over). Fitted on the embedded
model's peak resident memory (4 layers, 2 CPU ranks, one block): ~17 B per s² element with no recomputation = 1
(bool mask) + 4 layers × 4 B, ~5.5 B with three of the four layers recomputed (benchmarks/long-blocks-cpu.md,
benchmarks/estimator-notes.md)."""
EAGER_SCORE_COPIES_TRANSIENT = 2.0
"""Eager attention: besides the saved softmax probabilities, the scores / masked / shifted copies (forward) or the
probabilities' and scores' gradients (backward) of one layer are alive at once."""
PARAMWRAPPER_MERGED_COPIES = 1.0
"""Copies of a layer's expert stack alive at that layer's backward under peft's ParamWrapper (LoRA on 3-D expert
tensors, bf16 base). peft 0.21 folds the adapter into one `baddbmm(W, A, B)` (peft/tuners/lora/layer.py,
_LoraFactorsProxy), so the merged weight W + B·A exists once and the matmuls keep it for backward; its gradient
comes after the layer's expert activations have started to go. Was 2 (counted merged weight + gradient); the
2-layer GPT-OSS LoRA run on the H200 peaked one stack below that figure: fitted to 1 there
(benchmarks/estimator-notes.md)."""

CUDA_CONTEXT_GIB = 0.6
"""CUDA context and kernels outside PyTorch's allocator (~500–600 MiB on Hopper with lazy module loading)."""
NCCL_GIB = 1.0
"""NCCL communicator buffers with more than one rank."""
CPU_PROCESS_GIB = 0.56
"""Peak resident memory of a CPU rank before its training tensors: the interpreter, torch, transformers, the
tokenizer, gloo, and what loading them passes through. Fitted on the embedded demo's ranks (512-token blocks;
benchmarks/estimator-notes.md). A CPU estimate predicts peak RSS per rank, the quantity CPU ranks report
(`mem_gib`, `peak_mem_gib.rss`: the process's high-water mark)."""
FRAGMENTATION_FRACTION = 0.15
"""Reserved beyond the allocated peak and the streams' pools (memory_model's default_pool + reduce_pool), as a
share of the allocated peak: blocks cached at one phase's sizes that another phase cannot reuse. Fitted on the
seven native runs of memory-calibration-h200.json (H200): about their median (benchmarks/estimator-notes.md)."""
TRL_FRAGMENTATION_FRACTION = 0.04
"""The same share for the TRL engine, whose allocation pattern leaves fewer holes. Fitted on the TRL rows of
memory-calibration-h200.md (dense 0.6B, 1.72B and 4B, 8k and 32k, full and LoRA) and checked against TRL's largest
block on one H200 (bench-h200/limit-4b-trl.json; the figures in benchmarks/estimator-notes.md)."""
TIGHT_FRACTION = 0.05
"""Headroom below this share of device memory is 'tight': it should fit, but a longer document or a different
allocator pattern can tip it over."""

DEFAULT_DOC_LEN = 2048
"""Average document length for causal-attention FLOPs when the dataset cannot be sampled."""
TEMPLATE_TOKENS_PER_MESSAGE = 5
"""Chat-template tokens around each message (ChatML: <|im_start|>role\\n ... <|im_end|>\\n)."""
CHARS_PER_TOKEN = 4.0
DATASET_SAMPLE_ROWS = 256
WHOLE_FILE_ROWS = 10_000
"""A local data file of at most this many rows is read whole: exact token counts, and planned steps that are the
steps the ranks run (runner.plan.timing.shard_steps). About a second for the embedded 2,500 rows."""

PARAMWRAPPER_TRAFFIC = 3.0
"""Bytes moved per byte of a layer's expert stack each time ParamWrapper merges it (write B·A, read W and the delta,
write W + delta); it happens in the forward, in the recompute and once more for the merged weight's gradient."""
NF4_DEQUANT_TRAFFIC = 8.0
"""Bytes moved per NF4 weight each time it is dequantized for a matmul (read the codes and scales, look the codes
up, scale, write the bf16 copy: torchao's unfused ops), in the forward, the recompute and the backward. Not yet
measured (benchmarks/qlora_gpu.py measures the step time it feeds)."""
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
}
"""Hardware FLOPs utilisation (recompute included) against the GPU's practical matmul ceiling, by (engine, GPU,
compiled decoder layers). TRL's was fitted on the 1.72B long-conversation rows, where the 32k and 8k steps give
the rate and the per-step overhead together; the compiled native rate on the latest 32k rows of the engine as it is
(each source says which). tests/unit/test_estimate.py checks every 32k bench row against the time model, the
exceptions listed there with their reasons. A missing (engine, GPU, compiled) falls back to the same engine on
the H200, then to the other compile setting."""
HOST_LINK_GB_S = 47.0
"""Host-to-GPU copy rate from pinned memory that offloaded activations come back at: the rate with both
directions at once (offload copies out and back can overlap), the conservative one of those measured on one H200
(benchmarks/host_link_bw.py, benchmarks/host-link-h200.json; the figures in benchmarks/estimator-notes.md)."""
GPU_STEP_OVERHEAD_S = 0.05
"""Per-step host work (data, logging, the ranks' agreement all-reduce) not hidden by the GPU."""
UNWRAPPED_RATE_FACTOR = 1.064
UNWRAPPED_STEP_OVERHEAD_S = 0.0
"""One native rank that trains the plain module (no FSDP2): the CALIBRATION rates and GPU_STEP_OVERHEAD_S were fitted
on wrapped runs, whose per-layer copies cost GPU and host time. The rate is fitted on the 1.72B runs of the same
commands unwrapped at 32k (bench-1p7b-32k-unwrapped against bench-1p7b-32k). No per-step overhead shows beside it on
the 30-step 8k rows of realistic conversations (longchat-*-8k-native, both families). An overhead fitted before on 8k
rows came from the fused loss compiling again after the warm-up (runner/train/loss.py, CompiledChunkCE). The step
times: benchmarks/estimator-notes.md."""
TRL_STEP_OVERHEAD_S = 0.12
"""The same for the TRL engine (Trainer callbacks, logging, accelerate's step): fitted with its H200 rate above, and
refitted on the 30-step 8k rows of realistic conversations (longchat-*-8k-trl*; benchmarks/estimator-notes.md)."""
TRL_UNWRAPPED_RATE_FACTOR = 0.93
"""One TRL process training the plain module (autocast casts each fp32 weight to bf16 in forward, in the
recompute and in backward, where FSDP2 copied each layer once per pass): its H200 rate was fitted wrapped. Fitted
on the 32k rows of the same commands plain, 1.72B and 4.02B (bench-1p7b-32k-plain, bench-4b-32k-plain, against the
wrapped rows; benchmarks/estimator-notes.md)."""
CPU_RANK_GFLOPS = 25.0
CPU_STEP_OVERHEAD_S = 0.06
"""A CPU rank runs one thread (runner/launch/command.py sets OMP_NUM_THREADS=1): hardware FLOPs at this rate per rank, up to
one rank per core, plus this per-step overhead (gloo collectives, Python). The slope was fitted on a 2-core machine
shared with other work, at 512 and 2,048 tokens, scaled by that machine's slowdown; the overhead on the embedded
demo (`runner run tiny-cpu`, whole conversations packed by bfd) on a quiet 2-core machine (the step times:
benchmarks/estimator-notes.md). Tolerance: within 25 % of a quiet machine's step; other load on the cores slows a
run by as much as it takes."""
SETUP_BASE_S = {"cuda": 90.0, "cpu": 13.0}
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

BREAKDOWN_KEYS = ("params", "quantized", "quant_scales", "dequant", "grads", "optimizer", "fsdp_buffers",
                  "activations", "logits_loss", "lora", "cuda_context_nccl", "fragmentation")
"""The parts of a GPU estimate; a CPU estimate has `process` (CPU_PROCESS_GIB) where a GPU has `cuda_context_nccl`.
QUANT_KEYS appear only in a QLoRA estimate: there `params` is what stays unquantized (embeddings, norms, lm_head)."""
QUANT_KEYS = ("quantized", "quant_scales", "dequant")
"""QLoRA's parts: the NF4 codes, their scales, and one Linear weight's bf16 copy while it is dequantized."""


ATTENTION_RATE_FACTOR = {"flash-attn-4": 1.2}
"""Attention FLOPs through flash-attn-4's varlen kernel run at this multiple of the engine's fitted rate (the rest of
the step runs at the rate itself). Fitted on the long-conversation rows (benchmarks/bench-h200/longchat-*.json: 1.72B
and Llama-3.2-3B layouts, 8k and 32k, both engines); with 1.0 the 8k rows came out slow. The kernel itself runs below
the matmul rate (benchmarks/attention-h200.txt; the figures in benchmarks/estimator-notes.md): the factor also
absorbs that the rate, fitted on short documents, understates these steps' dense part. torch's kernel keeps 1.0 (no
long-document rows with it)."""
