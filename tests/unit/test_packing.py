"""Packing: block signals, statistics, and the equivalence of a packed block with its documents run one by one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GraniteMoeHybridConfig, Qwen3_5TextConfig, Qwen3Config

from runner.train import attention
from runner.train.attention import install_document_reset, packing_support, reference_varlen_attn, set_varlen_kernel
from runner.train.blocks import PAD_SEGMENT
from runner.train.data import IGNORE, PackStats, collate, make_block, pack
from runner.train.loss import LOSS_FUNCTIONS, chunked_loss_sum, full_loss_sum

# float32 on CPU: a packed block and its documents differ only in summation order. Errors are measured relative
# to each tensor's largest magnitude (elementwise rtol is meaningless for gradients that pass through zero).
LOSS_TOL = 1e-6
GRAD_TOL = 1e-5
# A broken mask must move the result by far more than that.
BROKEN_MIN_REL = 1e-3


# ---------------------------------------------------------------------------------------------
# Block signals


def test_block_signals_restart_per_document_and_mask_segment_starts():
    ids = list(range(10, 20))
    mask = [False, True, True, False, True, True, True, False, True, True]
    block = make_block(ids, mask, starts=[0, 3, 7], seq_len=12, pad_id=0)
    assert block.position_ids.tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 0, 1]
    assert block.cu_seqlens.tolist() == [0, 3, 7, 10, 12]
    assert block.seq_idx.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3]
    assert block.max_len == 4
    # Prompt tokens, every segment's first token and the padding are not targets.
    assert block.labels.tolist() == [IGNORE, 11, 12, IGNORE, 14, 15, 16, IGNORE, 18, 19, IGNORE, IGNORE]
    assert block.target_tokens == 7
    assert block.real_tokens == 10
    assert block.input_ids.tolist()[10:] == [0, 0]


def test_full_block_has_no_padding_segment():
    block = make_block([1, 2, 3, 4], [True] * 4, [0, 2], seq_len=4, pad_id=0)
    assert block.cu_seqlens.tolist() == [0, 2, 4]
    assert block.labels.tolist() == [IGNORE, 2, IGNORE, 4]


def test_long_padding_is_cut_into_segments_of_its_own():
    """A partly filled block's padding attends in PAD_SEGMENT pieces (linear attention work, not its square).
    That such a block trains exactly like its documents one by one is checked for every family, both engines, in
    tests/unit/test_families.py."""
    real, seq_len = 300, 300 + 3 * PAD_SEGMENT + 5
    block = make_block(list(range(1, real + 1)), [True] * real, [0, 200], seq_len=seq_len, pad_id=0)
    pad_bounds = [real + k * PAD_SEGMENT for k in range(4)] + [seq_len]
    assert block.cu_seqlens.tolist() == [0, 200, *pad_bounds]
    assert block.document_segment_lengths() == [200, 100] and block.doc_len_sq == 200**2 + 100**2
    assert block.max_len == 200  # the longest document; no padding segment is longer than PAD_SEGMENT
    assert block.position_ids[real:].tolist() == [*range(PAD_SEGMENT)] * 3 + [0, 1, 2, 3, 4]
    assert block.seq_idx[real:].tolist() == [2] * PAD_SEGMENT + [3] * PAD_SEGMENT + [4] * PAD_SEGMENT + [5] * 5
    assert (block.labels[real:] == IGNORE).all() and block.target_tokens == real - 2
    empty = make_block([], [], [], seq_len=2 * PAD_SEGMENT, pad_id=0)  # a rank's empty block
    assert empty.cu_seqlens.tolist() == [0, PAD_SEGMENT, 2 * PAD_SEGMENT] and empty.document_segment_lengths() == []


def _examples(lengths, trained=True):
    out, base = [], 0
    for n in lengths:
        out.append((list(range(base, base + n)), [trained] * n))
        base += n
    return out


def test_pack_cuts_exact_blocks_and_splits_documents_across_them():
    stats = PackStats()
    blocks = list(pack(_examples([5, 6, 3, 9]), seq_len=8, pad_id=0, stats=stats))
    assert [b.real_tokens for b in blocks] == [8, 8, 7]
    # Document 2 (6 tokens) crosses the first cut, document 4 (9 tokens) crosses the second: two split documents.
    assert stats.split_documents == 2
    assert blocks[0].cu_seqlens.tolist() == [0, 5, 8]
    # The second block starts with the tail of document 2 as its own segment, then document 3, then document 4.
    assert blocks[1].cu_seqlens.tolist() == [0, 3, 6, 8]
    assert blocks[1].input_ids.tolist() == [8, 9, 10, 11, 12, 13, 14, 15]
    assert blocks[2].cu_seqlens.tolist() == [0, 7, 8]
    assert sum(b.examples for b in blocks) == stats.examples == 4
    d = stats.to_dict()
    assert d["blocks"] == 3 and d["real_tokens"] == 23 and d["packing_efficiency"] == round(23 / 24, 4)


def test_a_document_spanning_three_blocks_counts_once():
    stats = PackStats()
    blocks = list(pack(_examples([20]), seq_len=8, pad_id=0, stats=stats))
    assert [b.real_tokens for b in blocks] == [8, 8, 4]
    assert stats.split_documents == 1


def test_document_starting_exactly_at_a_cut_is_not_split():
    stats = PackStats()
    blocks = list(pack(_examples([8, 4]), seq_len=8, pad_id=0, stats=stats))
    assert stats.split_documents == 0
    assert blocks[1].cu_seqlens.tolist() == [0, 4, 8]


def test_examples_without_assistant_tokens_are_skipped_and_counted():
    stats = PackStats()
    examples = _examples([4]) + [([1, 2, 3], [False] * 3)] + _examples([4])
    blocks = list(pack(examples, seq_len=16, pad_id=0, stats=stats))
    assert stats.skipped_no_assistant == 1 and stats.examples == 3
    assert blocks[0].real_tokens == 8


def test_no_packing_gives_one_document_per_block():
    blocks = list(pack(_examples([3, 10]), seq_len=6, pad_id=0, packing=False))
    assert [b.real_tokens for b in blocks] == [3, 6, 4]
    assert all(b.cu_seqlens[1].item() == b.real_tokens for b in blocks)
    assert sum(b.split_documents for b in blocks) == 1


def test_collate_offsets_boundaries_and_targets_of_several_blocks():
    a = make_block([1, 2, 3], [True] * 3, [0], 4, 0)
    b = make_block([4, 5, 6, 7], [True] * 4, [0, 2], 4, 0)
    batch = collate([a, b])
    assert batch["cu_seqlens"].tolist() == [0, 3, 4, 6, 8]
    assert batch["seq_idx"].tolist() == [[0, 0, 0, 1, 2, 2, 3, 3]]
    assert batch["max_len"] == 3
    # target_index t: the label at t + 1 is a target.
    assert batch["target_index"].tolist() == [0, 1, 4, 6]
    assert batch["target_ids"].tolist() == [2, 3, 5, 7]


# ---------------------------------------------------------------------------------------------
# Packed block == its documents one by one


DOC_LENGTHS = (37, 80, 11, 23)
SEQ_LEN = 160  # 151 real tokens + a padding segment


def _qwen3(attn: str = "sdpa") -> torch.nn.Module:
    cfg = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      initializer_range=0.2, tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)


def _qwen3_5(attn: str = "sdpa") -> torch.nn.Module:
    cfg = Qwen3_5TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
                            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                            layer_types=["linear_attention", "full_attention"], max_position_embeddings=512,
                            initializer_range=0.2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)


def _documents():
    g = torch.Generator().manual_seed(1)
    docs = []
    for n in DOC_LENGTHS:
        ids = torch.randint(0, 128, (n,), generator=g).tolist()
        # A prompt then a response, as the SFT mask makes them.
        prompt = n // 3
        docs.append((ids, [False] * prompt + [True] * (n - prompt)))
    return docs


def _packed_batch(docs, **overrides):
    ids = [t for d, _ in docs for t in d]
    mask = [m for _, ms in docs for m in ms]
    starts, pos = [], 0
    for d, _ in docs:
        starts.append(pos)
        pos += len(d)
    batch = collate([make_block(ids, mask, starts, SEQ_LEN, 0)])
    batch.update(overrides)
    return batch


def _loss_and_grads(model, fn):
    model.zero_grad(set_to_none=True)
    loss = fn()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _per_document(model, docs):
    def fn():
        total = 0.0
        for ids, mask in docs:
            block = make_block(ids, mask, [0], len(ids), 0)
            # One document alone: no boundaries to honour, plain positions.
            batch = {"input_ids": block.input_ids[None], "labels": block.labels[None],
                     "position_ids": block.position_ids[None]}
            total = total + full_loss_sum(model, batch)
        return total
    return _loss_and_grads(model, fn)


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _compare(packed, reference):
    (loss_p, grads_p), (loss_r, grads_r) = packed, reference
    assert grads_p.keys() == grads_r.keys()
    loss_err = abs(float(loss_p - loss_r)) / abs(float(loss_r))
    grad_err = max(_max_rel(grads_p[n], grads_r[n]) for n in grads_r)
    return loss_err, grad_err


MEASURED: dict[str, tuple[float, float]] = {}


def _assert_equal(packed, reference, label: str = ""):
    loss_err, grad_err = _compare(packed, reference)
    MEASURED[label] = (loss_err, grad_err)
    print(f"{label}: loss rel err {loss_err:.2e}, grad max rel err {grad_err:.2e}")
    assert loss_err <= LOSS_TOL and grad_err <= GRAD_TOL, (loss_err, grad_err)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("loss", ["full", "chunked", "fused"])
def test_packed_block_equals_documents_one_by_one_qwen3(attn, loss):
    model = _qwen3(attn)
    docs = _documents()
    batch = _packed_batch(docs)
    fn = full_loss_sum if loss == "full" else LOSS_FUNCTIONS[loss]
    packed = _loss_and_grads(model, lambda: fn(model, batch))
    reference = _per_document(model, docs)
    _assert_equal(packed, reference, f"qwen3 {attn} {loss}")


def test_position_ids_not_reset_leak_across_documents():
    model = _qwen3()
    docs = _documents()
    reference = _per_document(model, docs)
    flat = torch.arange(SEQ_LEN)[None]
    broken = _loss_and_grads(model, lambda: full_loss_sum(model, _packed_batch(docs, position_ids=flat)))
    loss_err, grad_err = _compare(broken, reference)
    assert grad_err > BROKEN_MIN_REL, (loss_err, grad_err)


def test_labels_kept_at_segment_starts_change_the_loss():
    model = _qwen3()
    docs = _documents()
    reference = _per_document(model, docs)
    batch = _packed_batch(docs)
    labels = batch["labels"].clone()
    starts = batch["cu_seqlens"][1:-2].long()  # the interior document starts
    labels[0, starts] = batch["input_ids"][0, starts]
    batch = {**batch, "labels": labels}
    batch.pop("target_index")
    batch.pop("target_ids")
    broken = _loss_and_grads(model, lambda: full_loss_sum(model, batch))
    loss_err, grad_err = _compare(broken, reference)
    assert loss_err > BROKEN_MIN_REL and grad_err > BROKEN_MIN_REL, (loss_err, grad_err)


@pytest.fixture
def reference_varlen():
    set_varlen_kernel(reference_varlen_attn)
    attention.register_varlen()
    yield
    set_varlen_kernel(None)


def test_varlen_attention_function_keeps_documents_apart_and_merged_cu_seqlens_do_not(reference_varlen):
    model = _qwen3("varlen")
    docs = _documents()
    reference = _per_document(_qwen3("sdpa"), docs)
    packed = _loss_and_grads(model, lambda: chunked_loss_sum(model, _packed_batch(docs)))
    _assert_equal(packed, reference, "qwen3 varlen")
    merged = torch.tensor([0, SEQ_LEN], dtype=torch.int32)
    broken = _loss_and_grads(model, lambda: chunked_loss_sum(
        model, _packed_batch(docs, cu_seqlens=merged, max_len=SEQ_LEN)))
    assert _compare(broken, reference)[1] > BROKEN_MIN_REL


def test_hybrid_gated_delta_without_document_reset_is_contaminated():
    """transformers' PyTorch path for gated-delta layers ignores document boundaries given as position_ids
    (5.24 refuses cu_seqlens / seq_idx outright); without the per-document reset packing is not exact."""
    model = _qwen3_5()
    docs = _documents()
    reference = _per_document(model, docs)
    batch = _packed_batch(docs)
    if not all(attention.gated_delta_kernels().values()):
        with pytest.raises(ValueError, match="keep packed sequences apart"):
            full_loss_sum(model, batch)
    positions_only = {k: v for k, v in batch.items() if k not in ("cu_seqlens", "seq_idx")}
    contaminated = _loss_and_grads(model, lambda: full_loss_sum(model, positions_only))
    assert _compare(contaminated, reference)[1] > BROKEN_MIN_REL


@pytest.mark.parametrize("loss", ["full", "chunked", "fused"])
def test_hybrid_gated_delta_with_document_reset_equals_documents_one_by_one(loss):
    model = _qwen3_5()
    assert "per-document" in install_document_reset(model) or all(attention.gated_delta_kernels().values())
    docs = _documents()
    batch = _packed_batch(docs)
    fn = full_loss_sum if loss == "full" else LOSS_FUNCTIONS[loss]
    packed = _loss_and_grads(model, lambda: fn(model, batch))
    reference = _per_document(model, docs)
    _assert_equal(packed, reference, f"qwen3_5 hybrid {loss}")


def test_hybrid_recomputed_inside_compiled_layers_equals_documents_one_by_one():
    """train.compile with recompute on a hybrid model: the per-document path of its gated-delta layers breaks the
    compiled graph inside each checkpoint region (runner.train.apply.checkpoint_in_compile); packing stays exact.
    aot_eager runs the traced graphs eagerly, so the comparison holds to the same tolerance as uncompiled."""
    from runner.train.apply import enable_recompute
    from runner.train.model import text_decoder_layers

    model = _qwen3_5()
    install_document_reset(model)
    docs = _documents()
    reference = _per_document(model, docs)
    enable_recompute(model, None, inside_compile=True)
    for layer in text_decoder_layers(model):
        layer.compile(backend="aot_eager")
    try:
        packed = _loss_and_grads(model, lambda: LOSS_FUNCTIONS["fused"](model, _packed_batch(docs)))
    finally:
        torch._dynamo.reset()
    _assert_equal(packed, reference, "qwen3_5 hybrid recomputed inside compiled layers")


def test_packing_refused_where_no_kernel_keeps_documents_apart(monkeypatch):
    assert packing_support(Qwen3Config()).safe
    hybrid = Qwen3_5TextConfig(layer_types=["linear_attention", "full_attention"], num_hidden_layers=2)
    assert packing_support(hybrid).safe
    # Without the kernels, without the own per-document path (runner.train.gated_delta reads the Qwen3.5 layout) and
    # without a PyTorch path that can be wrapped, the hybrid cannot pack.
    monkeypatch.setattr(attention, "_own_layout", lambda module: False)
    monkeypatch.setattr(attention, "_patch_targets", lambda module: None)
    monkeypatch.setattr(attention, "gated_delta_kernels", lambda: {"flash-linear-attention": False,
                                                                    "causal-conv1d": False})
    refused = packing_support(hybrid)
    assert not refused.safe and "flash-linear-attention" in refused.fix and "train.packing=false" in refused.fix
    # Recurrent layers of other families (Granite's Mamba layers, typed "linear_attention" too) have no
    # per-document path at all.
    mamba = packing_support(GraniteMoeHybridConfig(num_hidden_layers=2))
    assert not mamba.safe and "granitemoehybrid" in mamba.reason and "train.packing=false" in mamba.fix


# ---------------------------------------------------------------------------------------------
# Streaming shards


def _stream_source(tmp_path, rows: int, epochs):
    import json as _json

    from runner.train.data import DataSource

    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(_json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                                        {"role": "assistant", "content": f"answer {i}"}]})
                              for i in range(rows)) + "\n")
    return DataSource(path=data, dataset_id=None, revision=None, split="train", messages_field="messages",
                      seq_len=64, pad_id=0, packing=True, seed=0, epochs=epochs)


@pytest.fixture(scope="module")
def tokenizer():
    from pathlib import Path

    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[2] / "recipes" / "embedded" / "tokenizer")


def _answers(blocks, tok) -> list[str]:
    text = tok.decode(torch.cat([b.input_ids[: b.real_tokens] for b in blocks]))
    return sorted(t.split("<|im_end|>")[0] for t in text.split("answer ")[1:])


@pytest.mark.launches
def test_rank_and_worker_streams_are_disjoint_and_cover_the_data(tmp_path, tokenizer):
    from torch.utils.data import DataLoader

    from runner.train.data import BlockStream

    source = _stream_source(tmp_path, rows=41, epochs=1)
    seen: list[str] = []
    for rank in (0, 1):
        loader = DataLoader(BlockStream(source, tokenizer, rank, 2), batch_size=None, num_workers=2)
        blocks = list(loader)
        assert sum(b.examples for b in blocks) in (20, 21)
        seen += _answers(blocks, tokenizer)
    assert sorted(seen) == sorted(str(i) for i in range(41))


def test_a_fractional_epoch_stops_part_way_through_the_shard(tmp_path, tokenizer):
    from runner.train.data import BlockStream

    blocks = list(BlockStream(_stream_source(tmp_path, rows=40, epochs=1.5), tokenizer, 0, 1))
    assert sum(b.examples for b in blocks) == 60
