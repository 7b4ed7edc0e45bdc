"""One learning-rate schedule for both engines: the TRL trainer's scheduler is runner.train.schedule's rule."""

from __future__ import annotations

import types

import pytest
import torch

from runner.spec import load_spec
from runner.train.schedule import lr_at


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_the_trl_trainer_schedules_as_the_native_engine(schedule):
    from runner.train import trl_engine

    spec = load_spec("tiny-cpu", ["engine=trl", f"train.schedule={schedule}", "train.warmup_steps=3",
                                  "train.max_steps=10", "train.lr=1e-3"])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=spec.train.lr)
    trainer = types.SimpleNamespace(lr_scheduler=None, _spec=spec, optimizer=opt)
    # The trainer's own method on a stand-in: building a real trainer needs a model and data (tests/dist/test_trl.py
    # checks a real run's logged lr against the same rule).
    sched = trl_engine._trainer_class().create_scheduler(trainer, num_training_steps=999)
    logged = []
    for _ in range(10):  # as the trainer does: the optimizer steps at the lr it logs, then the scheduler steps
        logged.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [lr_at(spec, s, 10) for s in range(1, 11)]
    assert logged == pytest.approx(expected, rel=1e-12, abs=1e-15)
    # Warmup from step 1: the first step learns, the warmup's last and the next run at the peak.
    assert logged[0] == pytest.approx(1e-3 / 3) and logged[2] == logged[3] == pytest.approx(1e-3)
    if schedule != "constant":
        assert 0 < logged[-1] < logged[4]
