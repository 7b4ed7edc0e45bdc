"""merge_lora over state dicts computes what peft's merge_and_unload computes, patterns and rsLoRA included."""

from __future__ import annotations

import pytest
import torch

from runner.spec import resolve_embedded
from runner.train.merge import MergeError, merge_lora, split_peft_state


def _tiny(dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(resolve_embedded("embedded:model")))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


@pytest.mark.parametrize("dtype, rslora", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)])
def test_merge_equals_peft_merge_and_unload(dtype, rslora):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False,
                        rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 3}, use_rslora=rslora)
    peft_model = get_peft_model(_tiny(dtype), config)
    base, adapter = split_peft_state({k: v.clone() for k, v in peft_model.state_dict().items()})
    assert adapter and all(".lora_" in k for k in adapter) and not any("base_layer" in k for k in base)
    ours = merge_lora(base, adapter, peft_model.peft_config["default"].to_dict())
    theirs = peft_model.merge_and_unload().state_dict()
    assert set(ours) == set(theirs)
    changed = [k for k in theirs if not torch.equal(base[k], theirs[k])]
    assert len(changed) == 3 * len(peft_model.base_model.model.model.layers)
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), k


def test_merge_refuses_an_adapter_for_another_base():
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(_tiny(torch.float32), LoraConfig(r=2, target_modules=["q_proj"]))
    base, adapter = split_peft_state(peft_model.state_dict())
    key = next(k for k in base if k.endswith("q_proj.weight"))
    with pytest.raises(MergeError, match="another base"):
        merge_lora({**base, key: base[key][:-1]}, adapter, peft_model.peft_config["default"].to_dict())
    with pytest.raises(MergeError, match="not a LoRA"):
        merge_lora(base, {**adapter, "base_model.model.lm_head.modules_to_save.weight": base[key]},
                   peft_model.peft_config["default"].to_dict())
