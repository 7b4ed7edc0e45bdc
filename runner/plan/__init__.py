"""Per-GPU memory and time before launch.

`estimate(spec)` plans a run: `plan` fills the spec's `auto` fields as the engines will, `memory` builds the bytes of
each phase of a step from `activations` and `lora`, `timing` turns FLOPs into seconds at a calibrated rate,
`data_size` reads how many tokens the dataset holds, and `whatif` searches the cheapest change that fits. Every
constant is in `constants`, with its source. Printing lives in runner/cli/main.py.
"""

from runner.plan.activations import backward_transient_bytes, layer_activation_bytes
from runner.plan.constants import *  # noqa: F403 (the constants are part of the estimator's interface)
from runner.plan.core import predict
from runner.plan.data_size import DataSize, dataset_size
from runner.plan.lora import lora_params
from runner.plan.memory import memory_model
from runner.plan.choices import (
    Plan,
    _load_arch_cached,
    fused_chunk_tokens,
    gdn_kernels_installed,
    make_plan,
    planned_attention,
    planned_loss,
)
from runner.plan.result import Estimate
from runner.plan.sweep import parse_sweep, sweep
from runner.plan.timing import calibration, flops_per_step
from runner.plan.whatif import estimate, method_comparison, suggestion

__all__ = [
    "DataSize", "Estimate", "Plan", "_load_arch_cached", "backward_transient_bytes", "calibration", "dataset_size",
    "estimate", "flops_per_step", "predict", "fused_chunk_tokens", "gdn_kernels_installed", "layer_activation_bytes",
    "lora_params", "make_plan", "memory_model", "method_comparison", "parse_sweep",
    "planned_attention", "planned_loss", "suggestion", "sweep",
]
