"""SFT loss of one packed micro-batch: the sum of token cross-entropies over its targets, full or chunked.

* full: the model's forward gives logits for every position; one float32 copy of them is made for the loss
  (tokens × vocab × 4 bytes: 32.5 GB at 32,768 tokens with a 248,320 vocabulary).
* chunked: the base model gives hidden states; only the positions that have a target go through lm_head and
  cross-entropy, a chunk of tokens at a time under activation checkpointing, so no full logits tensor ever
  exists and each chunk's logits are recomputed in backward. Sum reduction in float32, like the full path.

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

from runner.train.attention import packing_kwargs
from runner.train.data import IGNORE

LOSS_METHOD = "sft_loss_sum"
# Logits of one chunk in float32: about 2**28 bytes (256 MiB) whatever the vocabulary.
CHUNK_LOGIT_BYTES = 2**28


def chunk_tokens_for(vocab_size: int) -> int:
    """Tokens per lm_head chunk: keeps one chunk's float32 logits near CHUNK_LOGIT_BYTES (256..8192 tokens)."""
    n = CHUNK_LOGIT_BYTES // (4 * max(1, vocab_size))
    return max(256, min(8192, n // 256 * 256))


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


def chunked_supported(config: Any) -> str | None:
    """Why the chunked loss would differ from the model's own logits (None when it is exact)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling"):
        if getattr(text, name, None) not in (None, 1, 1.0):
            return f"the model transforms its logits ({name})"
    return None


def resolve_loss_impl(requested: str, config: Any) -> tuple[str, str]:
    """(full | chunked, reason); auto = chunked unless the model post-processes its logits."""
    if requested == "full":
        return "full", "set by train.loss_impl"
    problem = chunked_supported(config)
    if requested == "chunked":
        if problem:
            raise ValueError(f"train.loss_impl=chunked cannot reproduce this model's loss: {problem}; use full")
        return "chunked", "set by train.loss_impl"
    if problem:
        return "full", f"{problem}: chunked lm_head would differ"
    return "chunked", "no full logits tensor; lm_head over target tokens in checkpointed chunks"


def full_loss_sum(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Sum of token cross-entropies from the model's own logits (one float32 copy)."""
    out = model(input_ids=batch["input_ids"], use_cache=False, **packing_kwargs(batch))
    logits = out.logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def _chunk_ce_sum(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()
    return F.cross_entropy(logits, targets, reduction="sum")


def chunked_loss_sum(model: nn.Module, batch: dict[str, Any], chunk_tokens: int | None = None) -> torch.Tensor:
    """Sum of token cross-entropies with lm_head applied to target positions only, chunk by chunk."""
    base, head = causal_lm_parts(model)
    out = base(input_ids=batch["input_ids"], use_cache=False, **packing_kwargs(batch))
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    hidden = hidden.reshape(-1, hidden.size(-1))
    index = batch.get("target_index")
    targets = batch.get("target_ids")
    if index is None or targets is None:
        shifted = batch["labels"].reshape(-1)[1:]
        index = torch.nonzero(shifted != IGNORE).flatten()
        targets = shifted[index]
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


def attach_chunked_loss(model: nn.Module, chunk_tokens: int | None = None) -> None:
    """Give the (FSDP root) model a `sft_loss_sum(batch)` method that runs under FSDP's forward hooks.

    The chunked loss calls the base model and lm_head directly, not the root's forward; registering the method
    makes FSDP all-gather the root's own parameters (embeddings, final norm, lm_head) around it as it does
    around forward.
    """
    def method(self: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return chunked_loss_sum(self, batch, chunk_tokens)

    setattr(model, LOSS_METHOD, types.MethodType(method, model))
    try:
        from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
    except ImportError:
        return
    if isinstance(model, FSDPModule):
        register_fsdp_forward_method(model, LOSS_METHOD)


def loss_sum(model: nn.Module, batch: dict[str, Any], impl: str) -> torch.Tensor:
    """The micro-batch's loss sum with the chosen implementation."""
    if impl == "chunked":
        method = getattr(model, LOSS_METHOD, None)
        return method(batch) if method is not None else chunked_loss_sum(model, batch)
    return full_loss_sum(model, batch)
