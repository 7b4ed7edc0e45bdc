"""SFT loss of one packed micro-batch: the sum of token cross-entropies over its targets, full or chunked.

* full: the model's forward gives logits for every position; one float32 copy of them is made for the loss
  (tokens × vocab × 4 bytes: 32.5 GB at 32,768 tokens with a 248,320 vocabulary).
* chunked: the base model gives hidden states; only the positions that have a target go through lm_head and
  cross-entropy, a chunk of tokens at a time under activation checkpointing, so no full logits tensor ever
  exists and each chunk's logits are recomputed in backward. Sum reduction in float32, like the full path.
* fused: the same target positions and chunks, but each chunk's gradients (for the hidden states and for
  lm_head's weight) are computed in the forward, while its logits exist, so backward only scales them: no
  recomputation of lm_head. Costs one lm_head-sized weight gradient and the targets' hidden-state gradient,
  held from the forward to the backward.

Both return a float32 scalar that is connected to every parameter the forward used, also when the micro-batch
has no target (an exhausted rank's empty block): FSDP needs every rank to produce gradients for the same
parameters.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from runner.decide.rules import chunk_tokens_for, fused_chunk_tokens_for
from runner.decide.rules import resolve_loss_impl as resolve_loss_impl  # the loss decisions live with the others
from runner.train.attention import packing_kwargs, uses_varlen
from runner.train.data import IGNORE

LOSS_METHOD = "sft_loss_sum"


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The HF model under a peft wrapper (LoRA layers live inside it, so calling it trains them)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def causal_lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(base model returning hidden states, lm_head) of a causal LM or of a VLM-style checkpoint."""
    hf = unwrap_causal_lm(model)
    head = hf.get_output_embeddings()
    base = getattr(hf, getattr(hf, "base_model_prefix", "model"), None)
    if head is None or base is None or base is hf:
        raise ValueError(f"{type(hf).__name__} has no separate base model and lm_head; use train.loss_impl=full")
    return base, head


def full_loss_sum(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Sum of token cross-entropies from the model's own logits (one float32 copy)."""
    out = model(input_ids=batch["input_ids"], use_cache=False, **packing_kwargs(batch, uses_varlen(model)))
    if "targets" in batch:  # a sequence-parallel slice: its targets were shifted on the whole block
        logits, targets = out.logits.float(), batch["targets"]
    else:
        logits, targets = out.logits[:, :-1].float(), batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def _chunk_ce_sum(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()
    return F.cross_entropy(logits, targets, reduction="sum")


def ce_sum_and_grad_inplace(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of cross-entropies, d sum / d logits in the logits' dtype) of one chunk, eagerly, in few buffers.

    fp32 softmax made in place of an fp32 copy of the logits; minus one at each target.
    """
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    loss = (lse - x.gather(1, targets[:, None]).squeeze(1)).sum()
    probs = x.sub_(lse[:, None]).exp_()
    probs.scatter_add_(1, targets[:, None], torch.full_like(probs[:, :1], -1.0))
    return loss, probs.to(logits.dtype)


def ce_sum_and_grad(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same function written for torch.compile: one reduction and one pointwise pass, no fp32 copy in memory.

    Same operations in the same precision (fp32 from the logits, the gradient cast last), so it agrees with the
    eager version to float32 rounding (tests/unit/test_loss.py).
    """
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    target = torch.arange(x.size(1), device=x.device)[None, :] == targets[:, None]
    loss = (lse.squeeze(1) - torch.where(target, x, 0.0).sum(1)).sum()
    probs = torch.exp(x - lse)
    return loss, torch.where(target, probs - 1.0, probs).to(logits.dtype)


_compiled_ce: Any = None


class CompiledChunkCE:
    """ce_sum_and_grad under torch.compile, one graph for every chunk of a run.

    The chunks of one step have different row counts (the last is a remainder) and their targets are slices at
    different offsets. Left to dynamo's automatic dynamic shapes, each new kind of chunk recompiles: the first
    remainder, then the first step whose targets fit in one chunk (its slice starts at offset 0, where dynamo
    had specialised offsets >= 2). That happens whenever a partly filled block comes, after the warm-up as
    often as not, and costs a second or more. So the row dimension is marked dynamic from the first call and the
    targets are passed as their own tensor (offset 0, a copy of at most one chunk of ids). One row would still
    specialise (dynamo treats sizes 0 and 1 apart): `chunk_bounds` never makes a one-row chunk out of more
    rows, and a single target row takes the eager twin, which agrees to float32 rounding.
    """

    def __init__(self, backend: Any = "inductor"):
        self.compiled = torch.compile(ce_sum_and_grad, backend=backend)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.size(0) < 2:
            return ce_sum_and_grad_inplace(logits, targets)
        targets = targets.clone()
        torch._dynamo.mark_dynamic(logits, 0)
        torch._dynamo.mark_dynamic(targets, 0)
        return self.compiled(logits, targets)


def compiled_ce_sum_and_grad() -> Any:
    """The process's CompiledChunkCE (compiled at its first call, then reused by every step)."""
    global _compiled_ce
    if _compiled_ce is None:
        _compiled_ce = CompiledChunkCE()
    return _compiled_ce


def chunk_bounds(rows: int, chunk: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk of `rows` rows, at most `chunk` long; none has one row unless `rows` is 1.

    A remainder of one row borrows a row from the chunk before it (see CompiledChunkCE).
    """
    bounds = [(start, min(start + chunk, rows)) for start in range(0, rows, chunk)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1 and chunk > 2:
        (a, b), (_, c) = bounds[-2], bounds[-1]
        bounds[-2:] = [(a, b - 1), (b - 1, c)]
    return bounds


class FusedLinearCrossEntropy(torch.autograd.Function):
    """sum(cross_entropy(hidden @ weight.T, targets)) with both gradients made in forward, one chunk at a time.

    The gradient of a summed cross-entropy with respect to the logits is softmax - one_hot, known as soon as the
    chunk's logits are; the incoming gradient (a scalar) only scales it, so backward multiplies what forward
    stored. Rounding follows the autograd path: fp32 softmax, the logits' gradient cast to the compute dtype for
    the two matmuls, the weight gradient accumulated over chunks in the weight's dtype. `ce` computes one
    chunk's loss and logits' gradient (ce_sum_and_grad_inplace, or its compiled twin on GPU).
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int, ce: Any) -> torch.Tensor:
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start, end in chunk_bounds(hidden.size(0), chunk):
            h = hidden[start:end]
            loss, g = ce(h @ weight.t(), targets[start:end])
            total += loss
            torch.mm(g, weight, out=grad_hidden[start:end])
            if grad_weight is not None:
                grad_weight.addmm_(g.t(), h)
            del g
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        # In place: these buffers are used once (the step's loss is backpropagated once).
        grad_hidden.mul_(grad_out.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight.mul_(grad_out.to(grad_weight.dtype))
        return grad_hidden, grad_weight, None, None, None


def _target_hidden(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, nn.Module]:
    """(hidden states of the whole block, target positions, their targets, lm_head) without any logits."""
    base, head = causal_lm_parts(model)
    out = base(input_ids=batch["input_ids"], use_cache=False, **packing_kwargs(batch, uses_varlen(model)))
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    hidden = hidden.reshape(-1, hidden.size(-1))
    index = batch.get("target_index")
    targets = batch.get("target_ids")
    if index is None or targets is None:
        shifted = batch["labels"].reshape(-1)[1:]
        index = torch.nonzero(shifted != IGNORE).flatten()
        targets = shifted[index]
    return hidden, index, targets, head


def fused_loss_sum(model: nn.Module, batch: dict[str, Any], chunk_tokens: int | None = None,
                   compiled: bool = False) -> torch.Tensor:
    """Sum of token cross-entropies over target positions, gradients made in forward (FusedLinearCrossEntropy).

    `compiled`: each chunk's softmax and gradient in one compiled pass (CUDA), instead of the eager in-place ops.
    """
    hidden, index, targets, head = _target_hidden(model, batch)
    if index.numel() == 0:
        return _chunk_ce_sum(head, hidden[:1], batch["input_ids"].reshape(-1)[:1]) * 0.0
    bias = getattr(head, "bias", None)
    if bias is not None:
        raise ValueError("train.loss_impl=fused: lm_head has a bias; use chunked")
    chunk = chunk_tokens or fused_chunk_tokens_for(head.weight.shape[0])
    ce = compiled_ce_sum_and_grad() if compiled else ce_sum_and_grad_inplace
    return FusedLinearCrossEntropy.apply(hidden.index_select(0, index), head.weight, targets, chunk, ce)


def chunked_loss_sum(model: nn.Module, batch: dict[str, Any], chunk_tokens: int | None = None) -> torch.Tensor:
    """Sum of token cross-entropies with lm_head applied to target positions only, chunk by chunk."""
    hidden, index, targets, head = _target_hidden(model, batch)
    if index.numel() == 0:
        # No target: still run lm_head on one position so its weight gets a (zero) gradient on this rank too.
        return _chunk_ce_sum(head, hidden[:1], batch["input_ids"].reshape(-1)[:1]) * 0.0
    selected = hidden.index_select(0, index)
    chunk = chunk_tokens or chunk_tokens_for(head.weight.shape[0])
    total = None
    for start in range(0, selected.size(0), chunk):
        part = checkpoint(_chunk_ce_sum, head, selected[start:start + chunk], targets[start:start + chunk],
                          use_reentrant=False)
        total = part if total is None else total + part
    assert total is not None
    return total


LOSS_FUNCTIONS = {"chunked": chunked_loss_sum, "fused": fused_loss_sum}


def attach_chunked_loss(model: nn.Module, impl: str = "chunked", chunk_tokens: int | None = None,
                        compiled: bool = False) -> None:
    """Give the (FSDP root) model a `sft_loss_sum(batch)` method that runs under FSDP's forward hooks.

    The chunked loss calls the base model and lm_head directly, not the root's forward; registering the method
    makes FSDP all-gather the root's own parameters (embeddings, final norm, lm_head) around it as it does
    around forward. `compiled` (fused only): each chunk's softmax and gradient run as one compiled kernel pair.
    """
    fn = LOSS_FUNCTIONS[impl]
    extra = {"compiled": True} if compiled and impl == "fused" else {}

    def method(self: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return fn(self, batch, chunk_tokens, **extra)

    setattr(model, LOSS_METHOD, types.MethodType(method, model))
    try:
        from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
    except ImportError:
        return
    if isinstance(model, FSDPModule):
        register_fsdp_forward_method(model, LOSS_METHOD)


def loss_sum(model: nn.Module, batch: dict[str, Any], impl: str) -> torch.Tensor:
    """The micro-batch's loss sum with the chosen implementation."""
    if impl in LOSS_FUNCTIONS:
        method = getattr(model, LOSS_METHOD, None)
        return method(batch) if method is not None else LOSS_FUNCTIONS[impl](model, batch)
    return full_loss_sum(model, batch)
