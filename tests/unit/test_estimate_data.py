"""The estimate reads a local dataset in its own format and packs a sample of it as the engines would."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runner.plan import estimate
from runner.spec import load_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.mark.parametrize(("file", "fmt"), [("alpaca_en_demo.json", "alpaca"),
                                           ("glaive_toolcall_en_demo.json", "sharegpt"),
                                           ("prompt_completion.jsonl", "prompt_completion"),
                                           ("text.jsonl", "text")])
def test_estimate_names_the_detected_format_and_counts_its_tokens(file: str, fmt: str) -> None:
    est = estimate(load_spec("tiny-cpu", [f"dataset.path={FIXTURES / file}"]))
    assert est.dataset_format["format"] == fmt and est.dataset_format["detected"]
    assert est.dataset_tokens and est.dataset_tokens > 0
    assert est.packing["documents"] == est.packing["sampled_rows"] > 0


def test_packing_preview_follows_the_strategy_and_sets_the_steps() -> None:
    over = ["train.max_steps=null", "train.epochs=1"]
    bfd = estimate(load_spec("tiny-cpu", [*over, "train.packing_strategy=bfd"]))
    wrapped = estimate(load_spec("tiny-cpu", [*over, "train.packing_strategy=wrapped"]))
    # The embedded conversations are all shorter than a block: bfd cuts none, wrapped cuts many.
    assert bfd.packing["split_documents"] == 0 < wrapped.packing["split_documents"]
    assert bfd.packing["packing_efficiency"] <= wrapped.packing["packing_efficiency"] <= 1.0
    # Steps: the dataset's tokens over the real tokens a step holds.
    tokens = bfd.dataset_tokens
    assert bfd.steps == math.ceil(tokens / (bfd.tokens_per_step * bfd.packing["packing_efficiency"]))
    held_out = estimate(load_spec("tiny-cpu", [*over, "dataset.eval_fraction=0.5"]))
    assert held_out.steps == math.ceil(tokens * 0.5 / (bfd.tokens_per_step * bfd.packing["packing_efficiency"]))
