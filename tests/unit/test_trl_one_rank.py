"""The TRL engine's one-process rule: the plain module, fp32 trainable weights under bf16 autocast."""

import pytest
import torch

from runner.decide.rules import fsdp_wrapped
from runner.train.trl_engine import fp32_master_weights


@pytest.mark.parametrize("world,device,asked,expected", [
    (1, "cuda", False, False),  # one GPU process trains the plain module
    (1, "cuda", True, True),  # ... unless train.fsdp_one_rank
    (1, "cpu", True, False),  # accelerate refuses FSDP for one CPU process
    (2, "cpu", False, True),
    (8, "cuda", False, True),
])
def test_fsdp_only_with_more_than_one_rank_or_when_asked(world, device, asked, expected):
    assert fsdp_wrapped("trl", world, device, asked) is expected


def test_trainable_weights_become_fp32_and_frozen_ones_stay_as_loaded():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(torch.bfloat16)
    model[0].requires_grad_(False)
    before = model[1].weight.detach().clone()
    assert fp32_master_weights(model) == 3 * 2 + 2
    assert {p.dtype for p in model[0].parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model[1].parameters()} == {torch.float32}
    assert torch.equal(model[1].weight.to(torch.bfloat16), before)  # exact: bf16 widens to fp32 without rounding
    assert fp32_master_weights(model) == 0  # nothing left to cast
