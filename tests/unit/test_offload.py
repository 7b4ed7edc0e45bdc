"""Activation offload (train.offload_activations): the same gradients, the layer inputs in exact-size host buffers.

The CUDA test runs where a GPU is (the device checks of benchmarks/); on CPU the hooks leave tensors where they are,
and the host buffer pool is driven through a stand-in for cudaHostRegister (the one edge that needs a GPU).
"""

from __future__ import annotations

import types

import pytest
import torch

from runner.events.failure import classify_text
from runner.train import offload
from runner.train.offload import HostBuffers, offloaded_checkpoint


def _tiny_qwen3(layers: int = 3):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
    return Qwen3ForCausalLM(cfg)


def _grads(model, ids, offload_on: bool) -> list[torch.Tensor]:
    from runner.train.apply import enable_recompute

    model.zero_grad(set_to_none=True)
    model.train()
    enable_recompute(model, None, offload=offload_on)
    model(input_ids=ids, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_offloaded_checkpoint_is_a_plain_checkpoint_for_cpu_tensors():
    layer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    x = torch.randn(2048, 64, requires_grad=True)  # 512 KiB: below the offload threshold anyway
    big = torch.randn(8192, 64, requires_grad=True)  # 2 MiB, but on the CPU: kept as it is
    for inp in (x, big):
        out = torch.utils.checkpoint.checkpoint(layer, inp, use_reentrant=False).sum()
        ref = torch.autograd.grad(out, [inp, *layer.parameters()])
        out = offloaded_checkpoint(layer, inp, use_reentrant=False).sum()
        got = torch.autograd.grad(out, [inp, *layer.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


@pytest.fixture
def fake_register(monkeypatch):
    """cudaHostRegister stand-in: records what would be page-locked and returns the error code asked for."""
    calls: list[int] = []
    state = {"error": 0}

    def register(ptr, nbytes, flags):
        calls.append(nbytes)
        return state["error"]

    monkeypatch.setattr(torch.cuda, "cudart", lambda: types.SimpleNamespace(cudaHostRegister=register))
    return calls, state


def test_host_buffers_are_exact_size_and_reused(fake_register):
    calls, _ = fake_register
    pool = HostBuffers()
    a, b = pool.take(3 << 20), pool.take(3 << 20)
    assert a.numel() == b.numel() == 3 << 20 and a.data_ptr() != b.data_ptr()
    pool.give(a)
    assert pool.take(3 << 20).data_ptr() == a.data_ptr()  # reused, not registered again
    assert calls == [3 << 20, 3 << 20] and pool.pinned_bytes == 6 << 20  # no power-of-two rounding


def test_host_buffers_refuse_clearly_when_host_memory_runs_out(fake_register, monkeypatch):
    calls, state = fake_register
    monkeypatch.setattr(offload.psutil, "virtual_memory",
                        lambda: types.SimpleNamespace(available=offload.HOST_RESERVE_BYTES + (1 << 20)))
    pool = HostBuffers()
    with pytest.raises(RuntimeError, match="could not page-lock") as e:
        pool.take(2 << 20)
    assert calls == [] and "train.offload_activations=false" in str(e.value)
    assert classify_text(f"RuntimeError: {e.value}")[0] == "host_oom"  # the bench counts it as 'does not fit'
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: types.SimpleNamespace(cudaHostRegister=lambda *a: 2))
    with pytest.raises(RuntimeError, match="cudaHostRegister error 2"):
        HostBuffers().take(1 << 20)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offload_gives_the_same_gradients_on_a_gpu():
    model = _tiny_qwen3().cuda().to(torch.bfloat16)
    ids = torch.randint(0, 512, (1, 4096), device="cuda")
    ref = _grads(model, ids, offload_on=False)
    before = offload.HostOffload.pool.pinned_bytes
    got = _grads(model, ids, offload_on=True)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    # Each recomputed layer's input (1 × 4096 × 256 bf16 = 2 MiB) went to the host, and only that.
    assert offload.HostOffload.pool.pinned_bytes - before == 3 * 4096 * 256 * 2
    again = _grads(model, ids, offload_on=True)  # a second step reuses the buffers
    assert all(torch.equal(a, b) for a, b in zip(ref, again, strict=True))
    assert offload.HostOffload.pool.pinned_bytes - before == 3 * 4096 * 256 * 2


def test_only_the_layers_the_host_holds_offload_their_input():
    """Where the node's host holds fewer layer inputs than recompute, the first ones offload and the others keep
    their input on the GPU under a plain checkpoint, with the same gradients (runner.facts.gpus.offloaded_layers)."""
    from runner.facts.gpus import HOST_RANK_BYTES, HOST_RESERVE_BYTES, offloaded_layers
    from runner.train.apply import enable_recompute

    model = _tiny_qwen3(layers=4)
    ids = torch.randint(0, 512, (1, 256))
    ref = _grads(model, ids, offload_on=False)
    enable_recompute(model, 3, offload=True, offload_layers=2)
    funcs = [getattr(layer._gradient_checkpointing_func, "func", None) for layer in model.model.layers]
    assert funcs[:2] == [offloaded_checkpoint] * 2 and offloaded_checkpoint not in funcs[2:]
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, True, True, False]
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(ref, model.parameters(), strict=True))
    # The split: all that fits beside each rank's own share and the reserve, never more than recompute, never < 0.
    one = 1 << 30
    base = HOST_RESERVE_BYTES + 2 * HOST_RANK_BYTES
    assert offloaded_layers(32, one, 2, base + 2 * 5 * one + one) == 5
    assert offloaded_layers(32, one, 2, base + 2 * 40 * one) == 32
    assert offloaded_layers(32, one, 2, base - one) == 0
    assert offloaded_layers(32, one, 2, None) == 32  # the node's memory unknown: all, as planned off the node
