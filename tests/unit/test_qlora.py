"""QLoRA: torchao's NF4 base under peft's adapters (exact against torchao's own dequantize), what the record keeps,
the estimate's parts for a 70B layout on one H100, the packing check through NF4, and the trl engine's refusal on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from runner.cli.main import main
from runner.plan import estimate
from runner.plan.constants import GIB, NF4_BYTES_PER_PARAM, NF4_SCALE_BYTES_PER_PARAM
from runner.plan.quant import quantized_params
from runner.spec import load_spec
from runner.train.lora import apply_lora
from runner.train.qlora import (
    NF4_BLOCK, base_state_dict, dequantized_state_dict, is_nf4, nf4_library, quantize_base, scaler_block_size,
    torchao_version)

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "recipes" / "embedded" / "model"
# Llama-3.1-70B's published sizes (its config.json on the hub).
LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
             "intermediate_size": 28672, "vocab_size": 128256, "head_dim": 128, "tie_word_embeddings": False,
             "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001}


def qlora_model(shards: int = 1):
    spec = load_spec("tiny-cpu", ["method.kind=qlora"])
    torch.manual_seed(0)
    model = apply_lora(AutoModelForCausalLM.from_pretrained(str(QWEN), dtype=torch.float32), spec)
    info = quantize_base(model, shards, "float32")
    return model, info


def test_a_quantized_layer_computes_with_torchaos_own_dequantized_weight():
    model, _ = qlora_model()
    layer = model.base_model.model.model.layers[0].mlp.down_proj  # peft's wrapper: base_layer holds the NF4 weight
    weight = layer.base_layer.weight
    assert is_nf4(weight) and not weight.requires_grad
    x = torch.randn(3, 7, weight.shape[1], requires_grad=True)
    out = layer.base_layer(x)
    reference = nn.functional.linear(x, weight.get_original_weight().to(x.dtype))
    assert torch.equal(out, reference)
    out.sum().backward()
    grad_x = x.grad.clone()
    x.grad = None
    reference.sum().backward()
    assert torch.equal(grad_x, x.grad)
    # and the stored form is NF4 as QLoRA defines it: 4-bit codes in blocks of 64, int8 scales per block
    assert weight.block_size == NF4_BLOCK and weight.quantized_data.dtype == torch.uint8
    assert weight.quantized_data.numel() == weight.numel() // 2 and weight.quantized_scalers.dtype == torch.int8
    assert weight.quantized_scalers.numel() == weight.numel() // NF4_BLOCK


def test_every_frozen_linear_but_the_head_is_nf4_and_the_record_says_so():
    model, info = qlora_model(shards=2)
    nf4 = {n for n, p in model.named_parameters() if is_nf4(p)}
    # 7 projections in each of 4 layers, under peft's base_layer; adapters, norms and the (tied) embedding are not
    assert len(nf4) == 28 and all(n.endswith("base_layer.weight") for n in nf4)
    assert all(not is_nf4(p) for n, p in model.named_parameters() if p.requires_grad)
    assert info["type"] == "nf4" and info["block_size"] == 64 and info["double_quantized"]
    assert info["library"] == f"torchao {torchao_version()}" and torchao_version()
    assert info["quantized_layers"] == 28 and info["not_quantized"] == []
    assert info["quantized_params"] == sum(p.numel() for n, p in model.named_parameters() if n in nf4)
    json.dumps(info)  # it goes into the record as it is


def test_scaler_blocks_fit_the_shards_or_the_weight_stays():
    assert scaler_block_size((8192, 8192), 8) == 256
    assert scaler_block_size((64, 64), 2) == 32  # 64 blocks over 2 shards: 32 each, one scale block each
    assert scaler_block_size((63, 64), 2) is None  # rows not divisible by the shards: FSDP2 would pad
    assert scaler_block_size((2, 16), 1) is None  # 32 weights: not one whole NF4 block
    assert scaler_block_size((4, 4, 64), 1) is None  # 3-D


def test_moe_expert_stacks_stay_and_are_named():
    config = Qwen3MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    for p in model.parameters():
        p.requires_grad_(False)
    info = quantize_base(model, 1, "float32")
    stacks = [p for p in model.parameters() if p.dim() == 3]
    assert stacks and not any(is_nf4(p) for p in stacks)
    assert any("3-D expert stack" in k for k in info["not_quantized"])
    assert info["frozen_params_not_quantized"] >= sum(p.numel() for p in stacks)


def test_the_dequantized_base_is_bf16_and_what_the_forward_uses():
    model, _ = qlora_model()
    lib = nf4_library()
    base = base_state_dict(model)
    assert base and all(t.dtype == torch.bfloat16 for t in base.values())
    assert not any(".lora_" in k for k in base)
    key = "base_model.model.model.layers.1.self_attn.q_proj.base_layer.weight"
    weight = dict(model.named_parameters())[key]
    assert isinstance(weight, lib.NF4Tensor) and torch.equal(base[key], weight.get_original_weight())
    assert dequantized_state_dict(model.state_dict()).keys() == base.keys()


def test_the_packing_check_runs_through_nf4():
    from transformers import AutoConfig

    from runner.gate.packcheck import EXACT, Setup, run_check, setup_for

    spec = load_spec("tiny-cpu", ["method.kind=qlora"])
    config = AutoConfig.from_pretrained(str(QWEN))
    setup = setup_for(spec, config, "cpu")
    assert setup.quantized
    verdict = run_check(config, setup)
    assert verdict.status == EXACT and "NF4" in verdict.shrunk, verdict
    assert setup_for(load_spec("tiny-cpu", ["method.kind=lora"]), config, "cpu") == Setup(**{**setup.__dict__,
                                                                                               "quantized": False})


@pytest.fixture(scope="module")
def llama_70b(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("llama-70b")
    (d / "config.json").write_text(json.dumps(LLAMA_70B))
    return d


def _one_h100(path: Path, kind: str):
    return estimate(load_spec("tiny-cpu", [f"model.path={path}", "model.id=meta-llama/Llama-3.1-70B",
                                           f"method.kind={kind}", "hardware.device=cuda", "hardware.gpu=H100-80GB",
                                           "hardware.nproc_per_node=1", "train.seq_len=8192"]))


def test_llama_70b_qlora_fits_one_h100_at_8k_and_lora_does_not(llama_70b):
    qlora, lora = _one_h100(llama_70b, "qlora"), _one_h100(llama_70b, "lora")
    assert qlora.fits and not lora.fits, (qlora.per_gpu_gib, lora.per_gpu_gib)
    b = qlora.breakdown
    n = quantized_params(qlora_arch(llama_70b))
    assert b["quantized"] == pytest.approx(n * NF4_BYTES_PER_PARAM / GIB, abs=0.006)  # the breakdown rounds to 0.01 GiB
    assert b["quant_scales"] == pytest.approx(n * NF4_SCALE_BYTES_PER_PARAM / GIB, abs=0.006)  # the breakdown rounds to 0.01 GiB
    assert b["dequant"] == pytest.approx(8192 * 28672 * 2 / GIB, abs=0.006)  # the breakdown rounds to 0.01 GiB  # the MLP's largest weight, in bf16
    assert b["lora"] == lora.breakdown["lora"] > 0 and b["optimizer"] == lora.breakdown["optimizer"] > 0  # adapters
    # what stays unquantized: the embedding and lm_head (bf16) and the norms
    assert b["params"] == pytest.approx((2 * 128256 * 8192 + 8192 * 161) * 2 / GIB, abs=0.006)  # the breakdown rounds to 0.01 GiB
    assert "quantized" not in lora.breakdown


def qlora_arch(path: Path):
    from runner.facts.catalog import parse_arch

    return parse_arch(json.loads((path / "config.json").read_text()))


def test_estimate_json_has_the_qlora_parts(llama_70b, capsys):
    code = main(["estimate", "tiny-cpu", "--json", "--set", f"model.path={llama_70b}", "--set", "method.kind=qlora",
                 "--set", "hardware.device=cuda", "--set", "hardware.gpu=H100-80GB", "--set",
                 "hardware.nproc_per_node=1", "--set", "train.seq_len=8192"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["fits"]
    assert {"quantized", "quant_scales", "dequant", "lora", "optimizer"} <= set(out["breakdown"])


def test_trl_qlora_on_cpu_is_refused_before_launch_with_the_fix():
    from transformers import AutoConfig

    from runner.train.trl_engine import trl_problems

    spec = load_spec("tiny-cpu", ["method.kind=qlora", "engine=trl"])
    problems = trl_problems(spec, AutoConfig.from_pretrained(str(QWEN)), "cpu", lora=False)
    assert len(problems) == 1 and problems[0].field == "method.kind"
    assert "CUDA GPU" in problems[0].message and "engine=native" in problems[0].fix


def test_the_method_comparison_and_the_suggestion_name_qlora_for_70b_on_one_h100(llama_70b):
    from runner.plan import method_comparison

    spec = load_spec("tiny-cpu", [f"model.path={llama_70b}", "method.kind=lora", "hardware.device=cuda",
                                  "hardware.gpu=H100-80GB", "hardware.nproc_per_node=1", "train.seq_len=8192"])
    rows = {r["method"]: r for r in method_comparison(spec)}
    assert list(rows) == ["full", "lora", "qlora"]
    assert not rows["full"]["fits"] and not rows["lora"]["fits"] and rows["qlora"]["fits"]
    assert rows["full"]["per_gpu_gib"] > rows["lora"]["per_gpu_gib"] > rows["qlora"]["per_gpu_gib"]
    assert estimate(spec).suggestion.startswith("QLoRA (a 4-bit base) (--set method.kind=qlora): predicted")
