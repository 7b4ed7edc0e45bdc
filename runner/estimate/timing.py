"""Time: FLOPs per step and the calibrated rate they run at."""

from __future__ import annotations

from runner.catalog import LAYER_LINEAR, LAYER_SLIDING
from runner.estimate.constants import CALIBRATION, GDN_CHUNK
from runner.estimate.plan import Plan, offloads_activations, recomputed_layers


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

