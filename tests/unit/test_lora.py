"""LoRA through peft: adapter counts from the config by hand, expert tensors, dtype, and the checks on bad targets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssConfig

from runner.errors import SpecError
from runner.spec import load_spec
from runner.train.lora import (
    apply_lora,
    build_lora_config,
    linear_module_names,
    lora_problems,
    lora_problems_from_config,
    meta_model,
    tensor_parameter_names,
    trainable_params,
)

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "recipes" / "embedded" / "tokenizer"
QWEN = ROOT / "recipes" / "embedded" / "model"
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# hidden 64, 2 layers, 4 experts top-2, vocab 512: the recipe's tiny GPT-OSS, drawn here from a seed.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=128,
            pad_token_id=0, eos_token_id=2, bos_token_id=None, tie_word_embeddings=False)


def lora_spec(*overrides: str, experts: bool = True):
    sets = ["method.kind=lora", "method.lora.r=16", "method.lora.alpha=32", "method.lora.target_modules=all-linear"]
    if experts:
        sets += [f"method.lora.target_parameters=[{', '.join(EXPERTS)}]",
                 "method.lora.rank_pattern={mlp.experts.gate_up_proj: 8, mlp.experts.down_proj: 8}"]
    return load_spec("tiny-cpu", [*sets, *overrides])


def tiny_gpt_oss(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(GptOssConfig(**TINY), dtype=dtype, attn_implementation="eager")


def expected_gpt_oss_lora(cfg: dict, r: int, r_experts: int | None) -> int:
    """LoRA parameters by hand. A Linear(in, out) gets A (r×in) and B (out×r): r·(in+out). peft's ParamWrapper
    on an expert stack of shape (E, d1, d2) makes A = Linear(d1, r·E) and B = Linear(r·E, d2): r·E·(d1+d2). GPT-OSS
    stores gate_up_proj as (E, hidden, 2·I) and down_proj as (E, I, hidden). all-linear skips the LM head, and the
    router is a bare Parameter, not a Linear."""
    h = cfg["hidden_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    attention = r * ((h + q) + (h + kv) + (h + kv) + (q + h))
    per_layer = attention
    if r_experts is not None:
        e, i = cfg["num_local_experts"], cfg["intermediate_size"]
        per_layer += r_experts * e * (h + 2 * i) + r_experts * e * (i + h)
    return cfg["num_hidden_layers"] * per_layer


# ---------------------------------------------------------------------------------------------
# Config and counts


def test_lora_config_carries_every_setting():
    cfg = build_lora_config(lora_spec("method.lora.dropout=0"))
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.bias) == (16, 32, 0.0, "none")
    assert cfg.target_modules == "all-linear" and sorted(cfg.target_parameters) == sorted(EXPERTS)
    assert cfg.rank_pattern == {"mlp.experts.gate_up_proj": 8, "mlp.experts.down_proj": 8}
    assert str(cfg.task_type.value if hasattr(cfg.task_type, "value") else cfg.task_type) == "CAUSAL_LM"
    listed = build_lora_config(lora_spec("method.lora.target_modules=[q_proj, v_proj]", experts=False))
    assert set(listed.target_modules) == {"q_proj", "v_proj"} and not listed.target_parameters


def test_gpt_oss_attention_and_expert_adapters_match_the_count_by_hand():
    model = apply_lora(tiny_gpt_oss(), lora_spec())
    assert trainable_params(model) == expected_gpt_oss_lora(TINY, r=16, r_experts=8) == 14_336 + 17_408
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n for n in names)
    # Each expert stack has its own adapter (nested ParamWrappers), at rank 8 through rank_pattern: A is (r·E, in).
    shapes = {tuple(p.shape) for n, p in model.named_parameters() if "experts" in n and "lora_A" in n}
    assert shapes == {(8 * 4, 64), (8 * 4, 48)}
    assert not any("router" in n or "lm_head" in n or "embed" in n for n in names)


def test_attention_only_and_a_full_qwen3_stack():
    gpt_oss = apply_lora(tiny_gpt_oss(), lora_spec(experts=False))
    assert trainable_params(gpt_oss) == expected_gpt_oss_lora(TINY, r=16, r_experts=None)
    qwen = AutoModelForCausalLM.from_pretrained(QWEN)
    c = qwen.config
    h, q, kv, i = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, \
        c.intermediate_size
    per_layer = 16 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))  # q k v o, gate up, down
    assert trainable_params(apply_lora(qwen, lora_spec(experts=False))) == c.num_hidden_layers * per_layer


def test_adapters_take_the_base_dtype_so_fsdp_sees_one_dtype():
    model = apply_lora(tiny_gpt_oss(dtype=torch.bfloat16), lora_spec())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_adapters_start_as_the_identity():
    base = tiny_gpt_oss(seed=3)
    ids = torch.randint(3, 512, (1, 24))
    with torch.no_grad():
        before = base(input_ids=ids).logits.clone()
        after = apply_lora(base, lora_spec())(input_ids=ids).logits
    assert torch.equal(before, after)  # B starts at zero: the adapted model is the base model until it trains


# ---------------------------------------------------------------------------------------------
# Problems, found on the meta device before any weight is read


def _fields(problems):
    return [p.field for p in problems]


def test_good_settings_have_no_problems_on_the_meta_device():
    assert lora_problems_from_config(GptOssConfig(**TINY), lora_spec()) == []
    assert lora_problems_from_config(QWEN, lora_spec("method.lora.target_modules=[q_proj, down_proj]",
                                                     experts=False)) == []
    model = meta_model(GptOssConfig(**TINY))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert sorted({n.split("layers.0.")[-1] for n in linear_module_names(model) if "layers.0." in n}) == \
        ["self_attn.k_proj", "self_attn.o_proj", "self_attn.q_proj", "self_attn.v_proj"]
    assert sorted({n.split("layers.0.")[-1] for n in tensor_parameter_names(model) if "layers.0." in n}) == \
        ["mlp.experts.down_proj", "mlp.experts.gate_up_proj", "mlp.router.weight"]


def test_a_target_module_that_matches_nothing_names_the_modules_that_exist():
    spec = lora_spec("method.lora.target_modules=[q_proj, gate_proj]")
    problems = lora_problems_from_config(GptOssConfig(**TINY), spec)
    assert _fields(problems) == ["method.lora.target_modules"]
    assert "'gate_proj' matches no module" in problems[0].message
    assert "self_attn.q_proj" in problems[0].fix and "self_attn.o_proj" in problems[0].fix


def test_targeting_the_expert_module_points_at_target_parameters():
    problems = lora_problems_from_config(GptOssConfig(**TINY), lora_spec("method.lora.target_modules=[mlp.experts]",
                                                                         experts=False))
    assert _fields(problems) == ["method.lora.target_modules"]
    assert "GptOssExperts" in problems[0].message and "cannot wrap" in problems[0].message
    assert "method.lora.target_parameters: mlp.experts.down_proj, mlp.experts.gate_up_proj" in problems[0].fix


def test_a_target_parameter_that_does_not_exist_lists_the_tensors_that_do():
    spec = lora_spec("method.lora.target_parameters=[mlp.experts.up_proj]",
                     "method.lora.rank_pattern={mlp.experts.up_proj: 8}")
    problems = lora_problems_from_config(GptOssConfig(**TINY), spec)
    assert _fields(problems) == ["method.lora.target_parameters", "method.lora.rank_pattern"]
    assert "'mlp.experts.up_proj' names no 2-D/3-D weight tensor" in problems[0].message
    assert "mlp.experts.gate_up_proj" in problems[0].fix and "mlp.experts.down_proj" in problems[0].fix
    # Nothing is adapted under that name, so its rank override would be silently ignored: also reported.
    assert "'mlp.experts.up_proj' matches no adapted module or tensor" in problems[1].message


def test_dense_models_have_no_expert_tensors_to_adapt():
    problems = lora_problems_from_config(QWEN, lora_spec())
    assert _fields(problems) == ["method.lora.target_parameters"] * 2 + ["method.lora.rank_pattern"] * 2
    assert problems[0].fix == "tensors that can be adapted here: none"


def test_dropout_with_expert_tensors_and_a_bad_regex_are_reported():
    problems = lora_problems_from_config(GptOssConfig(**TINY), lora_spec("method.lora.dropout=0.1"))
    assert _fields(problems) == ["method.lora.dropout"] and "must be 0" in problems[0].message
    problems = lora_problems_from_config(GptOssConfig(**TINY), lora_spec("method.lora.target_modules='(q_proj'",
                                                                         experts=False))
    assert _fields(problems) == ["method.lora.target_modules"] and "not a valid regex" in problems[0].message


def test_apply_lora_refuses_bad_settings_with_every_problem():
    with pytest.raises(SpecError) as err:
        apply_lora(tiny_gpt_oss(), lora_spec("method.lora.target_modules=[nope]",
                                             "method.lora.target_parameters=[mlp.experts.nope]"))
    assert err.value.exit_code == 2
    assert _fields(err.value.problems)[:2] == ["method.lora.target_modules", "method.lora.target_parameters"]


def test_full_fine_tunes_have_no_lora_problems():
    assert lora_problems_from_config(QWEN, load_spec("tiny-cpu", ["method.lora.target_modules=[nope]"])) == []


def test_problems_from_a_model_folder_need_no_weights(tmp_path: Path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    GptOssConfig(**TINY).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(TOKENIZER / name, folder / name)
    assert lora_problems_from_config(folder, lora_spec()) == []
    assert _fields(lora_problems_from_config(folder, lora_spec("method.lora.target_modules=[gate_proj]"))) == \
        ["method.lora.target_modules"]


def test_lora_problems_on_a_built_model_match_the_meta_check():
    spec = lora_spec("method.lora.target_modules=[q_proj, gate_proj]")
    assert lora_problems(tiny_gpt_oss(), spec) == lora_problems_from_config(GptOssConfig(**TINY), spec)


# ---------------------------------------------------------------------------------------------
# 'all-linear' on families the registry does not list: no routers, no vision tower, experts reported


def _unlisted(model_type: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from runner.gate.shrink import shrunk_config

    config = shrunk_config(AutoConfig.for_model(model_type), 512, 80)
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config)


def test_all_linear_leaves_routers_and_vision_towers_out_and_reports_the_experts():
    from runner.train.lora import all_linear_modules, lora_notes

    spec = load_spec({"method": {"kind": "lora"}})
    llama4 = _unlisted("llama4_text")
    names, _ = all_linear_modules(llama4)
    assert not [n for n in names if n.endswith("router")]  # its forward returns a tuple LoRA cannot pass on
    for kept in ("self_attn.q_proj", "feed_forward.shared_expert.gate_proj", "feed_forward.up_proj"):
        assert any(n.endswith(kept) for n in names), kept  # dense layers and shared experts are adapted
    notes = lora_notes(llama4, spec)
    assert any("routers not adapted" in n for n in notes) and any("expert weights not adapted" in n for n in notes)
    named = load_spec({"method": {"kind": "lora", "lora": {"target_modules": ["router"]}}})
    assert lora_problems(llama4, named) == []  # a router named explicitly is adapted

    vlm = _unlisted("qwen2_5_vl")
    names, notes = all_linear_modules(vlm)
    assert names and not [n for n in names if "visual" in n.split(".")]
    assert any("vision tower" in n for n in notes)
    granite = _unlisted("granitemoe")
    assert any("expert weights not adapted" in n for n in lora_notes(granite, spec))
    dense = _unlisted("gpt2")
    assert lora_notes(dense, spec) == [] and len(all_linear_modules(dense)[0]) == 8  # c_attn, c_proj, c_fc, c_proj
