"""One rule resolves a spec's `auto` hardware for the machine its run will see: the launcher (`resolve`), the
estimator (`make_plan`), the faces (`runner.api.resolve_for`) and the wizard's sweep give the same ranks per node."""

from __future__ import annotations

import pytest

from runner.machine import Machine, target_machine
from runner.plan.choices import make_plan
from runner.plan.sweep import sweep
from runner.spec import load_spec, resolve
from runner.api import resolve_for, sweep_target

H200 = {"name": "NVIDIA H200", "mem_total_gib": 140.4}
H100 = {"name": "NVIDIA H100 80GB HBM3", "mem_total_gib": 79.6}
MACHINES = {"none": [], "4xH200": [H200] * 4, "2xH100": [H100] * 2}
SPECS = {
    "cpu": ["hardware.device=cpu"],
    "cuda-auto": ["hardware.device=cuda", "hardware.gpu=auto"],
    "cuda-H200": ["hardware.device=cuda", "hardware.gpu=H200"],
    "auto-H200": ["hardware.device=auto", "hardware.gpu=H200"],
    "cuda-H200-x2": ["hardware.device=cuda", "hardware.gpu=H200", "hardware.nproc_per_node=2"],
}


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("case", SPECS)
def test_launch_plan_wizard_and_sweep_agree_on_ranks(machine, case, monkeypatch):
    gpus = [dict(g, index=i) for i, g in enumerate(MACHINES[machine])]
    monkeypatch.setattr("runner.facts.nvml.detect_gpus", lambda: gpus)
    spec = load_spec("tiny-cpu", ["hardware.nproc_per_node=auto", *SPECS[case]])
    if case == "cuda-auto" and not gpus:
        return  # nothing to plan for: the estimator asks for a GPU type (test_estimate)
    wizard, declared = resolve_for(spec, gpus)
    plan = make_plan(spec)
    target = sweep_target(spec, wizard)  # the wizard's what-if: a CPU run is swept on as many GPUs
    assert target.hardware.device == "cuda" and target.hardware.nproc_per_node == wizard.hardware.nproc_per_node
    rows = sweep(target, [("train.seq_len", [256, 512]), ("hardware.gpu", ["H200", "B300"])])
    assert plan.nproc == wizard.hardware.nproc_per_node, (plan.nproc, wizard.hardware)
    assert {r["world_size"] for r in rows} == {plan.nproc * spec.hardware.nodes}
    if not declared:  # a run that can start here: the launcher resolves it the same way
        launch = resolve(spec, machine=Machine(len(gpus)))
        assert launch.hardware.nproc_per_node == plan.nproc
        assert launch.hardware.device == plan.device


def test_the_rules_themselves():
    cuda = load_spec("tiny-cpu", ["hardware.device=cuda", "hardware.nproc_per_node=auto", "hardware.gpu=H200"])
    assert resolve(cuda, machine=Machine(4, "H200")).hardware.nproc_per_node == 4
    # GPUs of another type here: the plan is for the named type's usual node, not for this machine's count.
    assert target_machine(cuda, Machine(2, "H100-80GB")) == Machine(8, "H200", declared=True)
    assert target_machine(cuda, Machine(0)) == Machine(8, "H200", declared=True)
    cpu = load_spec("tiny-cpu", ["hardware.nproc_per_node=auto"])
    assert resolve(cpu, machine=Machine(4)).hardware.nproc_per_node == 2
    # The what-if of a CPU run: its GPU twin takes the GPU defaults (bf16 weights, bf16_stochastic for native).
    twin = sweep_target(cpu, resolve(cpu, machine=Machine(0)))
    assert (twin.model.dtype, twin.train.optimizer_precision) == ("bfloat16", "bf16_stochastic")
