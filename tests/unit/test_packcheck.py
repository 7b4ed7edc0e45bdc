"""The packing check (runner.gate.packcheck): it refuses planted leaks, passes the registry's families, and over more
than 30 model types the registry does not list each one either matches or is refused before launch."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from transformers import AttentionInterface, AutoConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from runner.facts import families
from runner.decide.rules import Kernels, choose_attention
from runner.gate import packcheck
from runner.gate.packcheck import EXACT, FAILED, MISMATCH, Setup, check_problems, packing_verdict, run_check
from runner.spec import load_spec, resolve
from runner.train.attention import packing_support
from tests.families import family_config

CPU = Setup("native", "sdpa", "", "chunked", "cpu", "float32", 512)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SFT_TUI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "packcheck.json"


def _whole_row_sdpa(module, query, key, value, attention_mask, **kwargs):
    """Causal attention over the whole packed row: the document boundaries are dropped."""
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


class AbsolutePositionLlama(LlamaForCausalLM):
    """A learned absolute position embedding that counts from the row's start: positions never restart per
    document, while the attention mask (built from the restarting position_ids) is right."""

    def __init__(self, config):
        super().__init__(config)
        self.positions = nn.Embedding(1024, config.hidden_size)
        self.model.embed_tokens.register_forward_hook(
            lambda _m, _a, out: out + self.positions(torch.arange(out.shape[1], device=out.device)))


def test_planted_leaks_are_refused_and_the_same_model_without_them_passes():
    AttentionInterface.register("whole_row_sdpa", _whole_row_sdpa)
    config = family_config("llama")
    leaky = run_check(config, Setup(**{**CPU.__dict__, "path": "whole_row_sdpa"}))
    assert leaky.status == MISMATCH and leaky.ce_nats > 1e-2, leaky
    unreset = run_check(config, CPU, model_cls=AbsolutePositionLlama)
    assert unreset.status == MISMATCH and unreset.ce_nats > 1e-2, unreset
    control = run_check(config, CPU)
    assert control.status == EXACT and control.ce_nats < 1e-5 and control.grad_rel < 1e-5, control
    bf16 = run_check(config, Setup(**{**CPU.__dict__, "dtype": "bfloat16"}))
    assert bf16.status == EXACT, bf16


def _cpu_setup(config, engine="native", seq_len=512):
    from runner.decide.rules import choose_loss

    path = choose_attention("auto", "cpu", seq_len, None, config, Kernels.assumed("cpu")).impl
    return Setup(engine, path, "", choose_loss(engine, "auto", config)[0], "cpu", "float32", seq_len)


SLOW_GATED_DELTA = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
"""Gated-delta families share one per-document path that costs seconds each on CPU: the 27B notebook's two
(qwen3_5, qwen3_5_moe) stand for them here (the family matrix, tests/unit/test_families.py, trains qwen3_next)."""


def _own_model_class(model_type: str) -> bool:
    """Text configs of VLMs (qwen3_5_text, qwen2_vl_text) have no causal-LM class: their VLM's entry covers them."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from runner.train.attention import concrete_model_class

    config = AutoConfig.for_model(model_type)
    return any(concrete_model_class(a, config) for a in (AutoModelForCausalLM, AutoModelForImageTextToText))


@pytest.mark.parametrize("model_type", sorted(t for t, f in families.FAMILIES.items()
                                              if f.attention_paths and t not in SLOW_GATED_DELTA
                                              and _own_model_class(t)))
def test_every_registry_family_passes(model_type):
    # The transformers default config of the family (its real sizes): the check shrinks it itself.
    config = family_config(model_type) if model_type in families.MATRIX else AutoConfig.for_model(model_type)
    verdict = run_check(config, _cpu_setup(config))
    assert verdict.status == EXACT, verdict
    assert verdict.known and "small widths" in verdict.shrunk


UNLISTED = (
    "afmoe", "apertus", "arcee", "aria_text", "beam", "bitnet", "cohere", "cohere2", "cwm", "diffllama", "doge",
    "emu3", "exaone4", "falcon", "glm", "glm4_moe", "gpt2", "gpt_bigcode", "gpt_neox", "granitemoe", "helium",
    "hy_v3", "internlm3", "jais2", "llama4_text", "minicpm3", "sarvam_moe", "seed_oss", "solar_open", "stablelm",
    "starcoder2", "biogpt", "opt",
)
"""Model types the registry does not list (transformers 5.24), from its own default configs."""


def test_unlisted_model_types_match_or_are_refused_before_launch():
    """Every type either trains packed exactly (the check's verdict) or preflight refuses it: none trains on a
    mismatch. Measured on transformers 5.24: 31 match; opt's learned absolute positions count from the row's start
    (documents after the first see positions they never see alone): refused by the check; biogpt is refused by the
    attention choice before it."""
    from runner.train.attention import attention_for

    spec = resolve(load_spec({"hardware": {"device": "cpu", "nproc_per_node": 1}}))
    outcome = {}
    for mt in UNLISTED:
        config = AutoConfig.for_model(mt)
        assert not families.family_of(config).known, mt
        if not packing_support(config).safe:
            outcome[mt] = "refused: recurrent layers"
            continue
        verdict = packing_verdict(spec, config, "cpu")
        if verdict is None:  # no attention path keeps its documents apart here: preflight refuses the path
            assert attention_for(spec, config, "cpu")[1] is not None, mt
            outcome[mt] = "refused: attention path"
            continue
        problems = check_problems(spec, config, "cpu")
        if verdict.status == EXACT:
            assert not problems, (mt, problems)
        else:
            assert len(problems) == 1 and problems[0].field == "train.packing", (mt, verdict)
            assert mt in problems[0].message and verdict.path in problems[0].message, problems[0]
            assert "train.packing=false" in problems[0].fix
        outcome[mt] = verdict.status
    assert len(outcome) >= 30
    assert sum(s == EXACT for s in outcome.values()) >= 28, outcome
    assert all(outcome[mt] != EXACT for mt in ("biogpt", "opt")), outcome  # a real leak, refused
    assert outcome["llama4_text"] == outcome["doge"] == EXACT, outcome  # doge: within its window at seq_len 512


def test_doge_past_its_key_window_is_refused():
    """Doge keeps its top-k keys by a score whose ties depend on the whole row: once a document is longer than
    keep_window_size, padding and neighbours change what it attends to. A run whose blocks can hold such documents
    is refused; one whose blocks cannot is checked within the window (above)."""
    config = AutoConfig.for_model("doge")
    assert config.keep_window_size < 4096
    spec = resolve(load_spec({"hardware": {"device": "cpu", "nproc_per_node": 1}, "train": {"seq_len": 4096}}))
    problems = check_problems(spec, config, "cpu")
    assert len(problems) == 1 and "doge" in problems[0].message and "sdpa" in problems[0].message, problems
    assert "train.packing=false" in problems[0].fix


def test_llama4_text_past_its_temperature_floor_is_refused():
    """Llama 4's no-rope layers scale queries by the token's position counted from the row's start: in a block of
    floor_scale tokens or more, a document after the first is computed unlike itself alone. The shrunk copy's
    floor is crossed as the run's is (runner.gate.shrink), so the check sees it; below it, packing is exact."""
    config = AutoConfig.for_model("llama4_text")
    assert config.attn_temperature_tuning and config.floor_scale == 8192
    outcome = {}
    for seq_len in (8191, 8192):
        spec = resolve(load_spec({"hardware": {"device": "cpu", "nproc_per_node": 1},
                                  "train": {"seq_len": seq_len}}))
        outcome[seq_len] = check_problems(spec, config, "cpu")
    assert outcome[8191] == []
    problem, = outcome[8192]
    assert "llama4_text" in problem.message and "train.packing=false" in problem.fix, problem
    # In bf16, as GPU runs compute, the shrunk copy's steeper scale keeps it past the bf16 tolerance.
    bf16 = run_check(config, Setup("native", "sdpa", "", "full", "cpu", "bfloat16", 8192))
    assert bf16.status == MISMATCH, bf16


def test_llama4_text_trains_in_both_engines():
    config = AutoConfig.for_model("llama4_text")
    for engine in ("native", "trl"):
        assert run_check(config, _cpu_setup(config, engine)).status == EXACT, engine


def test_the_varlen_path_checks_a_model_whose_layers_do_not_pass_positions_on():
    """Llama 4's layers take rotary embeddings, not position_ids: a document alone (no packing inputs) reaches the
    varlen function with neither boundaries nor positions, and is one sequence. Through the CPU reference varlen
    kernel (the GPU's takes the same arguments), packed equals one by one."""
    from runner.train import attention

    attention.set_varlen_kernel(attention.reference_varlen_attn)
    try:
        verdict = run_check(AutoConfig.for_model("llama4_text"), Setup("native", "varlen", "", "chunked", "cpu",
                                                                       "float32", 512))
    finally:
        attention.set_varlen_kernel(None)
    assert verdict.status == EXACT, verdict


def test_a_loss_that_skips_part_of_the_output_head_is_refused():
    """The native chunked loss applies lm_head alone; bert-style heads transform the hidden state first."""
    config = AutoConfig.for_model("bert", is_decoder=True)
    verdict = run_check(config, CPU)
    assert verdict.status in (MISMATCH, FAILED) and "output head" in verdict.message, verdict


def test_the_verdict_is_cached_per_config_and_path(cache):
    config = family_config("llama")
    first = packcheck.checked(config, CPU)
    assert not first.cached and cache.is_file()
    again = packcheck.checked(config, CPU)
    assert again.cached and again.ce_nats == first.ce_nats and again.seconds == first.seconds
    other = packcheck.checked(config, Setup(**{**CPU.__dict__, "path": "eager"}))
    assert not other.cached
    config.rms_norm_eps = 1e-5
    assert not packcheck.checked(config, CPU).cached
    assert len(json.loads(cache.read_text())) == 3


def test_the_own_gated_delta_rule_is_the_recurrence():
    """runner.train.gated_delta's chunked form against the rule written token by token (no transformers code)."""
    from runner.train.gated_delta import chunk_gated_delta

    torch.manual_seed(0)
    length, heads, dk, dv = 150, 2, 8, 8  # past two 64-token chunks
    q, k, v = torch.randn(length, heads, dk), torch.randn(length, heads, dk), torch.randn(length, heads, dv)
    g, beta = -torch.rand(length, heads), torch.rand(length, heads)
    qn, kn = (x / x.norm(dim=-1, keepdim=True) for x in (q, k))
    state, expected = torch.zeros(heads, dk, dv), []
    for t in range(length):
        state = state * g[t].exp()[:, None, None]
        delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", state, kn[t]))
        state = state + torch.einsum("hk,hv->hkv", kn[t], delta)
        expected.append(torch.einsum("hkv,hk->hv", state, qn[t] * dk ** -0.5))
    assert torch.allclose(chunk_gated_delta(q, k, v, g, beta), torch.stack(expected), atol=1e-5)


def test_the_own_gated_delta_rule_matches_flash_linear_attention_per_document():
    """Where flash-linear-attention is installed: its PyTorch reference of the rule (the one its kernels are tested
    against), run on each document alone from a zero state, equals the own chunked form (a document of two chunks
    and a partial one, and one shorter than a chunk)."""
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive", reason="flash-linear-attention is not installed")
    from runner.train.gated_delta import chunk_gated_delta

    torch.manual_seed(0)
    heads, dk, dv = 2, 16, 8
    for length in (150, 37):
        q, k, v = torch.randn(length, heads, dk), torch.randn(length, heads, dk), torch.randn(length, heads, dv)
        g, beta = -torch.rand(length, heads), torch.rand(length, heads)
        qn, kn = (x / x.norm(dim=-1, keepdim=True) for x in (q, k))
        reference, _ = naive.naive_recurrent_gated_delta_rule(*(x[None] for x in (qn, kn, v, beta, g)))  # [1, T, H, .]
        assert torch.allclose(chunk_gated_delta(q, k, v, g, beta), reference[0], atol=1e-5), length


def test_the_check_runs_flex_eagerly_and_nothing_else_changes(monkeypatch):
    """Flex in the check: its reference implementation by default (a compile in a new process cost 30 s of the 10 s
    a check may take, measured on an H100); compiled for every length when asked; other paths untouched."""
    import torch

    from runner.gate import packcheck

    def stance() -> str:  # set_stance replaces the object: read it afresh
        return torch._dynamo.eval_frame._stance.stance

    with packcheck._flex_regime("flex_attention"):
        assert stance() == "force_eager"
    assert stance() == "default"
    with packcheck._flex_regime("varlen"):
        assert stance() == "default"
    monkeypatch.setattr(packcheck, "FLEX_SHAPES", "dynamic")
    with packcheck._flex_regime("flex_attention"):
        assert torch._dynamo.config.assume_static_by_default is False
    assert torch._dynamo.config.assume_static_by_default is True
