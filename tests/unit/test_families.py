"""The family matrix in one process: the registry against transformers' own classes, the engines' decisions per
family, and, for every family, a LoRA-wrapped model whose packed block gives the loss and adapter gradients of its
documents run one by one, through the native engine's loss and through TRL's padding-free batch, and then trains."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from runner.decide import rules as decisions
from runner.facts import families
from runner.decide.rules import Kernels, attention_refusal, choose_attention, choose_loss
from runner.facts.families import MATRIX, family_of, lora_targets
from runner.spec import load_spec
from runner.train.attention import (
    concrete_model_class,
    keep_documents_apart,
    recurrent_layer_types,
    supported_attention,
)
from runner.train.blocks import PAD_SEGMENT
from runner.train.data import IGNORE, collate, make_block
from runner.train.lora import apply_lora, lora_problems, meta_model
from runner.train.loss import LOSS_FUNCTIONS, full_loss_sum
from runner.train.trl_data import COUNTING_KEYS
from runner.train.trl_engine import CountingCollator, block_row
from tests.conftest import run_cli
from tests.families import FAMILIES, family_config, write_model_folder

# float32 on CPU: packed and one by one differ only in summation order (measured ≤ 3e-6 on gradients); a document
# that sees another moves them by more than 1e-3.
LOSS_TOL = 1e-6
GRAD_TOL = 1e-5
DOC_LENGTHS = (37, 80, 11, 23)
# 151 real tokens, then padding long enough to be cut into three segments (runner.train.blocks.PAD_SEGMENT)
SEQ_LEN = 151 + 2 * PAD_SEGMENT + 9


def test_the_matrix_is_the_registry_s():
    assert FAMILIES == MATRIX and len(MATRIX) >= 14


@pytest.mark.parametrize("name", MATRIX)
def test_registry_names_what_transformers_builds(name):
    """Decoder layer class, LoRA projection names and expert tensors exist in the family's real module tree."""
    config = family_config(name)
    fam = family_of(config)
    assert fam.known and fam.model_type == config.model_type
    model = meta_model(config)
    assert fam.decoder_layer in {type(m).__name__ for m in model.modules()}
    modules = [n for n, _ in model.named_modules()]
    for target in lora_targets(config, "all"):
        assert any(n.endswith("." + target) for n in modules), (name, target)
    tensors = [n for n, _ in model.named_parameters()]
    for target in fam.expert_tensors:
        assert any(n.endswith("." + target) for n in tensors), (name, target)
    assert bool(fam.expert_tensors) == fam.moe
    assert bool(recurrent_layer_types(config)) == (fam.recurrent is not None)


def test_registry_paths_are_what_each_transformers_class_declares():
    """The estimator plans from the registry alone (no model class): its paths must be the classes' own."""
    from transformers import AutoModelForImageTextToText

    for mt, fam in families.FAMILIES.items():
        if fam.recurrent == families.STATE_SPACE:
            continue
        config = AutoConfig.for_model(mt)
        cls = concrete_model_class(AutoModelForCausalLM, config) or \
            concrete_model_class(AutoModelForImageTextToText, config)
        if cls is None:  # a text config served through its VLM's class
            continue
        supported = supported_attention(cls)
        assert set(fam.attention_paths) <= supported, (mt, fam.attention_paths, supported)
        if not fam.attention_sinks:  # sinks rule out what the class would otherwise run
            assert {"flash_attention_2", "flex_attention", "sdpa"} & supported <= set(fam.attention_paths), mt


@pytest.mark.parametrize("name", MATRIX)
def test_a_plan_from_the_config_alone_picks_what_the_engines_pick(name):
    config = family_config(name)
    supported = supported_attention(concrete_model_class(AutoModelForCausalLM, config))
    for device, tokens in (("cuda", 8192), ("cuda", 32768), ("cpu", 256)):
        kernels = Kernels.assumed(device)
        planned = choose_attention("auto", device, tokens, None, config.to_dict(), kernels)
        assert planned == choose_attention("auto", device, tokens, supported, config, kernels), (name, device)


def test_unknown_model_types_get_traits_from_their_config():
    hybrid = {"model_type": "brand_new", "layer_types": ["full_attention", "mamba"], "hidden_size": 8}
    fam = family_of(hybrid)
    assert not fam.known and fam.recurrent == families.STATE_SPACE and fam.attention_paths == ()
    assert decisions.packed_attention_paths(hybrid, "cuda") == []
    why, fix = attention_refusal("sdpa", "cuda", hybrid)
    assert "train.packing=false" in fix
    assert decisions.packed_attention_paths(hybrid, "cuda", packed=False)  # one document per block is fine
    capped = {"model_type": "brand_new", "attn_logit_softcapping": 30.0, "sliding_window": 64}
    fam = family_of(capped)
    assert fam.sliding_window and fam.logit_softcapping and set(fam.attention_paths) == {"flash_attention_2",
                                                                                        "flex_attention", "eager"}
    latent = family_of({"model_type": "brand_new", "kv_lora_rank": 16, "num_local_experts": 4})
    assert latent.mla and latent.moe


GPU = Kernels(varlen=True, flash_attn=False, flex=True)
# (family, tokens per forward) → what auto picks on one GPU with torch's varlen and flex kernels, and on CPU.
EXPECTED = {
    ("llama", 8192): "flex_attention", ("llama", 32768): "varlen",
    ("gemma2", 32768): "flex_attention",  # soft-capped scores: varlen and sdpa cannot cap them
    ("gpt_oss", 8192): "flex_attention", ("gpt_oss", 32768): "flex_attention",  # attention sinks
    ("qwen3_next", 8192): "varlen",  # no flex attention in that class
    ("deepseek_v3", 32768): "varlen", ("phi3", 8192): "flex_attention", ("phi3", 32768): "varlen",
}
CPU_EXPECTED = {"gemma2": "eager", "gpt_oss": "eager"}


@pytest.mark.parametrize("name", MATRIX)
def test_attention_choice_keeps_documents_apart_on_gpu_and_cpu(name):
    config = family_config(name)
    supported = supported_attention(concrete_model_class(AutoModelForCausalLM, config))
    for tokens in (8192, 32768):
        pick = choose_attention("auto", "cuda", tokens, supported, config, GPU)
        assert attention_refusal(pick.impl, "cuda", config, supported, GPU) is None, (name, pick)
        if (name, tokens) in EXPECTED:
            assert pick.impl == EXPECTED[name, tokens], (name, tokens, pick)
    cpu = choose_attention("auto", "cpu", 512, supported, config, Kernels.assumed("cpu"))
    assert cpu.impl == CPU_EXPECTED.get(name, "sdpa")
    assert attention_refusal(cpu.impl, "cpu", config, supported) is None


def test_paths_that_would_drop_part_of_the_attention_are_refused():
    sinks = family_config("gpt_oss")
    assert "attention-sink" in attention_refusal("sdpa", "cuda", sinks, kernels=GPU)[0]
    assert attention_refusal("flex_attention", "cpu", sinks) is not None  # flex applies sinks on CUDA only
    capped = family_config("gemma2")
    assert "soft-caps" in attention_refusal("varlen", "cuda", capped, kernels=GPU)[0]
    # A forward that neither builds masks from position_ids nor takes the hook's masks: only cu_seqlens kernels.
    boundary_only = {"eager", "varlen", "flash_attention_2"} - {"eager"}
    assert attention_refusal("sdpa", "cpu", family_config("llama"), boundary_only) is not None
    assert choose_attention("auto", "cuda", 8192, boundary_only, family_config("llama"), GPU).impl == "varlen"


def test_fsdp_and_precision_rules_of_both_engines():
    assert decisions.fsdp_wrapped("native", 2, "cpu", False)
    assert not decisions.fsdp_wrapped("native", 1, "cuda", False, weights_bf16=True)
    assert decisions.fsdp_wrapped("native", 1, "cuda", False, weights_bf16=False)  # FSDP's mixed precision
    assert not decisions.fsdp_wrapped("trl", 1, "cpu", True)  # accelerate refuses FSDP for one CPU process
    assert decisions.precision("trl", "cuda", "bfloat16", False).describe() == \
        "bf16 autocast over fp32 trainable weights"
    assert decisions.precision("native", "cuda", "float32", True) == decisions.Precision("bfloat16", "float32",
                                                                                          False)
    assert decisions.precision("native", "cpu", "float32", True).describe() == "float32"


def test_lora_matching_is_peft_s():
    name = "model.layers.0.self_attn.q_proj"
    assert decisions.lora_module_targeted(name, ["q_proj"])
    assert decisions.lora_module_targeted(name, ["self_attn.q_proj"])
    assert not decisions.lora_module_targeted(name, ["proj"])  # a suffix at a dot boundary only
    assert decisions.lora_module_targeted(name, r".*\.q_proj")  # a string is a regex over the full name
    assert not decisions.lora_module_targeted(name, "q_proj")
    assert not decisions.lora_module_targeted("lm_head", "all-linear", is_output_head=True)
    assert decisions.lora_rank("model.layers.0.mlp.experts.down_proj", 16, {"experts.down_proj": 4, "proj": 2}) == 4
    assert decisions.lora_rank("model.layers.0.self_attn.o_proj", 16, {"experts.down_proj": 4}) == 16


# ---------------------------------------------------------------------------------------------
# Every family: packed equals one by one (both engines' inputs), LoRA trains


def _documents(vocab: int) -> list[tuple[list[int], list[bool]]]:
    g = torch.Generator().manual_seed(1)
    docs = []
    for n in DOC_LENGTHS:
        prompt = n // 3
        docs.append((torch.randint(3, vocab, (n,), generator=g).tolist(), [False] * prompt + [True] * (n - prompt)))
    return docs


def _packed_block(docs):
    ids = [t for d, _ in docs for t in d]
    mask = [m for _, ms in docs for m in ms]
    starts = [sum(len(d) for d, _ in docs[:i]) for i in range(len(docs))]
    return make_block(ids, mask, starts, SEQ_LEN, 0)


def _model(name: str) -> tuple[torch.nn.Module, str, str]:
    """The family's model as both engines prepare it on CPU: attention chosen by runner.decide.rules, documents kept
    apart (runner.train.attention.keep_documents_apart), LoRA on its projections and expert tensors."""
    config = family_config(name)
    supported = supported_attention(concrete_model_class(AutoModelForCausalLM, config))
    attn = choose_attention("auto", "cpu", SEQ_LEN, supported, config, Kernels.assumed("cpu")).impl
    torch.manual_seed(0)
    config.initializer_range = 0.2  # large random weights: a leak between documents moves the loss visibly
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    keep_documents_apart(model, True, torch.float32)
    spec = load_spec({"method": {"kind": "lora", "lora": {
        "r": 4, "alpha": 8, "target_modules": lora_targets(config, "all"),
        "target_parameters": list(family_of(config).expert_tensors)}}})
    assert lora_problems(model, spec) == []
    model = apply_lora(model, spec)
    torch.manual_seed(1)
    for n, p in model.named_parameters():  # adapters away from the identity, so their gradients all flow
        if p.requires_grad and "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    return model, attn, choose_loss("native", "auto", config)[0]


def _grads(model, fn):
    model.zero_grad(set_to_none=True)
    loss = fn()
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _one_by_one(model, docs):
    def fn():
        total = 0.0
        for ids, mask in docs:
            b = make_block(ids, mask, [0], len(ids), 0)
            total = total + full_loss_sum(model, {"input_ids": b.input_ids[None], "labels": b.labels[None],
                                                  "position_ids": b.position_ids[None]})
        return total
    return _grads(model, fn)


def _trl_loss(model, block):
    """The loss of the batch TRL's padding-free collator makes of the block (as the trl engine feeds it)."""
    batch = CountingCollator(0)([block_row(block)])
    for key in COUNTING_KEYS:
        batch.pop(key)
    labels = batch.pop("labels")
    logits = model(**batch, use_cache=False).logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def _assert_same(packed, reference, label):
    (loss_p, grads_p), (loss_r, grads_r) = packed, reference
    assert grads_p.keys() == grads_r.keys() and grads_r, label
    loss_err = abs(float(loss_p - loss_r)) / abs(float(loss_r))
    grad_err = max(float((grads_p[n] - grads_r[n]).abs().max() / grads_r[n].abs().max().clamp_min(1e-30))
                   for n in grads_r)
    assert loss_err <= LOSS_TOL and grad_err <= GRAD_TOL, (label, loss_err, grad_err)


@pytest.mark.parametrize("name", MATRIX)
def test_family_packs_exactly_in_both_engines_and_its_adapters_train(name):
    model, attn, loss_impl = _model(name)
    vocab = model.get_input_embeddings().weight.shape[0]
    docs = _documents(vocab)
    block = _packed_block(docs)
    assert len(block.cu_seqlens) - 1 == len(docs) + 3  # the documents, then padding in three segments
    batch = collate([block])
    reference = _one_by_one(model, docs)
    assert all(g.abs().max() > 0 for n, g in reference[1].items() if "lora_" in n), "an adapter got no gradient"
    fn = full_loss_sum if loss_impl == "full" else LOSS_FUNCTIONS[loss_impl]
    _assert_same(_grads(model, lambda: fn(model, batch)), reference, f"{name} native {attn} {loss_impl}")
    _assert_same(_grads(model, lambda: _trl_loss(model, block)), reference, f"{name} trl {attn}")

    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = fn(model, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0], (name, losses)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


# ---------------------------------------------------------------------------------------------
# Preflight refuses what cannot keep documents apart, before any rank starts


def test_preflight_refuses_a_family_whose_recurrent_state_would_cross_documents(tmp_path, capsys):
    folder = tmp_path / "mamba"
    config = AutoConfig.for_model("mamba", vocab_size=512, hidden_size=32, num_hidden_layers=2, state_size=4)
    config.save_pretrained(folder)
    tokenizer = Path(write_model_folder("llama", tmp_path / "tok")).resolve()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / f).write_bytes((tokenizer / f).read_bytes())
    code, out, err = run_cli(["run", "tiny-cpu", "--set", f"model.path={folder}", "--set", "model.init=random",
                              "--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")],
                             capsys)
    assert code == 2
    text = out + err
    assert "train.packing" in text and "mamba" in text and "train.packing=false" in text, text
    assert "Traceback" not in text and not (tmp_path / "runs").exists()
    assert json.loads((folder / "config.json").read_text())["model_type"] == "mamba"


@pytest.mark.parametrize("engine", ["native", "trl"])
def test_preflight_refuses_an_attention_path_that_drops_the_sinks(tmp_path, engine):
    from runner.gate.preflight import preflight_problems
    from runner.spec import resolve

    folder = write_model_folder("gpt_oss", tmp_path / "gpt_oss")
    spec = resolve(load_spec({"model": {"path": str(folder), "init": "random", "attn_implementation": "sdpa"},
                              "engine": engine, "hardware": {"device": "cpu", "nproc_per_node": 1}}))
    problems = [p for p in preflight_problems(spec) if p.field == "model.attn_implementation"]
    assert len(problems) == 1 and "attention-sink" in problems[0].message and "eager" in problems[0].fix
    auto = resolve(load_spec({"model": {"path": str(folder), "init": "random"}, "engine": engine,
                              "hardware": {"device": "cpu", "nproc_per_node": 1}}))
    assert not [p for p in preflight_problems(auto) if p.field == "model.attn_implementation"]


@pytest.mark.parametrize("name", ["phi3", "gemma3_text"])
def test_varlen_applies_the_family_s_sliding_window(name, monkeypatch):
    """Phi3 (and Mistral) give the window only as an argument of the attention call, Gemma (and GPT-OSS) also on the
    module: varlen must apply it either way (the reference kernel here; torch's on GPU), as the masks do."""
    from runner.train import attention

    monkeypatch.setattr(attention, "_varlen", None)
    attention.set_varlen_kernel(attention.reference_varlen_attn)
    attention.register_varlen()
    try:
        config = family_config(name)
        torch.manual_seed(0)
        config.initializer_range = 0.2
        # One config object each: a model reads its attention implementation from its config at every call.
        reference_model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager",
                                                           dtype=torch.float32)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="varlen",
                                                 dtype=torch.float32)
        assert model.config._attn_implementation == "varlen" != reference_model.config._attn_implementation
        model.load_state_dict(reference_model.state_dict())
        docs = _documents(512)
        assert max(len(d) for d, _ in docs) > config.sliding_window  # the window cuts into the long documents
        packed = _grads(model, lambda: full_loss_sum(model, collate([_packed_block(docs)])))
        _assert_same(packed, _one_by_one(reference_model, docs), f"{name} varlen")
    finally:
        attention.set_varlen_kernel(None)
