"""The planning context: a spec with its `auto` fields filled for planning (no GPU needed), and the engines'
decisions the estimator plans with."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

from runner.catalog import Arch, LoadedArch, load_arch
from runner.errors import Problem, UserError
from runner.gpus import GpuType, detect_gpu, gpu_type
from runner.spec import RunSpec


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
    # Looked up on the package, where a caller planning for another setup (the H200 rows: no flash-linear-attention)
    # replaces it.
    import runner.estimate as package

    return Plan(spec, device, gpu, nproc, nproc * hw.nodes, dtype, planned_attention(spec, device), planned_loss(spec),
                loaded, tuple(reasons), gdn_torch=not package.gdn_kernels_installed())


@functools.lru_cache(maxsize=64)
def _load_arch_cached(model_id: str, revision: str | None, path: str | None) -> LoadedArch:
    from types import SimpleNamespace

    return load_arch(SimpleNamespace(model=SimpleNamespace(id=model_id, revision=revision, path=path)))



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


def gdn_kernels_installed() -> bool:
    """flash-linear-attention importable (the gated-delta kernels); checked without importing it."""
    return importlib.util.find_spec("fla") is not None


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
