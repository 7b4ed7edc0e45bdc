"""Time: hardware FLOPs per step and the calibrated rate (HFU) they run at."""

from __future__ import annotations

from runner.estimate.constants import CALIBRATION
from runner.estimate.plan import Plan, offloads_activations, recomputed_layers
from runner.flops import hardware_flops


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
    """(hardware FLOPs of one optimizer step over all ranks, the attention part of it): runner/flops.py."""
    spec = plan.spec
    return hardware_flops(plan.arch, tokens=tokens_per_step, seq_len=spec.train.seq_len, doc_len=doc_len,
                          lora=spec.method.kind == "lora", recomputed=recomputed_layers(spec, plan.arch.layers),
                          not_recomputed_params=recompute_skipped_params(plan), attn=plan.attn,
                          packing=spec.train.packing)


def calibration(plan: Plan) -> tuple[float, str]:
    name = plan.gpu.name if plan.gpu else "cpu"
    engine, compiled = plan.spec.engine, plan.spec.train.compile
    for key in ((engine, name, compiled), (engine, name, not compiled), (engine, "H200", compiled),
                (engine, "H200", not compiled)):
        if key in CALIBRATION:
            rate, source = CALIBRATION[key]
            return rate, source if key[1] == name else f"the H200 figure, for lack of a measurement here ({source})"
    raise AssertionError(f"no calibration for the {engine} engine")  # every engine has an H200 entry

