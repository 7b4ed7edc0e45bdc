"""Loss implementations (full vs chunked) and learning-rate schedules."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from runner.spec import RunSpec
from runner.train.data import collate, make_block
from runner.plan import fused_chunk_tokens
from runner.train.loss import (
    CompiledChunkCE,
    ce_sum_and_grad,
    ce_sum_and_grad_inplace,
    chunk_bounds,
    chunk_tokens_for,
    chunked_loss_sum,
    full_loss_sum,
    fused_chunk_tokens_for,
    fused_loss_sum,
    resolve_loss_impl,
)
from runner.train.native import lr_at

# Both paths compute the same float32 cross-entropies; only the summation order differs.
LOSS_TOL = 1e-6
GRAD_TOL = 1e-5


def _model(tied: bool) -> torch.nn.Module:
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.2,
                      tie_word_embeddings=tied)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)


def _batch(n_docs=3, seq_len=96, masked_prompt=True):
    g = torch.Generator().manual_seed(2)
    ids, mask, starts = [], [], []
    for d in range(n_docs):
        n = 20 + 7 * d
        starts.append(len(ids))
        ids += torch.randint(0, 300, (n,), generator=g).tolist()
        mask += [not masked_prompt or j >= n // 2 for j in range(n)]
    return collate([make_block(ids, mask, starts, seq_len, 0)])


def _loss_grads(model, fn):
    model.zero_grad(set_to_none=True)
    loss = fn()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("impl", [chunked_loss_sum, fused_loss_sum])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk", [None, 7])
def test_chunked_equals_full_loss_and_gradients(impl, tied, chunk):
    model = _model(tied)
    batch = _batch()
    loss_f, grads_f = _loss_grads(model, lambda: full_loss_sum(model, batch))
    loss_c, grads_c = _loss_grads(model, lambda: impl(model, batch, chunk_tokens=chunk))
    assert abs(float(loss_c - loss_f)) / float(loss_f) <= LOSS_TOL
    assert grads_f.keys() == grads_c.keys()
    worst = max(_rel(grads_c[n], grads_f[n]) for n in grads_f)
    assert worst <= GRAD_TOL, worst
    assert model.lm_head.weight.grad is not None


@pytest.mark.parametrize("impl", [chunked_loss_sum, fused_loss_sum])
def test_scaled_loss_scales_the_gradients(impl):
    """The step multiplies the loss sum by 1/targets: gradients made in forward must be scaled in backward."""
    model = _model(tied=False)
    batch = _batch()
    _, grads_f = _loss_grads(model, lambda: full_loss_sum(model, batch) * 0.25)
    _, grads_c = _loss_grads(model, lambda: impl(model, batch, chunk_tokens=16) * 0.25)
    assert max(_rel(grads_c[n], grads_f[n]) for n in grads_f) <= GRAD_TOL


def test_fused_loss_keeps_a_frozen_head_frozen():
    model = _model(tied=False)
    model.lm_head.weight.requires_grad_(False)
    loss, grads = _loss_grads(model, lambda: fused_loss_sum(model, _batch(), chunk_tokens=16))
    assert "lm_head.weight" not in grads and float(loss) > 0


@pytest.mark.parametrize("impl", [chunked_loss_sum, fused_loss_sum])
def test_chunked_loss_without_targets_is_zero_but_reaches_lm_head(impl):
    """An exhausted rank's empty block: zero loss, yet every parameter gets a gradient (FSDP needs them all)."""
    model = _model(tied=False)
    batch = collate([make_block([], [], [], 32, 0)])
    assert batch["target_index"].numel() == 0
    loss, grads = _loss_grads(model, lambda: impl(model, batch))
    assert float(loss) == 0.0
    assert "lm_head.weight" in grads and float(grads["lm_head.weight"].abs().sum()) == 0.0
    assert set(grads) == {n for n, p in model.named_parameters()}


def test_chunk_size_keeps_float32_logits_near_256_mib():
    assert chunk_tokens_for(151_936) * 151_936 * 4 <= 2**28
    assert chunk_tokens_for(248_320) == 256
    assert chunk_tokens_for(512) == 8192
    assert chunk_tokens_for(32_000) == 2048


def test_fused_chunk_holds_bf16_logits_and_their_gradient_near_512_mib():
    assert fused_chunk_tokens_for(151_936) == 768
    assert fused_chunk_tokens_for(151_936) * 151_936 * 4 <= 2**29
    for vocab in (512, 32_000, 151_936, 201_088, 248_320):
        assert fused_chunk_tokens(vocab) == fused_chunk_tokens_for(vocab)  # the estimator counts the same chunk


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_gradient_written_for_the_compiler_equals_the_in_place_one(dtype):
    """Run eagerly, the two forms of a chunk's loss and logits' gradient give identical bits."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(37, 1000, generator=g) * 3).to(dtype)
    targets = torch.randint(0, 1000, (37,), generator=g)
    loss_a, grad_a = ce_sum_and_grad_inplace(logits.clone(), targets)
    loss_b, grad_b = ce_sum_and_grad(logits, targets)
    assert grad_a.dtype == grad_b.dtype == dtype
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    ref = torch.nn.functional.cross_entropy(logits.double(), targets, reduction="sum")
    assert float(loss_b) == pytest.approx(float(ref), rel=1e-6)


@pytest.mark.launches
def test_fused_loss_with_the_compiled_chunk_matches_the_chunked_loss():
    """The GPU path (train.compile): each chunk's softmax and gradient from torch.compile (here inductor on CPU)."""
    model = _model(tied=True)
    batch = _batch()
    loss_c, grads_c = _loss_grads(model, lambda: chunked_loss_sum(model, batch, chunk_tokens=16))
    loss_f, grads_f = _loss_grads(model, lambda: fused_loss_sum(model, batch, chunk_tokens=16, compiled=True))
    assert abs(float(loss_f - loss_c)) / float(loss_c) <= LOSS_TOL
    assert grads_f.keys() == grads_c.keys()
    assert max(_rel(grads_f[n], grads_c[n]) for n in grads_c) <= GRAD_TOL


@pytest.mark.parametrize("rows,chunk", [(1, 4), (4, 4), (5, 4), (9, 4), (10, 4), (3, 2), (7, 1), (2049, 1024)])
def test_chunk_bounds_cover_the_rows_in_order_without_one_row_remainders(rows, chunk):
    bounds = chunk_bounds(rows, chunk)
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(0 < end - start <= chunk for start, end in bounds)
    if rows > 1 and chunk > 2:
        assert all(end - start >= 2 for start, end in bounds)


def test_the_compiled_chunk_compiles_once_for_every_kind_of_chunk_a_run_makes():
    """Remainders, single-chunk steps (targets at offset 0) and a lone target row: one graph, no recompile.

    Before, dynamo compiled a static graph, recompiled at the first remainder, and again at the first step whose
    targets fit in one chunk: a partly filled block after the warm-up cost a second on the GPU.
    """
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    ce = CompiledChunkCE(backend=counter)
    g = torch.Generator().manual_seed(3)
    for rows in (2500, 920, 2049, 3, 1):  # the targets of five steps, chunked as the fused loss chunks them
        targets = torch.randint(0, 50, (rows,), generator=g)
        hidden = torch.randn(rows, 50, generator=g)
        for start, end in chunk_bounds(rows, 1024):
            # Logits are a fresh matmul output in the loss; the eager twin overwrites them.
            loss, grad = ce(hidden[start:end].clone(), targets[start:end])
            ref_loss, ref_grad = ce_sum_and_grad_inplace(hidden[start:end].clone(), targets[start:end])
            assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_auto_loss_is_chunked_unless_logits_are_transformed():
    assert resolve_loss_impl("auto", Qwen3Config())[0] == "chunked"
    assert resolve_loss_impl("full", Qwen3Config())[0] == "full"
    capped = Qwen3Config()
    capped.final_logit_softcapping = 30.0
    impl, reason = resolve_loss_impl("auto", capped)
    assert impl == "full" and "final_logit_softcapping" in reason
    with pytest.raises(ValueError, match="use full"):
        resolve_loss_impl("chunked", capped)


def _spec(schedule, warmup=0, lr=1.0):
    return RunSpec.model_validate({"train": {"schedule": schedule, "warmup_steps": warmup, "lr": lr}})


def test_lr_warmup_then_constant():
    s = _spec("constant", warmup=4, lr=2.0)
    assert [lr_at(s, k, 100) for k in (1, 2, 4, 5, 100)] == [0.5, 1.0, 2.0, 2.0, 2.0]


def test_lr_cosine_decays_from_the_peak_to_near_zero():
    s = _spec("cosine", warmup=10)
    assert lr_at(s, 10, 110) == 1.0  # end of warmup
    assert lr_at(s, 11, 110) == 1.0  # first decay step still at the peak
    assert lr_at(s, 61, 110) == pytest.approx(0.5)
    assert lr_at(s, 36, 110) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))
    assert lr_at(s, 110, 110) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.99)))
    assert all(lr_at(s, k, 110) > 0 for k in range(1, 111))


def test_lr_linear_decay_and_unknown_total_stays_at_peak():
    s = _spec("linear", warmup=0, lr=3.0)
    assert lr_at(s, 1, 10) == 3.0
    assert lr_at(s, 6, 10) == pytest.approx(1.5)
    assert lr_at(s, 10, 10) == pytest.approx(0.3)
    # No max_steps (epochs): the total is unknown, so the schedule holds the peak after warmup.
    assert lr_at(s, 500, None) == 3.0


def _benchmark_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "native_gpu_check.py"
    spec = importlib.util.spec_from_file_location("native_gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_configs_and_flop_formula():
    """The CPU-side parts of benchmarks/native_gpu_check.py: the 1.72B reference model, the packed documents and
    the FLOP count its MFU uses."""
    bench = _benchmark_module()
    with torch.device("meta"):
        qwen3 = AutoModelForCausalLM.from_config(bench.qwen3_1_7b_config())
    assert bench.matmul_params(qwen3) == 1_720_574_976  # tied embeddings: the LM head matmul counts once
    assert bench.attention_width(qwen3.config) == (28, 2048)
    hybrid = bench.qwen3_5_hybrid_config()
    assert bench.attention_width(hybrid) == (4, 4096)
    lengths = bench.document_lengths(32_768, seed=3)
    assert sum(lengths) == 32_768 and all(n <= bench.DOC_MAX for n in lengths)
    assert all(n >= bench.DOC_MIN for n in lengths[:-1])
    # 6·N·T plus causal attention 6·layers·width·ΣL² (fwd 2·L²·width causal, ×3 for backward).
    assert bench.step_flops(10, 100, 2, 8, [60, 40]) == 6 * 10 * 100 + 6 * 2 * 8 * (60**2 + 40**2)
    batch, docs = bench.packed_batch(8192, 1000, seed=0)
    assert batch["input_ids"].shape == (1, 8192) and batch["cu_seqlens"].tolist()[-1] == 8192
    assert batch["target_ids"].numel() == 8192 - len(docs)  # every token but each document's first


def _saved_bytes(model, batch) -> int:
    """Bytes autograd keeps from forward to backward (what activation checkpointing trades for recompute)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = chunked_loss_sum(model, batch)
    loss.backward()
    return total


def test_recompute_layers_trades_memory_for_exact_gradients():
    """train.recompute_layers: the first k layers recompute; fewer of them keep more, gradients stay the same."""
    from runner.train.apply import enable_recompute

    batch = _batch()
    saved, grads = {}, {}
    for k in (None, 1, 0):
        model = _model(tied=False)
        model.train()
        if k is None or k:
            assert enable_recompute(model, k) == (2 if k is None else k)
        saved[k] = _saved_bytes(model, batch)
        grads[k] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert saved[None] < saved[1] < saved[0]
    for k in (1, 0):
        assert max(_rel(grads[k][n], grads[None][n]) for n in grads[None]) <= GRAD_TOL


def _mm_counting_backend(phase: dict[str, str]):
    """A torch.compile backend that partitions like inductor (min-cut, checkpoint tags honoured) and runs the
    graphs as they are, counting the matmuls executed per phase ("forward" / "backward", set by the caller)."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    executed = {"forward": 0, "backward": 0}

    def compiler(gm, _inputs):
        mms = sum(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes)

        def run(*args):
            executed[phase["now"]] += mms
            return gm(*args)

        return make_boxed_func(run)

    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler,
                           partition_fn=min_cut_rematerialization_partition)
    return backend, executed


def test_recompute_inside_the_compiled_layer_skips_what_backward_does_not_read():
    """train.compile with recompute: each layer's checkpoint region is inside its compiled graph, so backward
    recomputes the projections whose results it reads (q, k, v, o, gate, up) and not down_proj (whose output only
    feeds the residual). Per layer: 7 matmuls forward; backward 2 × 7 for the gradients + 6 recomputed. The
    gradients equal those of a model that keeps every activation."""
    from runner.train.apply import enable_recompute
    from runner.train.model import disable_cache, text_decoder_layers

    batch = _batch()
    kwargs = {k: v for k, v in batch.items() if k in ("position_ids", "labels")}
    ref = _model(tied=False)
    disable_cache(ref)
    ref(input_ids=batch["input_ids"], **kwargs).loss.backward()

    torch._dynamo.reset()
    phase = {"now": "forward"}
    backend, executed = _mm_counting_backend(phase)
    model = _model(tied=False)
    disable_cache(model)
    model.train()
    enable_recompute(model, None, inside_compile=True)
    layers = text_decoder_layers(model)
    for layer in layers:
        layer.compile(backend=backend)
    try:
        loss = model(input_ids=batch["input_ids"], **kwargs).loss
        phase["now"] = "backward"
        loss.backward()
    finally:
        torch._dynamo.reset()
    assert executed == {"forward": 7 * len(layers), "backward": (2 * 7 + 6) * len(layers)}
    worst = max(_rel(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
    assert worst <= GRAD_TOL
