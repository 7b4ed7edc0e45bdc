"""Activation offloading for recomputed layers (train.offload_activations).

With non-reentrant checkpointing a recomputed decoder layer keeps one tensor from forward to backward: its input,
which checkpoint stores as a saved tensor (`_CheckpointFrame.save_inputs`) under whatever saved-tensor hooks are
active around the call. `offloaded_checkpoint` runs the checkpoint under `HostOffload`, so that input waits in
pinned host memory: per token and layer, hidden × 2 bytes leave the GPU. Everything saved inside the layer is
still a checkpoint placeholder, recomputed in backward.

The device-to-host copy runs on a side stream, so forward does not wait for it; `record_stream` keeps the GPU
block from being reused until the copy has read it. In backward the input comes back on the compute stream just
before the layer is recomputed (one copy of hidden × 2 bytes per token, small beside the layer's recompute).

Where the node's host memory cannot hold every recomputed layer's input, the first layers offload as many as it
holds; as many of the others regenerate theirs in backward from a hosted one (runner.train.regenerate), and the
rest keep theirs on the GPU (runner.decide plans each layer's place before launch; the estimator prices the same).

Host buffers come from `HostBuffers`, not from torch's pinned-memory allocator: that one rounds every request up
to a power of two, so 36 layer inputs of 2.1 GB would ask for 147 GB of page-locked memory instead of 76. Ours are
plain CPU tensors of the exact size, page-locked once with cudaHostRegister and reused on every step.
"""

from __future__ import annotations

from typing import Any

import psutil
import torch
from torch.utils.checkpoint import checkpoint

from runner.facts.gpus import HOST_RESERVE_BYTES

MIN_OFFLOAD_BYTES = 1 << 20
"""Smaller saved tensors stay where they are: the copy would cost more than the memory it frees."""




class HostBuffers:
    """Page-locked host buffers of exact sizes, kept for reuse (blocks of one run have one length, so after the
    first step every request finds a free buffer of its size)."""

    def __init__(self) -> None:
        self._free: dict[int, list[torch.Tensor]] = {}
        self.pinned_bytes = 0

    def take(self, nbytes: int) -> torch.Tensor:
        free = self._free.get(nbytes)
        if free:
            return free.pop()
        # Refuse before the kernel's out-of-memory killer takes the process (and the rank's log) away.
        available = psutil.virtual_memory().available
        err = 0 if available - nbytes >= HOST_RESERVE_BYTES else -1
        if err == 0:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            err = int(torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0))
        if err != 0:
            raise RuntimeError(
                f"could not page-lock {nbytes / 2**30:.2f} GiB of host memory for activation offload "
                f"({self.pinned_bytes / 2**30:.1f} GiB already locked, {available / 2**30:.1f} GiB available"
                f"{'' if err == -1 else f', cudaHostRegister error {err}'}): use shorter blocks, fewer ranks per "
                "node, or train.offload_activations=false")
        self.pinned_bytes += nbytes
        return buf

    def give(self, buf: torch.Tensor) -> None:
        # Safe to reuse at once: the next copy into it is queued on the side stream after a wait on the compute
        # stream, behind the copy out of it that unpack queued there.
        self._free.setdefault(buf.numel(), []).append(buf)


class _OnHost:
    """A saved tensor in host memory; its buffer goes back to the pool when autograd lets go of it."""

    __slots__ = ("buf", "device", "dtype", "pool", "shape")

    def __init__(self, buf: torch.Tensor, t: torch.Tensor, pool: HostBuffers) -> None:
        self.buf, self.device, self.dtype, self.shape, self.pool = buf, t.device, t.dtype, t.shape, pool

    def __del__(self) -> None:
        self.pool.give(self.buf)


class HostOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved contiguous CUDA tensors of at least MIN_OFFLOAD_BYTES go to page-locked host memory."""

    _streams: dict[torch.device, torch.cuda.Stream] = {}
    pool = HostBuffers()

    def __init__(self) -> None:
        super().__init__(self.to_host, self.from_host)

    @classmethod
    def _stream(cls, device: torch.device) -> torch.cuda.Stream:
        if device not in cls._streams:
            cls._streams[device] = torch.cuda.Stream(device)
        return cls._streams[device]

    @classmethod
    def to_host(cls, t: torch.Tensor) -> Any:
        """A saved tensor's copy on its way to page-locked host memory (small, CPU or strided tensors stay)."""
        nbytes = t.numel() * t.element_size()
        if t.device.type != "cuda" or nbytes < MIN_OFFLOAD_BYTES or not t.is_contiguous():
            return t
        buf = cls.pool.take(nbytes)
        side = cls._stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))  # the copy reads t only once t is computed
        with torch.cuda.stream(side):
            buf.copy_(t.view(-1).view(torch.uint8), non_blocking=True)
        t.record_stream(side)  # the allocator keeps t's block until the copy is done
        return _OnHost(buf, t, cls.pool)

    @classmethod
    def from_host(cls, packed: Any) -> torch.Tensor:
        """What to_host kept, back on its device (it waits for the copy to host to finish first)."""
        if isinstance(packed, torch.Tensor):
            return packed
        torch.cuda.current_stream(packed.device).wait_stream(cls._stream(packed.device))  # copy to host done
        out = packed.buf.to(packed.device, non_blocking=True)
        return out.view(packed.dtype).view(packed.shape)


def offloaded_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    """torch.utils.checkpoint.checkpoint with the saved layer input in host memory (see the module docstring)."""
    with HostOffload():
        return checkpoint(function, *args, **kwargs)
