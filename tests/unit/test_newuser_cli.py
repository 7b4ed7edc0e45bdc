"""What a new user reads from the CLI about a plan that does not fit on CPU: one memory wording throughout, the
suggestion included (it said "GiB per GPU" on a CPU run, where every other line says per rank)."""

from __future__ import annotations

import pytest

from runner.cli.main import EXIT_OK, main


def test_a_cpu_suggestion_speaks_of_ranks_not_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "tiny-cpu", "--set", "train.seq_len=4194304"]) == EXIT_OK
    out = capsys.readouterr().out
    suggestion = [line for line in out.splitlines() if line.startswith("suggestion:")]
    assert len(suggestion) == 1 and suggestion[0].endswith(" GiB per rank"), suggestion
    assert "does not fit:" in out and "per GPU" not in out



def test_when_nothing_fits_a_capped_cpu_rank_the_plan_asks_for_memory_not_a_larger_gpu(capsys):
    main(["estimate", "tiny-cpu", "--set", "train.seq_len=1024", "--set", "hardware.memory_gib=0.5"])
    out = capsys.readouterr().out
    suggestion = [line for line in out.splitlines() if line.startswith("suggestion:")]
    assert suggestion and suggestion[0].endswith("raise hardware.memory_gib (0.5 GiB per rank now)"), suggestion
    assert "larger GPU" not in out
