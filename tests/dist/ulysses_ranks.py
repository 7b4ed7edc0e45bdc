"""Run under torchrun (gloo): Ulysses over all ranks on one packed block whose documents cross the split, against
the documents run one by one in one process. Prints `ulysses ok` on rank 0 when loss and gradients agree."""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from runner.train.ulysses import ULYSSES, global_positions, register_ulysses, shard_block
from tests.families import family_config

DOCS = (37, 30, 21, 8)  # 96 tokens: every split over 2 or 4 ranks falls inside a document


def main() -> int:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    register_ulysses()
    config = family_config(sys.argv[1] if len(sys.argv) > 1 else "llama")
    config.initializer_range = 0.2  # large weights: a leak across documents or a wrong position moves the loss
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    # A config of its own: the attention implementation is set on the config, which the reference's layers read.
    split = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=ULYSSES, dtype=torch.float32)
    split.load_state_dict(reference.state_dict())
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(3, config.vocab_size, (n,), generator=g) for n in DOCS]

    ref_loss = 0.0
    for ids in docs:  # one document at a time: nothing can leak
        logits = reference(input_ids=ids[None], position_ids=torch.arange(len(ids))[None]).logits[0, :-1]
        ref_loss = ref_loss + F.cross_entropy(logits, ids[1:], reduction="sum")
    ref_loss.backward()

    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    labels = ids.clone()
    labels[positions == 0] = -100  # a document's last token predicts nothing of the next
    part = shard_block(ids, labels, positions, rank, size)
    with global_positions(positions, None):
        logits = split(input_ids=part["input_ids"], position_ids=part["position_ids"]).logits[0]
        loss = F.cross_entropy(logits, part["targets"][0], ignore_index=-100, reduction="sum")
        loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    worst = 0.0
    for (name, p), q in zip(split.named_parameters(), reference.parameters(), strict=True):
        grad = p.grad.clone()
        dist.all_reduce(grad)  # each rank's share of the block's gradient
        worst = max(worst, float((grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)))
    loss_err = abs(float(total - ref_loss)) / abs(float(ref_loss))
    ok = loss_err <= 1e-6 and worst <= 1e-5
    if size > 1:  # negative control: positions restarting on each rank's slice move the loss
        local = part["position_ids"] - part["position_ids"][:, :1]
        with torch.no_grad(), global_positions(positions, None):
            wrong = F.cross_entropy(split(input_ids=part["input_ids"], position_ids=local).logits[0],
                                    part["targets"][0], ignore_index=-100, reduction="sum")
        dist.all_reduce(wrong)
        ok = ok and abs(float(wrong - ref_loss)) > 1e-3 * abs(float(ref_loss))
    if rank == 0:
        print(f"ulysses {'ok' if ok else 'MISMATCH'} ranks={size} loss={float(total):.6f} "
              f"reference={float(ref_loss):.6f} loss_err={loss_err:.2e} grad_err={worst:.2e}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown, as the runner's ranks leave (runner/train/__main__.py): a gloo thread still
    # joinable at exit aborts the process ("terminate called without an active exception", seen once with 4 ranks
    # on 2 cores after the check had passed).
    os._exit(code)
