"""What an estimate returns: the `Estimate` that `runner estimate` prints and the record keeps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runner.plan.constants import DEFAULT_DOC_LEN

PER_GPU_BASIS = {
    "cuda": "peak allocated by PyTorch plus fragmentation, CUDA context and NCCL buffers; per_gpu_reserved_gib adds "
            "the reduce-scatter pool's idle blocks (what nvidia-smi shows)",
    "cpu": "peak resident memory (RSS) of one rank process: the process itself (interpreter, torch, gloo), its "
           "tensors and the allocator's share; CPU ranks report the same quantity (peak_mem_gib.rss)",
}


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
    hfu_assumed: float
    approximate: bool
    approximate_reason: str
    suggestion: str | None
    arch: dict[str, Any]
    peak_phase: str = ""
    per_gpu_basis: str = ""
    """What per_gpu_gib counts, in words (PER_GPU_BASIS)."""
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
    hfu_source: str = ""
    phases_gib: dict[str, float] = field(default_factory=dict)
    host_offload_gib: float = 0.0
    """Pinned host memory per rank for offloaded activations (train.offload_activations); not in per_gpu_gib."""
    host_memory_gib: float | None = None
    """This node's host memory, which offloaded activations of all its ranks must fit in (None without offload)."""

    peak_mem_gib: dict[str, float] = field(default_factory=dict)
    """The estimate of what the ranks measure, under the names they report it with (their `end` event's
    `peak_mem_gib`, the record's `metrics.per_rank.<r>.peak_mem`): on GPU `allocated` and `reserved` (PyTorch's
    peaks, no CUDA context), on CPU `rss` (the rank process's resident memory)."""
    approximate_scope: str = ""
    """Why the estimate is outside what was measured (model family, GPU type or number of ranks), or "" inside."""

    dataset_format: dict[str, Any] | None = None
    """The rows' format as detected (or set by dataset.format) on a sample of a local file; None for hub data."""
    packing: dict[str, Any] | None = None
    """Packing the sampled rows by train.packing_strategy: blocks, packing_efficiency (real tokens per block
    token), split_documents, sampled_rows; None when not packing or without a local sample."""

    levers: dict[str, Any] = field(default_factory=dict)
    """Every speed lever as the run will have it (runner.plan.autotune): no `auto` left."""
    levers_tuned: list[str] = field(default_factory=list)
    """The levers the planner chose (they were `auto` in the spec); the others were set."""
    levers_reason: str = ""
    """The choice and why, in words: "recompute 20 of 28 layers, ...: the fastest that leaves 8.0 GiB free"."""
    runners_up: list[dict[str, Any]] = field(default_factory=list)
    """The best candidates of the other lever groups, fastest first: their levers, step_s, per_gpu_gib, fits."""
    planner_headroom_gib: float = 0.0
    """Memory per GPU the planner left free when it chose (hardware.headroom_gib, else 5% of the device's)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

