"""The run folder's checkpoint listing (runner.events.paths.RunPaths): both engines' layouts, complete ones only."""

from __future__ import annotations

from runner.events.paths import RunPaths


def test_only_complete_checkpoints_of_either_engine_are_listed_oldest_first(tmp_path):
    paths = RunPaths(tmp_path)
    assert paths.complete_checkpoints() == [] and paths.latest_checkpoint() is None
    for folder, last in (("step10", "meta.json"), ("step2", "meta.json"), ("checkpoint-30", "trainer_state.json"),
                         (".step40.tmp", "meta.json"), ("step50", None), ("checkpoint-60", "model.safetensors"),
                         ("stepx", "meta.json")):
        (paths.checkpoints / folder).mkdir(parents=True)
        if last:
            (paths.checkpoints / folder / last).write_text("{}")
    assert paths.complete_checkpoints() == [(2, paths.step_checkpoint(2)), (10, paths.step_checkpoint(10)),
                                            (30, paths.checkpoints / "checkpoint-30")]
    assert paths.latest_checkpoint() == paths.checkpoints / "checkpoint-30"
    assert paths.step_checkpoint(10) == tmp_path / "checkpoints" / "step10"
