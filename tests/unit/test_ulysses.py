"""Ulysses sequence parallelism: what cannot be split over ranks is refused with the reason (the exchange itself is
tested on real gloo ranks in tests/dist/test_ulysses.py)."""

from __future__ import annotations

from tests.families import family_config


def test_sequence_parallel_refuses_recurrent_layers_and_heads_that_do_not_divide():
    from runner.train.ulysses import sequence_parallel_problems

    assert sequence_parallel_problems(family_config("llama"), 2) == []
    assert sequence_parallel_problems(family_config("qwen3_next"), 1) == []  # one rank splits nothing
    hybrid = sequence_parallel_problems(family_config("qwen3_next"), 2)
    assert len(hybrid) == 1 and "gated-delta layers" in hybrid[0].message, hybrid
    heads = sequence_parallel_problems(family_config("llama"), 3)
    assert len(heads) == 1 and "4 attention heads do not divide over 3 ranks" in heads[0].message, heads
