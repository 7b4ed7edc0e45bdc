"""GPU types: memory, bf16 peak and practical matmul ceiling of each accelerator, and which one this machine has."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from runner.errors import Problem, UserError
from runner.machine import Machine

# Where no matmul ceiling has been measured, the practical ceiling is this share of the datasheet peak:
# the H200 here runs an 8192³ bf16 matmul at ~790 of its 989 TFLOP/s (references.md, "The machine we can measure on").
PRACTICAL_MATMUL_FRACTION = 790.0 / 989.4

MIB_PER_GIB = 1024.0


@dataclass(frozen=True)
class GpuType:
    """One accelerator type: memory as the device reports it, dense bf16 peak, and a practical matmul ceiling."""

    name: str
    memory_gib: float
    """Total memory as `nvidia-smi --query-gpu=memory.total` / torch `total_memory` report it (GiB)."""
    bf16_tflops: float
    """Dense bf16 tensor-core peak from the datasheet (no sparsity)."""
    matmul_tflops: float | None = None
    """Measured practical bf16 matmul ceiling, where known."""
    hbm_tb_s: float = 3.35
    """Memory bandwidth from the datasheet (TB/s), for memory-bound work such as merging LoRA into expert stacks."""
    nvml_patterns: tuple[str, ...] = ()
    """Regexes matched (case-insensitively) against NVML device names to detect this type."""
    source: str = ""

    @property
    def ceiling_tflops(self) -> float:
        """The throughput MFU is measured against: the measured matmul ceiling, else a share of the datasheet peak."""
        return self.matmul_tflops if self.matmul_tflops else self.bf16_tflops * PRACTICAL_MATMUL_FRACTION


GPUS: dict[str, GpuType] = {g.name: g for g in (
    GpuType("A100-40GB", 40960 / MIB_PER_GIB, 312.0, None, 1.555, (r"A100.*40\s*GB",),
            "NVIDIA A100 datasheet (312 TFLOP/s dense bf16); 40960 MiB reported"),
    GpuType("A100-80GB", 81920 / MIB_PER_GIB, 312.0, None, 2.039, (r"A100.*80\s*GB",),
            "NVIDIA A100 datasheet (312 TFLOP/s dense bf16); 81920 MiB reported"),
    GpuType("L40S", 46068 / MIB_PER_GIB, 362.05, None, 0.864, (r"L40S",),
            "NVIDIA L40S datasheet (362 TFLOP/s dense bf16, 733 with sparsity); 46068 MiB reported"),
    GpuType("RTX-4090", 24564 / MIB_PER_GIB, 165.2, None, 1.008, (r"RTX\s*4090",),
            "NVIDIA Ada whitepaper (165 TFLOP/s dense bf16 with fp32 accumulate); 24564 MiB reported"),
    GpuType("H100-80GB", 81559 / MIB_PER_GIB, 989.4, None, 3.35, (r"H100(?!.*NVL)", r"H800"),
            "NVIDIA H100 SXM datasheet (989 TFLOP/s dense bf16); 81559 MiB reported"),
    GpuType("H200", 143771 / MIB_PER_GIB, 989.4, 790.0, 4.8, (r"H200",),
            "NVIDIA H200 datasheet (989 TFLOP/s dense bf16); 143771 MiB reported; "
            "790 TFLOP/s measured (references.md)"),
    GpuType("B200", 183359 / MIB_PER_GIB, 2250.0, None, 8.0, (r"B200",),
            "NVIDIA HGX B200 datasheet (36 PFLOP/s sparse bf16 per 8 GPUs = 2.25 dense each); 183359 MiB reported"),
    GpuType("B300", 275040 / MIB_PER_GIB, 2250.0, None, 8.0, (r"B300",),
            "NVIDIA HGX B300 datasheet (2.25 PFLOP/s dense bf16 per GPU); 275040 MiB reported by a "
            "'B300 SXM6 AC' (288 GB HBM3e)"),
    GpuType("MI300X", 205822885888 / 1024**3, 1307.4, None, 5.3, (r"MI300X",),
            "AMD Instinct MI300X datasheet (1307 TFLOP/s dense bf16); 205822885888 B reported by ROCm"),
)}


def gpu_names() -> list[str]:
    """The GPU type names `hardware.gpu` accepts for planning."""
    return list(GPUS)


def _norm_gpu(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def gpu_type(name: str) -> GpuType:
    """The catalog entry for a GPU type name (case and punctuation ignored: 'h100-80gb', 'H100_80GB')."""
    wanted = _norm_gpu(name)
    for g in GPUS.values():
        if _norm_gpu(g.name) == wanted:
            return g
    # A bare family name is fine when it is unambiguous (H100 → H100-80GB); A100 alone is not.
    family = [g for g in GPUS.values() if _norm_gpu(g.name).startswith(wanted)] if wanted else []
    if len(family) == 1:
        return family[0]
    names = list(GPUS)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.4)
    fix = f"did you mean '{close[0]}'?" if close else "use one of the known names"
    raise UserError(f"unknown GPU type '{name}'", [Problem("hardware.gpu", f"'{name}' is not one of {', '.join(names)}",
                                                           fix)])


def match_gpu_name(device_name: str, mem_total_gib: float | None = None) -> GpuType | None:
    """Map an NVML device name (e.g. 'NVIDIA H100 80GB HBM3') to a catalog entry, or None."""
    hits = [g for g in GPUS.values() if any(re.search(p, device_name, re.IGNORECASE) for p in g.nvml_patterns)]
    if not hits and mem_total_gib and "A100" in device_name.upper():
        # Some A100 names carry no size: pick by reported memory.
        hits = [GPUS["A100-80GB"] if mem_total_gib > 60 else GPUS["A100-40GB"]]
    return hits[0] if hits else None


def detect_gpu() -> tuple[GpuType, int] | None:
    """(type, count) of this machine's GPUs through NVML; None when none is visible (or NVML is missing).

    A GPU the catalog does not know is planned with its reported memory and the H100's throughput, which is
    stated in the estimate's approximate_reason by the caller (its name starts with 'unknown:').
    """
    from runner.facts.nvml import detect_gpus

    found = detect_gpus()
    if not found:
        return None
    first = found[0]
    name = first.get("name") or "unknown GPU"
    mem = first.get("mem_total_gib")
    g = match_gpu_name(name, mem)
    if g is None:
        ref = GPUS["H100-80GB"]
        g = GpuType(f"unknown:{name}", float(mem or 0.0), ref.bf16_tflops, None, ref.hbm_tb_s, (),
                    "detected; throughput assumed H100")
    return g, len(found)


def ceiling_tflops_here(device: str) -> float | None:
    """The practical matmul ceiling (TFLOP/s per GPU) of this machine's GPUs, which MFU is measured against; None
    on CPU or when no GPU is visible."""
    if device != "cuda":
        return None
    try:
        found = detect_gpu()
    except Exception:  # noqa: BLE001 - NVML trouble: no MFU, the run goes on
        return None
    return found[0].ceiling_tflops if found else None


def machine_of(detected: tuple[GpuType, int] | None) -> Machine:
    """`detect_gpu`'s answer as the Machine a plan sees (a type the catalog does not know has no catalog name)."""
    if detected is None:
        return Machine()
    g, count = detected
    return Machine(count, None if g.name.startswith("unknown:") else g.name)


def machine_from_nvml(found: list[dict]) -> Machine:
    """NVML's GPU list (runner.facts.nvml.detect_gpus) as a Machine."""
    if not found:
        return Machine()
    g = match_gpu_name(found[0].get("name") or "", found[0].get("mem_total_gib"))
    return Machine(len(found), g.name if g else None)


HOST_RESERVE_BYTES = 4 << 30
"""Host memory the engine leaves free when page-locking buffers for activation offload: it refuses to lock more
(runner.train.offload), and the estimator counts it."""

HOST_RANK_BYTES = int(7.5 * 2**30)
"""Host memory a rank takes besides its offloaded activations, the OS and the launcher counted in: fitted on a
one-GPU H200 node from what a Qwen3-4B layout rank could lock (benchmarks/README.md).
Counted per rank, so it over-counts the OS's share on nodes of several ranks."""


def host_capacity(host_memory_gib: float | None, has_gpus: bool | None = None) -> float | None:
    """A node's host memory (bytes): hardware.host_memory_gib where stated, else this machine's when it has GPUs
    (a run or a plan on the node that runs it; `has_gpus` where the caller asked NVML already); planned elsewhere,
    unknown (None)."""
    if host_memory_gib is not None:
        return host_memory_gib * 2**30
    if not (detect_gpu() is not None if has_gpus is None else has_gpus):
        return None
    import psutil

    return float(psutil.virtual_memory().total)


def offloaded_layers(recomputed: int, layer_input_bytes: float, ranks_per_node: int, host_bytes: float | None) -> int:
    """How many of the recomputed layers (the first ones) send their input to page-locked host memory
    (train.offload_activations): all that the node's host holds beside what each rank takes and what is kept free.
    The others keep their input on the GPU, so a block longer than the host can hold still trains where the GPU
    has room. The engine (runner.train.native) and the estimator (runner.plan.memory) both ask here."""
    if host_bytes is None or layer_input_bytes <= 0:
        return recomputed
    room = host_bytes - HOST_RESERVE_BYTES - ranks_per_node * HOST_RANK_BYTES
    return max(0, min(recomputed, int(room // (ranks_per_node * layer_input_bytes))))


def regenerated_layers(recomputed: int, hosted: int, eager: bool) -> int:
    """Of the recomputed layers whose input the host cannot hold, how many regenerate it in backward instead, from
    the layer before's input in host memory (runner.train.regenerate): one per hosted layer, as many as are short.
    Eager layers only: a compiled layer's forward run again outside its graph could differ in the last bits. The
    rest keep their input on the GPU. The engine and the estimator both ask here."""
    return max(0, min(hosted, recomputed - hosted)) if eager else 0


HOSTED, SOURCE, REGENERATED, ON_GPU = "host", "source", "regenerated", "gpu"


def layer_input_places(recomputed: int, hosted: int, regenerated: int) -> list[str]:
    """Where each recomputed layer's input waits for its backward: the first 2 × `regenerated` layers in pairs, a
    SOURCE (in host memory, read again to regenerate the next layer's) and a REGENERATED one; then HOSTED ones; the
    last ON_GPU (backward frees them first, so they cost little at its peak)."""
    pairs = [SOURCE, REGENERATED] * regenerated
    return (pairs + [HOSTED] * (hosted - regenerated) + [ON_GPU] * recomputed)[:recomputed]
