"""Layer inputs regenerated in backward, where the host cannot hold every recomputed layer's input.

A recomputed decoder layer keeps one tensor from forward to backward, its input (runner.train.offload sends it to
page-locked host memory). When the node's host holds fewer of them than there are layers, the rest would stay on
the GPU: 2 bytes × hidden a token each, 5 GiB per layer at a million tokens of a 4B layout. Instead, the layers run
in pairs: the first's input waits in host memory (`source_checkpoint`), and the second keeps nothing; at the start
of its backward its input is computed again from the first's, by the first layer's forward without gradients
(`regenerated_checkpoint`). Its backward then runs as if the input had been kept: the same values, for one more
forward of the first layer (runner.facts.gpus.regenerated_layers decides how many pairs; the estimator counts the
same).

The forward is the layer's own, without module hooks (FSDP2's unshard is asked for directly), with the random
state and autocast of the first forward, so dropout and mixed precision give the same input again.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from runner.train.offload import HostOffload


class _Source:
    """What regenerates the next layer's input: this layer, its forward's arguments, its saved input (a tensor, or
    host memory), and the random and autocast state its forward ran under."""

    __slots__ = ("autocast", "forward", "layer", "output", "packed", "rng", "unpack")

    def __init__(self, layer: torch.nn.Module, forward: Any, packed: Any, unpack: Any, device: torch.device) -> None:
        self.layer, self.forward, self.packed, self.unpack = layer, forward, packed, unpack
        self.output: weakref.ref | None = None  # the hidden states the layer returned, once it has
        self.rng = (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)
        self.autocast = (device.type, torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))


class InputChain:
    """Hands a SOURCE layer's saved input to the REGENERATED layer after it, within one forward."""

    def __init__(self) -> None:
        self.source: _Source | None = None


def _hookless(layer: torch.nn.Module, function: Any) -> Any:
    """The layer's forward as transformers' checkpointing calls it, without module hooks: transformers ≥ 5.2x
    checkpoints `forward` itself (hooks stay outside), earlier releases `nn.Module.__call__` (hooks inside), whose
    arguments then go to the layer's `forward` directly."""
    func = getattr(function, "func", None)
    if getattr(func, "__name__", "") in ("__call__", "_wrapped_call_impl"):
        return functools.partial(layer.forward, *function.args, **function.keywords)
    return function


def source_checkpoint(chain: InputChain, layer: torch.nn.Module, offload: bool, function: Any, *args: Any,
                      **kwargs: Any) -> Any:
    """Checkpoint `function` as usual (its input in host memory with `offload`), and leave in `chain` what
    regenerates the next layer's input from it."""
    unpack = HostOffload.from_host if offload else _same

    def pack(t: torch.Tensor) -> Any:
        packed = HostOffload.to_host(t) if offload else t
        chain.source = _Source(layer, _hookless(layer, function), packed, unpack, t.device)
        return packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = checkpoint(function, *args, **kwargs)
    hidden = out[0] if isinstance(out, tuple) else out
    if chain.source is not None and isinstance(hidden, torch.Tensor):
        chain.source.output = weakref.ref(hidden)
    return out


class _Regenerated:
    __slots__ = ("dtype", "shape", "source")

    def __init__(self, source: _Source, t: torch.Tensor) -> None:
        self.source, self.shape, self.dtype = source, t.shape, t.dtype


def _same(x: Any) -> Any:
    return x


def _regenerate(packed: Any) -> torch.Tensor:
    if not isinstance(packed, _Regenerated):
        return packed
    s = packed.source
    x = s.unpack(s.packed)
    unshard = getattr(s.layer, "unshard", None)
    if unshard is not None:  # FSDP2: the prefetch this layer's backward would wait on, waited on now
        unshard()
    cpu_rng, cuda_rng = s.rng
    device_type, autocast_on, autocast_dtype = s.autocast
    with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []), torch.no_grad(), \
            torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, x.device)
        out = s.forward(x)
    out = out[0] if isinstance(out, tuple) else out
    if out.shape != packed.shape or out.dtype != packed.dtype:
        raise RuntimeError(f"a regenerated layer input came back as {tuple(out.shape)} {out.dtype}, not "
                           f"{tuple(packed.shape)} {packed.dtype}: the layer before did not compute this one's input")
    return out


def _is_output_of(source: _Source, x: Any) -> bool:
    """`x` holds the very elements the source layer returned: the same tensor, or another view of the same memory
    with the same layout (FSDP2's hooks hand a layer its input through an autograd function that returns a view).
    The returned tensor must still be alive, so that its memory cannot have been reused."""
    out = source.output() if source.output is not None else None
    if out is None or not isinstance(x, torch.Tensor):
        return False
    return x is out or (x.data_ptr() == out.data_ptr() and x.shape == out.shape and x.stride() == out.stride()
                        and x.dtype == out.dtype and x.device == out.device)


def regenerated_checkpoint(chain: InputChain, function: Any, *args: Any, **kwargs: Any) -> Any:
    """Checkpoint `function` keeping nothing: its input (the layer before's output, handed over in `chain`) is
    regenerated at the start of its backward. Without a source in `chain`, or with an input that is not the
    source's output, it keeps its input, as a plain checkpoint."""
    source, chain.source = chain.source, None
    # Only an input that is the layer before's output, as it returned it, can be computed again from that layer's:
    # a model that changes the hidden states between its layers keeps this one's input.
    if source is None or not args or not _is_output_of(source, args[0]):
        return checkpoint(function, *args, **kwargs)
    # The input's id, not the input: autograd keeps the pack hook as long as the saved tensor, and a hook that held
    # the input would keep it alive to the layer's backward, which is what regenerating it saves.
    hidden = id(args[0])

    def pack(t: torch.Tensor) -> Any:
        return _Regenerated(source, t) if id(t) == hidden else t

    with torch.autograd.graph.saved_tensors_hooks(pack, _regenerate):
        return checkpoint(function, *args, **kwargs)
