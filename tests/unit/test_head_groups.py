"""Attention differentiated one KV-head group at a time (runner.train.head_groups): the whole attention's output and
gradients, alone and inside a tiled, recomputed layer; when the planner asks for it and what the estimator counts."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from runner.train import attention
from runner.train.apply import set_head_groups
from runner.train.data import collate
from runner.train.head_groups import HeadGroups, attend_in_groups
from runner.train.loss import full_loss_sum
from runner.train.apply import enable_recompute
from runner.train.model import text_decoder_layers
from runner.train.tiling import tile_layers
from tests.families import family_config
from tests.unit.test_families import _assert_same, _documents, _grads, _packed_block

CU = torch.tensor([0, 5, 17, 18, 40], dtype=torch.int32)  # four documents, one of a single token


def _attend(q, k, v):
    return attention.reference_varlen_attn(q, k, v, CU, CU, 22, 22, window_size=(-1, 0), enable_gqa=True)


def _qkv(heads_q: int, heads_kv: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tokens = int(CU[-1])
    return [torch.randn(tokens, h, 16, generator=g, requires_grad=True) for h in (heads_q, heads_kv, heads_kv)]


def _out_and_grads(fn, q, k, v):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), torch.linspace(-1, 1, out.numel()).view_as(out))
    return out.detach(), grads


@pytest.mark.parametrize("heads_q, heads_kv, groups", [(8, 2, 2), (8, 2, 4), (4, 4, 4), (6, 3, 3)])
def test_head_groups_give_the_whole_attention_s_output_and_gradients(heads_q, heads_kv, groups):
    q, k, v = _qkv(heads_q, heads_kv)
    out, grads = _out_and_grads(_attend, q, k, v)
    calls: list[int] = []

    def counted(q_, k_, v_):
        calls.append(k_.shape[1])
        return _attend(q_, k_, v_)

    grouped_out, grouped_grads = _out_and_grads(lambda *x: attend_in_groups(counted, groups, *x), q, k, v)
    torch.testing.assert_close(grouped_out, out, rtol=0, atol=0)
    for a, b in zip(grouped_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    runs = min(groups, heads_kv) if heads_kv % groups else groups  # 4 groups of 2 KV heads fall back to 2
    assert len(calls) == 2 * runs and set(calls) == {heads_kv // runs}  # forward, then backward, a group each


def test_without_gradients_the_groups_make_the_same_kernel_calls():
    q, k, v = (x.detach() for x in _qkv(8, 2))
    calls: list[int] = []

    def counted(q_, k_, v_):
        calls.append(k_.shape[1])
        return _attend(q_, k_, v_)

    plain = attend_in_groups(counted, 2, q, k, v)
    assert plain.grad_fn is None and calls == [1, 1]
    q.requires_grad_()
    assert attend_in_groups(_attend, 2, q, k, v).grad_fn.name().endswith(HeadGroups.__name__ + "Backward")
    with torch.no_grad():
        assert torch.equal(attend_in_groups(_attend, 2, q, k, v), plain)


@pytest.fixture
def reference_varlen():
    attention.set_varlen_kernel(attention.reference_varlen_attn)
    attention.register_varlen()
    yield
    attention.set_varlen_kernel(None)


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_a_tiled_recomputed_layer_attending_in_head_groups_trains_as_the_plain_one(name, reference_varlen,
                                                                                  monkeypatch):
    config = family_config(name)
    assert config.num_key_value_heads > 1
    torch.manual_seed(0)
    config.initializer_range = 0.2
    model = AutoModelForCausalLM.from_config(config, attn_implementation="varlen", dtype=torch.float32)
    batch = collate([_packed_block(_documents(model.get_input_embeddings().weight.shape[0]))])
    reference = _grads(model, lambda: full_loss_sum(model, batch))
    grouped = copy.deepcopy(model)
    tile_layers(text_decoder_layers(grouped), 37)
    grouped.train()
    enable_recompute(grouped, None)
    set_head_groups(text_decoder_layers(grouped), config.num_key_value_heads)
    backward_calls: list[int] = []
    backward = HeadGroups.backward
    monkeypatch.setattr(HeadGroups, "backward", staticmethod(lambda ctx, g: backward_calls.append(1) or backward(ctx, g)))
    _assert_same(_grads(grouped, lambda: full_loss_sum(grouped, batch)), reference, f"{name} in head groups")
    assert len(backward_calls) == config.num_hidden_layers


QWEN3_4B = {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}


def test_tiled_layers_attend_in_head_groups_where_the_kernels_workspace_would_take_a_share_of_the_gpu():
    from runner.facts.catalog import parse_arch
    from runner.facts.tiling import HEAD_GROUPS_WHEN_SHARE, attention_head_groups, flash_backward_workspace_bytes

    arch = parse_arch(QWEN3_4B)
    gpu = 80 * 2**30
    edge = int(HEAD_GROUPS_WHEN_SHARE * gpu / flash_backward_workspace_bytes(arch))  # 163,840 tokens
    assert attention_head_groups(arch, True, "varlen", "cuda", edge, gpu) == 1
    assert attention_head_groups(arch, True, "varlen", "cuda", edge + 1, gpu) == 8
    for tiled, attn, device in ((False, "varlen", "cuda"), (True, "flex", "cuda"), (True, "varlen", "cpu")):
        assert attention_head_groups(arch, tiled, attn, device, 4 * edge, gpu) == 1


def test_the_estimate_counts_one_groups_workspace_and_temporaries():
    """Qwen3-4B on an H100 at 262,144 tokens, tiled: the kernel's workspace (8 bytes × q_dim a token) is one group's
    of 8, beside that group's slices, output and gradients: 7/8 of 32 KiB a token less 1/8 of the group's own."""
    from runner.facts.catalog import parse_arch
    from runner.plan import estimate
    from runner.plan.activations import backward_transient_bytes
    from runner.spec import load_spec

    arch = parse_arch(QWEN3_4B)
    whole, grouped = (backward_transient_bytes(arch, 2, True, 8 * 4096, g) for g in (1, 8))
    assert whole - grouped == pytest.approx(7 / 8 * 8 * 4096 - (2 * (4 * 4096 + 4 * 1024) + 4 * 32) / 8)
    n = 262144
    sets = ["train.compile=false", "train.recompute_layers=null", "train.activation_checkpointing=true",
            "train.offload_activations=true", f"train.seq_len={n}", "hardware.gpu=H100-80GB"]
    tiled, untiled = (estimate(load_spec("qwen3-4b-bench-h200", [*sets, f"train.tiled_mlp={v}"]), suggest=False)
                      for v in ("true", "false"))
    assert "8 KV-head groups" in tiled.approximate_reason and "KV-head" not in untiled.approximate_reason


class _FlashLike(torch.autograd.Function):
    """FlashAttention-2's allocations, not its math: forward keeps q, k, v, its output and the fp32 log-sum-exp;
    backward allocates dq in fp32 and the k and v gradients of every query head before summing them per KV head."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q * 1
        ctx.save_for_backward(q, k, v, out, torch.empty(q.shape[:2], dtype=torch.float32))
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        dq, dk, dv = torch.zeros(q.shape, dtype=torch.float32), torch.zeros_like(q), torch.zeros_like(q)
        per_kv = (q.shape[0], k.shape[1], q.shape[1] // k.shape[1], q.shape[2])
        return dq.to(q.dtype) + grad, dk.view(per_kv).sum(2), dv.view(per_kv).sum(2)


def test_a_backward_in_head_groups_holds_what_the_estimator_counts():
    """Live bytes (benchmarks/activation_peak_cpu.py's tracker) of one attention backward over a kernel that
    allocates as FlashAttention-2 does, 32 query and 8 KV heads: in 8 groups under half of the whole's, and each
    within 12% over the estimator's count (its q, k, v gradients and the workspace, a group's at a time)."""
    from runner.facts.catalog import parse_arch
    from runner.facts.tiling import flash_backward_workspace_bytes
    from runner.plan.activations import backward_transient_bytes
    from tests.unit.test_tiled_mlp import _live_bytes

    tokens, hidden = 4096, 512
    arch = parse_arch({"model_type": "llama", "hidden_size": hidden, "intermediate_size": 1024, "num_hidden_layers": 1,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 16, "vocab_size": 128})
    measured = {}
    for groups in (1, 8):
        mode = _live_bytes()(tokens)
        with mode:
            q = torch.randn(tokens, 32, 16).to(torch.bfloat16).requires_grad_()
            k, v = (torch.randn(tokens, 8, 16).to(torch.bfloat16).requires_grad_() for _ in range(2))
            out = attend_in_groups(_FlashLike.apply, groups, q, k, v)
            grad = torch.randn_like(out)
            mode.peak = before = mode.live
            out.backward(grad)
        measured[groups] = (mode.peak - before) / tokens
    assert measured[8] < measured[1] / 2, measured
    for groups, got in measured.items():  # the hidden state's gradients in and out are not part of this call
        counted = backward_transient_bytes(arch, 2, True, flash_backward_workspace_bytes(arch), groups) - 4 * hidden
        assert counted <= got <= 1.12 * counted, (groups, got, counted)
