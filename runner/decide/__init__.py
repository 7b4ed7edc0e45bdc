"""Decide once: the hardware a run gets (`resolve_hardware`) and every engine choice for it (`decide`, `decide_run`),
made before launch and obeyed by the ranks (runner.decide.decisions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.decide.decisions import Decisions, LayerPlan, Machine, decide
from runner.errors import Problem, UserError

__all__ = ["Decisions", "Hardware", "LayerPlan", "Machine", "decide", "decide_run", "model_config",
           "resolve_hardware"]


@dataclass(frozen=True)
class Hardware:
    """hardware.* resolved once for planning and launching: the device, GPU type, ranks and the node's host memory."""

    device: str
    gpu: Any
    """runner.facts.gpus.GpuType, or None on CPU."""
    nproc: int
    world: int
    host_bytes: float | None
    reasons: tuple[str, ...] = ()
    detected: bool = False
    """The GPU was detected here (the plan is made on the node that runs it)."""

    def machine(self, kernels: Any = None) -> Machine:
        gpu_bytes = self.gpu.memory_gib * 2**30 if self.gpu else 0.0
        return Machine(self.device, self.nproc, self.world, gpu_bytes, self.host_bytes, kernels)


def resolve_hardware(spec: Any) -> Hardware:
    """The device, GPU type and ranks a run of `spec` gets: hardware.gpu named or detected here; ranks per node as
    runner.machine resolves them."""
    from runner.facts.gpus import detect_gpu, gpu_type, host_capacity, machine_of
    from runner.machine import Machine as Gpus
    from runner.machine import ranks_per_node, target_machine

    hw, reasons = spec.hardware, []
    device, gpu, detected = hw.device, None, None
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
    gpus = Gpus()
    if hw.nproc_per_node == "auto" and device == "cuda":
        gpus = target_machine(spec, machine_of(detected if detected is not None else detect_gpu()),
                              gpu.name if gpu else None)
    nproc = ranks_per_node(spec, device, gpus)
    if nproc < 1:
        raise UserError("invalid spec", [Problem("hardware.nproc_per_node", f"must be at least 1, got {nproc}",
                                                 "use 1 or more")])
    host = None if device != "cuda" else host_capacity(hw.host_memory_gib, True if detected is not None else None)
    return Hardware(device, gpu, nproc, nproc * hw.nodes, host, tuple(reasons), detected is not None)


def model_config(spec: Any, config_json: dict[str, Any] | None) -> Any:
    """The model's transformers config, as the ranks load it (from model.path, else built from config.json);
    config.json itself where transformers cannot build it here (remote code, an unknown model type)."""
    try:
        if spec.model.path:
            from runner.decide.loader import load_config

            return load_config(spec)
        from runner.imports import from_transformers

        cfg = dict(config_json or {})
        return from_transformers("AutoConfig").for_model(cfg.pop("model_type"), **cfg)
    except Exception:  # noqa: BLE001 - a config transformers cannot build here: the rules read config.json
        return config_json or None


def decide_run(spec: Any, loaded: Any = None, hardware: Hardware | None = None, probe: bool = False) -> Decisions:
    """The decisions of a run of `spec` (levers resolved). With `probe` (a launch, on its node): the attention
    kernels installed here and the model class's declared support, read through transformers. Without (a plan,
    which imports neither torch nor transformers): the kernels a plan assumes and the family's paths from
    config.json (runner.facts.families lists what each class supports; tests/unit/test_decide.py checks both
    agree)."""
    from runner.decide.rules import FA4_KERNEL, Kernels, fa4_installed
    from runner.facts.catalog import load_arch

    hardware = hardware or resolve_hardware(spec)
    loaded = loaded or load_arch(spec)
    device = hardware.device
    if not probe:
        vk = spec.model.varlen_kernel
        kernels = Kernels.assumed(device, vk == FA4_KERNEL or (vk == "auto" and fa4_installed()))
        return decide(spec, loaded.arch, hardware.machine(kernels), loaded.config or None)
    from runner.decide.loader import model_class
    from runner.decide.support import available_kernels, concrete_model_class, supported_attention

    config = model_config(spec, loaded.config)
    supported = None
    if config is not None and not isinstance(config, dict):
        supported = supported_attention(concrete_model_class(model_class(spec, config), config), spec.train.packing)
    return decide(spec, loaded.arch, hardware.machine(available_kernels(device)), config, supported)
