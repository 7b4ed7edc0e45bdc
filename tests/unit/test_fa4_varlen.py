"""The flash-attn-4 varlen wrapper (runner/train/fa4.py) and recomputation that keeps attention outputs.

The CuTe kernels need a Hopper/Blackwell GPU; here a stand-in module with flash-attn-4's two entry points
(`_flash_attn_fwd`, `_flash_attn_bwd`, the same arguments and return layout: out [tokens, heads, dim], lse
[heads, tokens] fp32) computes them document by document in float64. What is tested is ours: the custom ops,
their fake shapes, the autograd wiring, and that a packed block through the wrapper gives its documents' loss and
gradients one by one, with recomputation on and with the attention outputs kept (train.recompute_attention=false).
The kernels themselves are checked against PyTorch's on the H200 (benchmarks/attention-h200.md).
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from runner.train import attention, fa4

from tests.unit.test_packing import _assert_equal, _documents, _loss_and_grads, _packed_batch, _per_document, _qwen3


def _attend(q, k, v, cu, scale, left):
    """Per document: (out, lse) in float64, GQA by head repetition, causal or a causal window of `left`."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float64)
    rep = q.shape[1] // k.shape[1]
    for a, b in zip(cu.tolist()[:-1], cu.tolist()[1:]):
        qs = q[a:b].double().transpose(0, 1)
        ks = k[a:b].double().repeat_interleave(rep, dim=1).transpose(0, 1)
        vs = v[a:b].double().repeat_interleave(rep, dim=1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) * scale
        i = torch.arange(b - a)
        allowed = (i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :] <= left) if left is not None else True)
        scores = scores.masked_fill(~allowed, float("-inf"))
        lse[:, a:b] = torch.logsumexp(scores, dim=-1)
        out[a:b] = (torch.softmax(scores, dim=-1) @ vs).transpose(0, 1)
    return out, lse


def _stand_in(calls: dict[str, int]) -> types.SimpleNamespace:
    def fwd(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
            window_size_left, window_size_right, return_lse):
        assert return_lse and (causal or window_size_right == 0)
        assert max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        calls["fwd"] += 1
        out, lse = _attend(q, k, v, cu_seqlens_q, softmax_scale, window_size_left)
        return out.to(q.dtype), lse.float(), None, None, None

    def bwd(q, k, v, out, dout, lse, *, softmax_scale, causal, window_size_left, window_size_right, cu_seqlens_q,
            cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        # By hand: a custom op's body runs below autograd.
        calls["bwd"] += 1
        dq, dk, dv = (torch.zeros_like(x, dtype=torch.float64) for x in (q, k, v))
        rep = q.shape[1] // k.shape[1]
        for a, b in zip(cu_seqlens_q.tolist()[:-1], cu_seqlens_q.tolist()[1:]):
            qs = q[a:b].double().transpose(0, 1)
            ks = k[a:b].double().repeat_interleave(rep, dim=1).transpose(0, 1)
            vs = v[a:b].double().repeat_interleave(rep, dim=1).transpose(0, 1)
            do = dout[a:b].double().transpose(0, 1)
            i = torch.arange(b - a)
            allowed = (i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :] <= window_size_left)
                                                    if window_size_left is not None else True)
            p = torch.softmax((qs @ ks.transpose(1, 2) * softmax_scale).masked_fill(~allowed, float("-inf")), -1)
            o = p @ vs
            dp = do @ vs.transpose(1, 2)
            ds = p * (dp - (do * o).sum(-1, keepdim=True))
            dq[a:b] = (ds @ ks * softmax_scale).transpose(0, 1)
            dks = (ds.transpose(1, 2) @ qs * softmax_scale).transpose(0, 1)
            dvs = (p.transpose(1, 2) @ do).transpose(0, 1)
            dk[a:b] = dks.reshape(b - a, k.shape[1], rep, -1).sum(2)
            dv[a:b] = dvs.reshape(b - a, v.shape[1], rep, -1).sum(2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    return types.SimpleNamespace(_flash_attn_fwd=fwd, _flash_attn_bwd=bwd)


@pytest.fixture
def fa4_stand_in(monkeypatch):
    calls = {"fwd": 0, "bwd": 0}
    monkeypatch.setattr(fa4, "_interface", lambda: _stand_in(calls))
    attention.set_varlen_kernel(fa4.varlen_attn)
    attention.register_varlen()
    yield calls
    attention.set_varlen_kernel(None)


def test_wrapper_matches_varlen_contract_and_fake_shapes(fa4_stand_in):
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    q = torch.randn(20, 4, 8, requires_grad=True)
    k, v = (torch.randn(20, 2, 8, requires_grad=True) for _ in range(2))
    out = fa4.varlen_attn(q, k, v, cu, cu, 8, 8, window_size=(-1, 0), enable_gqa=True)
    ref = attention.reference_varlen_attn(q, k, v, cu, cu, 8, 8, window_size=(-1, 0), enable_gqa=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    # A sliding window of 2: query i sees keys i-2..i.
    windowed = fa4.varlen_attn(q, k, v, cu, cu, 8, 8, window_size=(2, 0))
    torch.testing.assert_close(windowed, attention.reference_varlen_attn(q, k, v, cu, cu, 8, 8, window_size=(2, 0),
                                                                         enable_gqa=True), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="causal"):
        fa4.varlen_attn(q, k, v, cu, cu, 8, 8, window_size=(-1, -1))
    # The fake implementations give what the kernels give, so a compiled layer plans the right buffers.
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = [x.detach() for x in (q, k, v)]
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(x) for x in real)
        o, lse = torch.ops.sft_tui.fa4_varlen_fwd(fq, fk, fv, mode.from_tensor(cu), mode.from_tensor(cu), 8, 8,
                                                  0.35, -1)
        assert o.shape == (20, 4, 8) and lse.shape == (4, 20) and lse.dtype == torch.float32


@pytest.mark.parametrize("recompute_attention", [True, False])
def test_packed_block_through_fa4_equals_documents_one_by_one(fa4_stand_in, recompute_attention):
    """A recomputed Qwen3 model through the wrapper: the loss and gradients of its documents one by one. With
    recompute_attention=False each layer's attention runs once per step (its output kept), else twice."""
    from runner.train.loss import chunked_loss_sum
    from runner.train.apply import enable_recompute

    model = _qwen3("varlen")
    docs = _documents()
    reference = _per_document(_qwen3("sdpa"), docs)
    enable_recompute(model, None, recompute_attention=recompute_attention)
    packed = _loss_and_grads(model, lambda: chunked_loss_sum(model, _packed_batch(docs)))
    _assert_equal(packed, reference, f"qwen3 through fa4, recompute_attention={recompute_attention}")
    layers = model.config.num_hidden_layers
    assert fa4_stand_in["bwd"] == layers
    assert fa4_stand_in["fwd"] == layers * (2 if recompute_attention else 1)


def test_kernel_choice_and_refusal():
    from runner.decide.rules import FA4_KERNEL, TORCH_KERNEL, Kernels, varlen_kernel, varlen_kernel_refusal

    with_fa4, without = Kernels(varlen=True, fa4=True), Kernels(varlen=True)
    assert varlen_kernel("auto", with_fa4, 128) == FA4_KERNEL
    assert varlen_kernel("auto", without, 128) == TORCH_KERNEL
    assert varlen_kernel("torch", with_fa4, 128) == TORCH_KERNEL
    assert varlen_kernel("auto", with_fa4, 256) == TORCH_KERNEL  # past what every supported GPU takes
    assert varlen_kernel_refusal("auto", without, 128) is None
    assert "pip install flash-attn-4" in varlen_kernel_refusal(FA4_KERNEL, without, 128)
    assert "head sizes" in varlen_kernel_refusal(FA4_KERNEL, with_fa4, 80 + 4)


@pytest.mark.parametrize("present, expected", [({"flash_attn.cute", "cutlass", "cutlass/cute"}, True),
                                               ({"flash_attn.cute", "cutlass"}, False), ({"flash_attn.cute"}, False),
                                               (set(), False)])
def test_flash_attn_4_counts_as_installed_only_with_the_dsl_it_compiles_with(monkeypatch, tmp_path, present,
                                                                             expected):
    """flash-attn-4's package without the CuTe DSL's `cutlass` (put on the path by a .pth file that a PYTHONPATH copy
    of the wheels does not run), or with a `cutlass` holding no `cute` (the DSL's sources are a wheel of their own
    since 4.8), imports, then fails at its first kernel: the run must not pick it."""
    import importlib.machinery
    import importlib.util

    folder = tmp_path / "cutlass"
    folder.mkdir()
    if "cutlass/cute" in present:
        (folder / "cute").mkdir()
        (folder / "cute" / "__init__.py").write_text("")
    cutlass = importlib.machinery.ModuleSpec("cutlass", None, is_package=True)
    cutlass.submodule_search_locations = [str(folder)]
    specs = {"flash_attn.cute": object(), "cutlass": cutlass}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: specs[name] if name in present else None)
    fa4.available.cache_clear()
    try:
        assert fa4.available() is expected
    finally:
        fa4.available.cache_clear()


def test_heads_of_16_never_go_to_flash_attn_4():
    """Its SM90 backward returns wrong query gradients for heads of 16 (measured on an H100); 32 and up are right."""
    from runner.decide.rules import FA4_KERNEL, TORCH_KERNEL, Kernels, varlen_kernel, varlen_kernel_refusal

    with_fa4 = Kernels(varlen=True, fa4=True)
    assert varlen_kernel("auto", with_fa4, 16) == TORCH_KERNEL
    assert varlen_kernel("auto", with_fa4, 32) == FA4_KERNEL
    assert "from 32" in varlen_kernel_refusal(FA4_KERNEL, with_fa4, 16)


def _per_key_head(config):
    text = config.get_text_config()
    return text.num_attention_heads // (getattr(text, "num_key_value_heads", None) or text.num_attention_heads)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "gpt2", "qwen2_5_vl", "phi3", "qwen3"])
def test_the_packing_checks_copy_keeps_the_runs_head_size_on_flash_attn_4(model_type):
    """The check runs the run's kernel: on flash-attn-4, whose code differs by head size, at the run's head size
    (named in the config, or derived from its width as gpt2's and Qwen2.5-VL's are, whose rotary sections follow
    it); elsewhere small heads. The copy builds and runs."""
    from transformers import AutoConfig

    from runner.decide.rules import head_dim
    from runner.gate.packcheck import Setup, _auto_class, _construct
    from runner.gate.shrink import shrunk_config

    config = AutoConfig.for_model(model_type)
    kept = shrunk_config(config, 8192, 80, keep_head_dim=True)
    assert head_dim(kept) == head_dim(config) >= 64
    assert _per_key_head(kept) == _per_key_head(config)  # a kernel per ratio too
    assert head_dim(shrunk_config(config, 8192, 80)) == 16
    setup = Setup("native", "sdpa", "", "full", "cpu", "float32", 8192)
    model = _construct(_auto_class(kept, setup), kept, setup)
    assert model(input_ids=torch.randint(3, 500, (1, 40))).logits.shape[1] == 40


def test_flash_attn_4_keeps_its_compiled_kernels_in_the_runners_cache(monkeypatch, tmp_path):
    """What flash-attn-4 sees when it is first imported: its persistent kernel cache on, in the runner's cache folder
    (so the packing check's compile serves the run); a user's own setting is left as it is."""
    seen = []
    monkeypatch.setattr(fa4.importlib, "import_module",
                        lambda name: seen.append((name, os.environ.get(fa4.PERSIST), os.environ.get(fa4.KERNELS_DIR))))
    monkeypatch.setenv("SFT_TUI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(fa4.PERSIST, raising=False)
    monkeypatch.delenv(fa4.KERNELS_DIR, raising=False)
    fa4._interface()
    assert seen == [(fa4.MODULE, "1", str(tmp_path / "fa4-kernels"))]
    monkeypatch.setenv(fa4.PERSIST, "0")
    monkeypatch.delenv(fa4.KERNELS_DIR)
    fa4._interface()
    assert seen[-1] == (fa4.MODULE, "0", None)


def _blocks_of_one_length(counts_and_longest):
    """Packed blocks of one length: (document count, longest document) each, 150 tokens of documents (the rest
    after the longest in equal documents, the last one taking the remainder), then padding."""
    g = torch.Generator().manual_seed(3)
    out = []
    for count, longest in counts_and_longest:
        rest = (150 - longest) // (count - 1)
        lengths = [longest] + [rest] * (count - 2) + [150 - longest - rest * (count - 2)]
        assert max(lengths) == longest and sum(lengths) == 150
        docs = [(torch.randint(0, 128, (n,), generator=g).tolist(), [True] * n) for n in lengths]
        out.append(_packed_batch(docs))
    return out


@pytest.mark.parametrize("recomputed", [0, 1])
def test_compiled_layers_compile_once_for_blocks_of_any_document_count(fa4_stand_in, recomputed):
    """The native engine compiles each decoder layer (on a GPU). Blocks have one length but their own number of
    documents and longest document: passed as sizes marked dynamic (packing_kwargs), the layers compile once, also
    when the two first change in different steps, late (a plain int recompiled the layers mid-run then). Through
    dynamo with an eager backend, the loss and gradients are the uncompiled model's, bit for bit. With one of the
    two layers recomputed inside its compiled forward (train.recompute_layers), two layer structures compile."""
    from torch._dynamo.utils import counters

    from runner.train.loss import full_loss_sum
    from runner.train.apply import enable_recompute
    from runner.train.model import decoder_layers

    # Three blocks alike, then a new longest document, then a new document count (each its own step).
    blocks = _blocks_of_one_length([(4, 40), (4, 40), (4, 40), (4, 50), (6, 50), (3, 70), (5, 30)])
    compiled, plain = _qwen3("varlen"), _qwen3("varlen")
    if recomputed:
        enable_recompute(compiled, recomputed, inside_compile=True)
    torch._dynamo.reset()
    for layer in decoder_layers(compiled):
        layer.compile(backend="aot_eager")
    graphs = []
    for batch in blocks:
        got = _loss_and_grads(compiled, lambda: full_loss_sum(compiled, batch))
        want = _loss_and_grads(plain, lambda: full_loss_sum(plain, batch))
        assert torch.equal(got[0], want[0]) and all(torch.equal(got[1][n], g) for n, g in want[1].items())
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[-1] == graphs[0], graphs
    torch._dynamo.reset()
