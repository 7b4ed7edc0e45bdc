"""Tiled MLP (train.tiled_mlp): exact against the plain MLP for every family of the matrix, both methods, with and
without activation checkpointing; the choice of `auto`; the estimator's accounting of tiles."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from runner.facts.catalog import parse_arch
from runner.decide.rules import Kernels, choose_attention, choose_loss
from runner.facts.families import MATRIX
from runner.facts.tiling import mlp_tile_tokens, tiled_mlp_choice
from runner.train.attention import concrete_model_class, keep_documents_apart, supported_attention
from runner.train.data import collate
from runner.train.loss import LOSS_FUNCTIONS, full_loss_sum
from runner.train.apply import enable_recompute
from runner.train.model import text_decoder_layers
from runner.train.tiling import is_rms_norm, layer_mlp, recompute_outer_norms, tile_layers
from tests.conftest import run_cli
from tests.families import family_config
from tests.unit.test_families import SEQ_LEN, _assert_same, _documents, _grads, _model, _packed_block

TILE = 37  # uneven: the block's last tile is shorter


def _full_model(name: str) -> tuple[torch.nn.Module, str]:
    """The family's model for a full fine-tune, its attention and packing as the engines prepare them on CPU."""
    config = family_config(name)
    supported = supported_attention(concrete_model_class(AutoModelForCausalLM, config))
    attn = choose_attention("auto", "cpu", SEQ_LEN, supported, config, Kernels.assumed("cpu")).impl
    torch.manual_seed(0)
    config.initializer_range = 0.2
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    keep_documents_apart(model, True, torch.float32)
    return model, choose_loss("native", "auto", config)[0]


def _tiled(model: torch.nn.Module, recompute: bool) -> tuple[torch.nn.Module, list[int]]:
    """A copy with tiled MLPs (and checkpointed layers), and a list that grows by one per tile run."""
    tiled = copy.deepcopy(model)
    layers = text_decoder_layers(tiled)
    calls: list[int] = []
    for layer in layers:
        mlp = layer_mlp(layer)
        mlp.register_forward_hook(lambda *_: None)  # a hook on the module must not stop the tiling
        forward = mlp.forward

        def counted(x, _f=forward):
            calls.append(x.shape[-2])
            return _f(x)

        mlp.forward = counted
    assert tile_layers(layers, TILE) == len(layers)
    # and the layers' RMSNorms recomputed in backward (at least the two around attention), and the final norm, so
    # the comparisons below cover them too
    assert all(sum(is_rms_norm(m) for m in layer.modules()) >= 2 for layer in layers)
    assert recompute_outer_norms(tiled, layers, TILE) >= 1
    if recompute:
        tiled.train()
        enable_recompute(tiled, None)
    return tiled, calls


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("name", MATRIX)
def test_tiled_mlp_gives_the_plain_loss_and_gradients(name, method):
    model, loss_impl = _full_model(name) if method == "full" else _model(name)[::2]
    batch = collate([_packed_block(_documents(model.get_input_embeddings().weight.shape[0]))])
    fn = full_loss_sum if loss_impl == "full" else LOSS_FUNCTIONS[loss_impl]
    reference = _grads(model, lambda: fn(model, batch))
    assert reference[1], "nothing trained"
    layers = len(text_decoder_layers(model))
    tiles = -(-SEQ_LEN // TILE)
    # With checkpointing (the tiles run again in the layer's recompute): a dense family, a tuple-returning MoE, a
    # hybrid and a latent-attention MoE, and LoRA on the dense one; the others only untiled-vs-tiled, to keep this short.
    checkpointed = {"llama", "gpt_oss", "qwen3_next", "deepseek_v3"} if method == "full" else {"llama"}
    for recompute in (False, True) if name in checkpointed else (False,):
        tiled, calls = _tiled(model, recompute)
        result = _grads(tiled, lambda m=tiled: fn(m, batch))
        _assert_same(result, reference, f"{name} {method} tiled, checkpointing={recompute}")
        # Each tile ran in forward (twice with checkpointing: forward and its recompute) and once in backward.
        assert set(calls) <= {TILE, SEQ_LEN % TILE} and len(calls) == layers * tiles * (3 if recompute else 2), \
            (name, calls)


def test_auto_tiles_long_gpu_blocks_of_mlp_heavy_models_only():
    llama = parse_arch(family_config("llama").to_dict())  # intermediate 128 = 2 × hidden, 4 heads of 16
    assert mlp_tile_tokens(llama, 10_000) == llama.hidden and mlp_tile_tokens(llama, 10) == 10
    gpu = 4 * 2 * 128 * 4096 * 16 - 1  # one layer's MLP intermediates at 4,096 tokens: just over 1/16 of it
    on = tiled_mlp_choice("auto", "native", "cuda", llama, 4096, gpu)
    assert on.on and on.tile_tokens == 64 and "on (auto)" in on.reason, on
    assert not tiled_mlp_choice("auto", "native", "cuda", llama, 4096, gpu + 2).on  # a short block: no gain
    assert not tiled_mlp_choice("auto", "native", "cpu", llama, 4096).on  # CPU recipes keep their exact curves
    assert not tiled_mlp_choice("auto", "trl", "cuda", llama, 4096, gpu).on
    assert not tiled_mlp_choice("auto", "native", "cuda", llama, 4096, gpu, compile_layers=True).on
    narrow = parse_arch({**family_config("llama").to_dict(), "intermediate_size": 16})
    assert not tiled_mlp_choice("auto", "native", "cuda", narrow, 4096, 1.0).on  # attention keeps more than the MLP
    assert tiled_mlp_choice(True, "native", "cpu", llama, 4096).on
    assert not tiled_mlp_choice(False, "native", "cuda", llama, 4096, 1.0).on


@pytest.mark.parametrize("setting, fix", [("engine=trl", "use engine=native"),
                                          ("train.compile=true", "set train.compile=false")])
def test_a_tiled_mlp_it_cannot_run_is_refused_before_launch(tmp_path, capsys, setting, fix):
    code, out, err = run_cli(["run", "tiny-cpu", "--set", "train.tiled_mlp=true", "--set", setting,
                              "--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")], capsys)
    text = out + err
    assert code == 2 and "train.tiled_mlp" in text and fix in text and "Traceback" not in text, text
    assert not (tmp_path / "runs").exists()


def _saved_bytes(model: torch.nn.Module, batch: dict) -> int:
    """Bytes of the distinct tensors autograd keeps from a forward (the loss included) for backward, the weights
    (kept by reference, not activations) left out."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        full_loss_sum(model, batch)
    return sum(seen.values())


def test_the_estimator_counts_what_tiling_takes_off_the_saved_activations():
    """The embedded model on CPU (Qwen3: q/k norms too): tiling takes off exactly what the estimator counts per
    layer and token: the MLP intermediates, and what the recomputed RMSNorms no longer keep (their normalised copy),
    besides each norm's fp32 reciprocal root per row, which the estimator leaves out (4 bytes a row)."""
    from runner.plan import layer_activation_bytes
    from runner.spec import load_spec
    from runner.train.model import load_model

    spec = load_spec("tiny-cpu")
    model = load_model(spec, "sdpa")
    arch = parse_arch(model.config.to_dict())
    tokens = 300
    ids = torch.randint(3, arch.vocab, (1, tokens))
    batch = {"input_ids": ids, "labels": ids, "position_ids": torch.arange(tokens)[None]}
    plain = _saved_bytes(model, batch)
    layers = text_decoder_layers(model)
    tile_layers(layers, mlp_tile_tokens(arch, tokens))
    tiled = _saved_bytes(model, batch)
    counted = sum(layer_activation_bytes(arch, i, "sdpa", 4, tokens) -
                  layer_activation_bytes(arch, i, "sdpa", 4, tokens, tiled=True)
                  for i in range(arch.layers)) * tokens
    rows = sum(tokens * (arch.heads if m is layer.self_attn.q_norm else arch.kv_heads
                         if m is layer.self_attn.k_norm else 1)
               for layer in layers for m in layer.modules() if is_rms_norm(m))
    assert plain - tiled == counted + 4 * rows, (plain, tiled, counted, rows)


def test_the_estimator_tiles_long_gpu_blocks_and_keeps_on_the_gpu_what_the_host_cannot_hold(monkeypatch):
    """Qwen3-4B layout on one H200 at 425,984 tokens, every layer recomputed and offloaded (the committed limit run):
    auto tiles there, which frees GPU memory. On a node with 64 GiB of host memory the first 25 layers' inputs
    (2.03 GiB each) go to the host and the other 11 regenerate theirs in backward, as the engine splits them; with
    40 GiB 14 go, 14 regenerate and 8 stay on the GPU, which holds them; with 12 GiB none can go, the GPU cannot
    hold all 36, and the estimate says host memory is why."""
    import psutil

    from runner.plan import estimate
    from runner.spec import load_spec
    from runner.decide import decide_run
    from runner.plan.autotune import resolve_levers

    n = 425984
    sets = ["train.compile=false", "train.recompute_layers=null", "train.offload_activations=true",
            "train.activation_checkpointing=true", f"train.seq_len={n}"]
    one = 2 * 2560 * n / 2**30
    tiled, plain = (estimate(load_spec("qwen3-4b-bench-h200", [*sets, f"train.tiled_mlp={t}"]), suggest=False)
                    for t in ("auto", "false"))
    assert "tiled MLP: tiles of 2,560 tokens" in tiled.approximate_reason
    assert tiled.per_gpu_allocated_gib < plain.per_gpu_allocated_gib - 20  # 4 × 9,728 × 2 B a token, and more
    assert tiled.host_memory_gib is None  # planned off the node: its host memory is not this machine's
    assert tiled.host_offload_gib == pytest.approx(36 * one, rel=1e-3)

    def node(gib: float) -> None:
        monkeypatch.setattr("runner.facts.gpus.detect_gpu", lambda: ("H200", 1))
        monkeypatch.setattr(psutil, "virtual_memory", lambda: type("vm", (), {"total": gib * 2**30})())

    node(64)
    split = estimate(load_spec("qwen3-4b-bench-h200", sets), suggest=False)
    assert split.host_memory_gib == 64.0 and split.host_offload_gib == pytest.approx(25 * one, rel=1e-3)
    assert "25 of 36 recomputed layers' inputs, all the node's host holds: 11 more regenerated in backward from " \
           "the layer before's)" in split.approximate_reason
    assert split.fits and split.per_gpu_gib == pytest.approx(tiled.per_gpu_gib, abs=0.01)
    decided = decide_run(resolve_levers(load_spec("qwen3-4b-bench-h200", sets)))  # what the ranks are given
    assert (decided.offloaded_layers, decided.regenerated_layers) == (25, 11)  # the estimate's split
    assert [layer.input for layer in decided.layers[:2]] == ["source", "regenerated"]
    node(40)  # 14 hosted, as many regenerated, 8 on the GPU
    fewer = estimate(load_spec("qwen3-4b-bench-h200", sets), suggest=False)
    assert "14 of 36 recomputed layers' inputs, all the node's host holds: 14 more regenerated in backward from " \
           "the layer before's; the other 8 stay on the GPU" in fewer.approximate_reason
    assert fewer.fits and tiled.per_gpu_gib + 5 < fewer.per_gpu_gib <= tiled.per_gpu_gib + 8 * one + 0.01
    node(12)
    short = estimate(load_spec("qwen3-4b-bench-h200", sets), suggest=False)
    assert not short.fits and short.verdict == "does not fit" and short.host_offload_gib == 0
    assert "host memory is the limit: 12.0 GiB cannot hold one layer's input" in short.approximate_reason
    assert "hardware.host_memory_gib states" in short.approximate_reason
    # Where the GPU could not hold the block even with every input on the host, the host is short too, not the limit.
    longer = estimate(load_spec("qwen3-4b-bench-h200", [*sets[:-1], "train.seq_len=1048576"]), suggest=False)
    assert not longer.fits and "host memory is short too: " in longer.approximate_reason
    assert "host memory is the limit" not in longer.approximate_reason
    # A VM whose memory grows as it is used reports too little at first: the node's stated memory wins, on the
    # node and off it.
    stated = estimate(load_spec("qwen3-4b-bench-h200", [*sets, "hardware.host_memory_gib=128"]), suggest=False)
    assert stated.fits and stated.host_memory_gib == 128.0 and stated.host_offload_gib == tiled.host_offload_gib
    monkeypatch.setattr("runner.facts.gpus.detect_gpu", lambda: None)
    small = estimate(load_spec("qwen3-4b-bench-h200", [*sets, "hardware.host_memory_gib=64"]), suggest=False)
    assert small.host_memory_gib == 64.0 and small.host_offload_gib == split.host_offload_gib
    assert "states" not in small.approximate_reason


@pytest.mark.parametrize("model_type", ["olmo2", "exaone4", "glm4_moe", "gemma2", "granitemoe", "llama4_text"])
def test_tiling_is_exact_on_layouts_the_registry_does_not_list(model_type):
    """Families the matrix does not hold, from transformers' own default configs (shrunk as the packing check
    shrinks them), their layers recomputed: the tiled MLPs and recomputed RMSNorms (q/k norms over whole projections
    in olmo2, sandwich norms in gemma2, MoE blocks in glm4_moe, and under other names in granitemoe,
    `block_sparse_moe`, and Llama 4, `feed_forward`), and their final norms, give the plain loss and gradients."""
    from transformers import AutoConfig

    from runner.gate.shrink import shrunk_config
    from runner.train.model import expose_backbone

    config = shrunk_config(AutoConfig.for_model(model_type), 512, 80)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).train()
    expose_backbone(model)
    ids = torch.randint(3, 200, (1, 96))
    reference = _grads(model, lambda: model(input_ids=ids, labels=ids, use_cache=False).loss)
    tiled, calls = _tiled(model, recompute=True)
    result = _grads(tiled, lambda: tiled(input_ids=ids, labels=ids, use_cache=False).loss)
    _assert_same(result, reference, f"{model_type} tiled")
    assert calls, model_type


def _live_bytes() -> type:
    """benchmarks/activation_peak_cpu.py's LiveBytes: the storages ops make and free, and their peak."""
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("activation_peak_cpu", REPO / "benchmarks" / "activation_peak_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LiveBytes


# The Llama-3.1-8B and Qwen3-4B layouts with every width an eighth (head size kept): what a token costs scales with
# the widths, and their ratios (query width over hidden, MLP over hidden) are the models'.
EIGHTH = {"llama": dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                        intermediate_size=1792),
          "qwen3": dict(hidden_size=320, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                        intermediate_size=1216)}


def _layer_peak(model_type: str, tiled: bool, tokens: int) -> int:
    from transformers import AutoConfig
    from torch.utils.checkpoint import checkpoint

    config = AutoConfig.for_model(model_type, num_hidden_layers=1, vocab_size=128, **EIGHTH[model_type])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    layer = model.model.layers[0]
    if tiled:
        tile_layers([layer], config.hidden_size)
    x = torch.randn(1, tokens, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(tokens)[None]
    with torch.no_grad():
        rotary = model.model.rotary_emb(x, positions)
    grad = torch.randn_like(x)

    def forward(h: torch.Tensor) -> torch.Tensor:
        out = layer(h, position_embeddings=rotary, attention_mask=None, position_ids=positions)
        return out[0] if isinstance(out, tuple) else out

    mode = _live_bytes()()
    with mode:
        checkpoint(forward, x, use_reentrant=False).backward(grad)
    return mode.peak


@pytest.mark.parametrize("tiled", [False, True], ids=["plain", "tiled"])
@pytest.mark.parametrize("model_type", sorted(EIGHTH))
def test_a_recomputed_layers_backward_peak_is_what_the_estimator_counts(model_type, tiled):
    """One recomputed decoder layer in bf16, its input back (as from host memory) and its output's gradient in:
    the peak of live bytes per token (the slope over two block lengths, so the weights drop out) against the
    estimator's count for the layer at its backward (its tensors, the backward's transients, its input and the
    output its caller holds), at most 12% over and never under. Tiled, the RMSNorms' fp32 backward is a tile's:
    recomputed whole, Qwen3's q norm (over every query head) held six fp32 copies of q at once, the peak."""
    from runner.plan.activations import backward_transient_bytes, layer_activation_bytes
    from transformers import AutoConfig

    measured = (_layer_peak(model_type, tiled, 2048) - _layer_peak(model_type, tiled, 1024)) / 1024
    arch = parse_arch(AutoConfig.for_model(model_type, **EIGHTH[model_type]).to_dict())
    # CPU SDPA without a mask keeps what a varlen kernel keeps: q, k, v, the output and the log-sum-exp. Besides
    # the layer: its input (which a tiled layer's recomputed norm keeps, counted in the layer) and the output
    # this harness holds.
    counted = layer_activation_bytes(arch, 0, "varlen", 2, 2048, tiled=tiled) \
        + backward_transient_bytes(arch, 2, tiled) + 2 * arch.hidden * (1 if tiled else 2)
    assert measured <= counted <= 1.12 * measured, (measured, counted)



def test_a_tiled_layers_attention_backward_counts_the_flash_kernels_workspace():
    """torch's varlen kernel (FlashAttention-2) allocates, in a layer's backward, dq in fp32 and, with grouped KV
    heads, k and v gradients for every query head: 8 bytes × q_dim a token for Qwen3-4B (32 query heads, 8 KV),
    4 for a layout without grouped heads. On an H100 the 4B's tiled layers ran out of memory asking for exactly
    these; the estimate counts them for the kernel that allocates them only."""
    from runner.plan import estimate
    from runner.plan.activations import backward_transient_bytes, flash_backward_workspace_bytes
    from runner.spec import load_spec

    arch = parse_arch({"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936})
    assert flash_backward_workspace_bytes(arch) == 8 * 4096
    mha = parse_arch({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 2,
                      "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 512})
    assert flash_backward_workspace_bytes(mha) == 4 * 2048
    assert backward_transient_bytes(arch, 2, True, 8 * 4096) - backward_transient_bytes(arch, 2, True) == 8 * 4096
    n = 262144
    sets = ["train.compile=false", "train.recompute_layers=null", "train.activation_checkpointing=true",
            "train.offload_activations=true", "train.tiled_mlp=true", f"train.seq_len={n}", "hardware.gpu=H100-80GB"]
    torch_k, fa4 = (estimate(load_spec("qwen3-4b-bench-h200", [*sets, f"model.varlen_kernel={k}"]), suggest=False)
                    for k in ("torch", "flash-attn-4"))
    assert torch_k.attn_implementation == fa4.attn_implementation == "varlen"
    # At this length the layers attend in KV-head groups (runner.facts.tiling.attention_head_groups): the kernel's
    # workspace is one group's of 8.
    assert torch_k.per_gpu_allocated_gib - fa4.per_gpu_allocated_gib == pytest.approx(4096 * n / 2**30, abs=0.05)
