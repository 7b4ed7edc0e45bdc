"""Run by torchrun on 2 gloo ranks (tests/dist/test_qlora.py): the dequantized bf16 base of a QLoRA model sharded by
FSDP2 equals the unsharded model's, tensor for tensor; prints `qlora base ok` on rank 0."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from runner.spec import load_spec
    from runner.train.lora import apply_lora
    from runner.train.qlora import base_state_dict, is_nf4, quantize_base

    dist.init_process_group("gloo")
    spec = load_spec("tiny-cpu", ["method.kind=qlora"])
    model = apply_lora(AutoModelForCausalLM.from_pretrained(str(ROOT / "recipes" / "embedded" / "model"),
                                                            dtype=torch.float32), spec)
    quantize_base(model, dist.get_world_size(), "float32")
    whole = base_state_dict(model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sharded = [p for p in model.parameters() if is_nf4(p)]
    gathered = base_state_dict(model)  # every rank takes part in the gathers
    ok = bool(sharded) and all(p.to_local().shape[0] * 2 == p.shape[0] for p in sharded) and \
        gathered.keys() == whole.keys() and all(torch.equal(gathered[k], whole[k]) for k in whole)
    if dist.get_rank() == 0:
        print(f"qlora base {'ok' if ok else 'MISMATCH'}: {len(whole)} tensors, {len(sharded)} NF4 shards", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without the interpreter's teardown, as the runner's ranks leave (tests/dist/ulysses_ranks.py)
