"""hardware.sequence_parallel through `runner run` (real torchrun, gloo): two ranks that share each block train and
evaluate as one rank on whole blocks, step by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.record import records
from tests.conftest import dir_args, last_json, run_cli

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]

# The same blocks each step: the data is read per group (one group of 2 here, one rank of 1 there), one block per
# step; the levers the planner would pick per world size are set.
COMMON = ["train.max_steps=4", "train.micro_batch=1", "train.grad_accum=1", "train.schedule=constant",
          "train.warmup_steps=0", "train.loss_impl=chunked", "train.activation_checkpointing=false",
          "dataset.eval_fraction=0.1", "train.eval_every=2"]
RTOL = 1e-5  # fp32 on CPU: the split changes only the order of sums (measured ≈ 1e-7)


def _run(dirs: dict[str, Path], capsys, ranks: int, sp: int) -> tuple[dict, dict[int, list[dict]]]:
    sets = [*COMMON, f"hardware.nproc_per_node={ranks}", f"hardware.sequence_parallel={sp}"]
    code, out, _ = run_cli(["run", "tiny-cpu", *(a for s in sets for a in ("--set", s)), "--plain", "--json",
                            *dir_args(dirs)], capsys)
    assert code == 0, out
    rec = records.load(Path(last_json(out)["record"]))
    steps: dict[int, list[dict]] = {}
    for rank in range(ranks):
        lines = (Path(rec["run_dir"]) / "events" / f"rank{rank}.jsonl").read_text().splitlines()
        steps[rank] = [e for e in map(json.loads, lines) if "global_loss" in e or e.get("event") == "eval"]
    return rec, steps


def test_two_ranks_sharing_each_block_train_as_one_rank(dirs, capsys):
    whole, one = _run(dirs, capsys, 1, 1)
    split, two = _run(dirs, capsys, 2, 2)
    assert split["decisions"]["sequence_parallel"] == 2 and split["decisions"]["attn"] == "ulysses"
    assert [e.get("event") for e in one[0]] == [e.get("event") for e in two[0]] == [None, None, "eval"] * 2
    for ref, *shares in zip(one[0], two[0], two[1]):
        if ref.get("event") == "eval":  # the held-out blocks, split the same way: the same eval loss
            assert all(e["loss"] == pytest.approx(ref["loss"], rel=RTOL) for e in shares)
            assert all(e["target_tokens"] == ref["target_tokens"] for e in shares)
            continue
        for e in shares:  # every rank reports the block's loss and the block's gradient norm
            assert e["step"] == ref["step"]
            assert e["global_loss"] == pytest.approx(ref["global_loss"], rel=RTOL)
            assert e["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL)
        # Each block's targets and tokens are counted once, split between the ranks that share it.
        assert sum(e["target_tokens"] for e in shares) == ref["target_tokens"]
        assert sum(e["tokens"] for e in shares) == ref["tokens"]
    assert split["metrics"]["final_global_loss"] == pytest.approx(whole["metrics"]["final_global_loss"], rel=RTOL)
