"""QLoRA's memory: which weights NF4 holds, what one gathered layer and one dequantized weight take (bytes)."""

from __future__ import annotations

from runner.facts.catalog import Arch
from runner.plan.constants import NF4_BYTES_PER_PARAM, NF4_SCALE_BYTES_PER_PARAM


def quantized_params(arch: Arch) -> int:
    """Weights QLoRA stores in NF4: every Linear of the decoder layers and the vision tower (runner.train.qlora
    quantizes each frozen Linear but the output head). 3-D expert stacks stay: torchao's NF4 is 2-D only."""
    layers = sum(x.in_features * x.out_features for i in range(arch.layers) for x in arch.linears(i))
    return layers + sum(x.in_features * x.out_features for x in arch.vision_linears)


def dequant_bytes(arch: Arch, compute_bytes: int) -> float:
    """The compute-dtype copy of one Linear weight while its matmul runs (torchao's linear dequantizes in forward
    and again in backward, one weight at a time): the largest one's."""
    largest = max((x.in_features * x.out_features for i in range(arch.layers) for x in arch.linears(i)), default=0)
    return largest * compute_bytes


def gathered_layer_bytes(arch: Arch, compute_bytes: int) -> float:
    """One decoder layer as FSDP2 gathers it under QLoRA: its Linear weights as NF4 codes and scales, the rest (norms,
    expert stacks) in the compute dtype."""
    big = max(range(arch.layers), key=arch.layer_params)
    linear = sum(x.in_features * x.out_features for x in arch.linears(big))
    return linear * (NF4_BYTES_PER_PARAM + NF4_SCALE_BYTES_PER_PARAM) + (arch.max_layer_params - linear) * compute_bytes
