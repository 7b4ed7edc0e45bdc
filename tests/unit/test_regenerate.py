"""Layer inputs regenerated in backward (runner.train.regenerate): the same loss and gradients as layers that keep
their input, dropout and odd layouts included; where they go (runner.facts.gpus.layer_input_places); what the
estimator counts."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from runner.facts.gpus import HOSTED, ON_GPU, REGENERATED, SOURCE, layer_input_places, regenerated_layers
from runner.train.data import collate
from runner.train.loss import full_loss_sum
from runner.train.apply import enable_recompute
from runner.train.model import text_decoder_layers
from runner.train.tiling import tile_layers
from tests.families import family_config
from tests.unit.test_families import _documents, _grads, _packed_block


def test_pairs_first_then_hosted_inputs_then_the_gpu():
    assert layer_input_places(6, 6, regenerated_layers(6, 6, True)) == [HOSTED] * 6
    assert layer_input_places(6, 2, regenerated_layers(6, 2, True)) == [SOURCE, REGENERATED] * 2 + [ON_GPU] * 2
    assert layer_input_places(6, 4, regenerated_layers(6, 4, True)) == [SOURCE, REGENERATED] * 2 + [HOSTED] * 2
    assert layer_input_places(5, 0, regenerated_layers(5, 0, True)) == [ON_GPU] * 5
    assert layer_input_places(4, 2, regenerated_layers(4, 2, False)) == [HOSTED] * 2 + [ON_GPU] * 2  # compiled


def _model(layers: int, dropout: float = 0.0) -> torch.nn.Module:
    config = family_config("qwen3")
    config.num_hidden_layers = layers
    config.layer_types = ["full_attention"] * layers
    config.attention_dropout = dropout
    config.initializer_range = 0.2
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager" if dropout else "sdpa",
                                            dtype=torch.float32)


def _recomputed(model: torch.nn.Module, kept: int | None, tile: int | None = None) -> torch.nn.Module:
    """A copy whose layers all recompute (in tiles of `tile` tokens, runner.train.tiling); with `kept`, only that
    many keep their input and as many after them as there are regenerate it (the rest keep theirs too: without
    offload every kept input stays where it is)."""
    copied = copy.deepcopy(model)
    if tile:
        tile_layers(text_decoder_layers(copied), tile)
    copied.train()
    enable_recompute(copied, None, offload_layers=kept, regenerate=kept is not None)
    return copied


def _counting_regenerations(monkeypatch, run):
    """run()'s result and how many layer inputs were regenerated while it ran."""
    from runner.train import regenerate

    seen: list[bool] = []
    original = regenerate._regenerate
    monkeypatch.setattr(regenerate, "_regenerate",
                        lambda p: seen.append(isinstance(p, regenerate._Regenerated)) or original(p))
    result = run()
    monkeypatch.setattr(regenerate, "_regenerate", original)
    return result, sum(seen)


@pytest.mark.parametrize("layers, kept, tile", [(4, 2, None), (4, 1, None), (5, 3, None), (4, 2, 37)])
def test_regenerated_inputs_give_the_kept_inputs_loss_and_gradients_bit_for_bit(layers, kept, tile, monkeypatch):
    """Tiled layers too: their norms and MLP run in the same tiles without gradients as with them."""
    model = _model(layers)
    batch = collate([_packed_block(_documents(model.get_input_embeddings().weight.shape[0]))])
    plain = _recomputed(model, None, tile)
    reference = _grads(plain, lambda: full_loss_sum(plain, batch))
    paired = _recomputed(model, kept, tile)
    (loss, grads), regenerated = _counting_regenerations(monkeypatch, lambda: _grads(
        paired, lambda: full_loss_sum(paired, batch)))
    assert regenerated == min(kept, layers - kept)
    assert torch.equal(loss, reference[0])
    assert grads.keys() == reference[1].keys() and all(torch.equal(grads[n], reference[1][n]) for n in grads)


def test_a_regenerated_input_replays_the_first_forward_s_dropout():
    model = _model(2, dropout=0.3)
    batch = collate([_packed_block(_documents(model.get_input_embeddings().weight.shape[0]))])
    plain = _recomputed(model, None)
    torch.manual_seed(5)
    reference = _grads(plain, lambda: full_loss_sum(plain, batch))
    paired = _recomputed(model, 1)
    torch.manual_seed(5)
    loss, grads = _grads(paired, lambda: full_loss_sum(paired, batch))
    assert torch.equal(loss, reference[0])
    assert all(torch.equal(grads[n], reference[1][n]) for n in grads)
    torch.manual_seed(6)  # and the dropout does move the result: the check above could fail
    assert not torch.equal(_grads(plain, lambda: full_loss_sum(plain, batch))[0], reference[0])


def test_the_regenerating_forward_skips_module_hooks_whichever_way_transformers_checkpoints():
    """transformers ≥ 5.2x checkpoints a layer's `forward` (module hooks outside); earlier releases checkpoint
    `nn.Module.__call__` (hooks inside): the regeneration calls the layer's forward either way, so FSDP2's hooks
    never run in the middle of a backward (it asks for the unshard itself)."""
    import functools

    from runner.train.regenerate import _hookless

    layer = torch.nn.Linear(4, 4)
    calls: list[str] = []
    layer.register_forward_pre_hook(lambda *_: calls.append("hook"))
    x = torch.randn(2, 4)
    older = functools.partial(torch.nn.Module.__call__.__get__(layer))
    newer = functools.partial(type(layer).forward, layer)
    for function in (older, newer):
        assert torch.equal(_hookless(layer, function)(x), layer.forward(x))
    assert calls == []
    older(x)  # the older form itself runs the hooks
    assert calls == ["hook"]


def test_a_regenerated_input_is_not_held_to_its_backward():
    """Live bytes that grow with the block (benchmarks/activation_peak_cpu.py's tracker), 4 tiled bf16 layers of the
    Qwen3-4B layout at an eighth of its widths, 2,048 tokens: with the inputs of layers 1 and 3 regenerated the
    peak is at least one layer input under the plain one's (the regeneration's own forward is under the recompute
    that follows it). It once was one over: the checkpoint's pack hook, which autograd keeps with the saved tensor,
    held the input it was meant to drop."""
    from transformers import AutoConfig

    from tests.unit.test_tiled_mlp import EIGHTH, _live_bytes

    config = AutoConfig.for_model("qwen3", num_hidden_layers=4, vocab_size=128, use_cache=False, **EIGHTH["qwen3"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    tile_layers(text_decoder_layers(model), config.hidden_size)
    tokens = 2048
    ids = torch.randint(3, 128, (1, tokens))
    peaks = {}
    for kept in (None, 2):
        copied = copy.deepcopy(model).train()
        enable_recompute(copied, None, offload_layers=kept, regenerate=kept is not None)
        mode = _live_bytes()(tokens)
        with mode:
            copied(input_ids=ids, labels=ids).loss.backward()
        peaks[kept] = mode.peak
    layer_input = 2 * config.hidden_size * tokens
    assert peaks[None] - peaks[2] >= layer_input, (peaks, layer_input)


def test_an_input_the_model_changed_after_the_layer_before_is_kept(monkeypatch):
    """Only the layer before's own output can be computed again from its input: where something between the two
    layers makes a new tensor of it (a forward pre-hook here), the input is kept, and the result stays exact."""
    model = _model(2)
    text_decoder_layers(model)[1].register_forward_pre_hook(lambda _, args: (args[0] * 1.5, *args[1:]))
    batch = collate([_packed_block(_documents(model.get_input_embeddings().weight.shape[0]))])
    plain = _recomputed(model, None)
    reference = _grads(plain, lambda: full_loss_sum(plain, batch))
    paired = _recomputed(model, 1)
    (loss, grads), regenerated = _counting_regenerations(monkeypatch, lambda: _grads(
        paired, lambda: full_loss_sum(paired, batch)))
    assert regenerated == 0
    assert torch.equal(loss, reference[0]) and all(torch.equal(grads[n], reference[1][n]) for n in grads)


@pytest.mark.parametrize("model_type", ["olmo2", "glm4_moe", "gemma2", "granitemoe", "llama4_text", "cohere2"])
def test_regeneration_is_exact_on_layouts_the_registry_does_not_list(model_type, monkeypatch):
    """transformers' own default configs, shrunk as the packing check shrinks them: the second layer's input
    regenerated from the first's gives the kept input's loss and gradients bit for bit (sandwich norms, MoE blocks,
    tuple-returning layers, Llama 4's no-rope layers, Cohere's parallel blocks)."""
    from transformers import AutoConfig

    from runner.gate.shrink import shrunk_config
    from runner.train.model import expose_backbone

    config = shrunk_config(AutoConfig.for_model(model_type), 512, 80)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    expose_backbone(model)
    ids = torch.randint(3, 200, (1, 96))

    def step(m):
        return _grads(m, lambda: m(input_ids=ids, labels=ids, use_cache=False).loss)

    reference = step(_recomputed(model, None))
    paired = _recomputed(model, 1)
    (loss, grads), regenerated = _counting_regenerations(monkeypatch, lambda: step(paired))
    assert regenerated == 1
    assert torch.equal(loss, reference[0]) and all(torch.equal(grads[n], reference[1][n]) for n in grads)
