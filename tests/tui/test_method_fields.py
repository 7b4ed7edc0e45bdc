"""The Method step's eval, packing and tracker fields: parsed and validated like every other field."""

from __future__ import annotations

from runner.spec import field_choices
from tui.screens.wizard import ALL_FIELDS, STEP_OF_FIELD
from tui.specform import field_of, load_recipe_dict, problems_of, set_path
from tui.widgets.fields import parse_value, show_value


def test_trackers_field_reads_a_comma_list():
    assert parse_value("list", "tensorboard, mlflow") == ["tensorboard", "mlflow"]
    assert parse_value("list", "wandb") == ["wandb"]
    assert parse_value("list", "  ") == []
    assert show_value(["tensorboard", "mlflow"]) == "tensorboard, mlflow"


def test_new_fields_sit_in_the_method_step_and_their_problems_land_on_them():
    for path in ("dataset.eval_fraction", "dataset.eval_split", "train.eval_every", "train.early_stop_patience",
                 "train.packing_strategy", "report.to"):
        assert STEP_OF_FIELD[path] == "method"
    assert field_choices("train.packing_strategy") == ["bfd", "wrapped"]
    cases = [("train.eval_every", 10, "train.eval_every"),
             ("dataset.eval_fraction", 1.5, "dataset.eval_fraction"),
             ("report.to", ["tensorboard", "comet"], "report.to"),
             ("train.packing_strategy", "first_fit", "train.packing_strategy")]
    for path, value, field in cases:
        data = load_recipe_dict("tiny-cpu")
        set_path(data, path, value)
        problems = problems_of(data)
        assert problems and {field_of(p.field, ALL_FIELDS) for p in problems} == {field}, (path, problems)
    data = load_recipe_dict("tiny-cpu")
    for path, value in (("dataset.eval_fraction", 0.05), ("train.eval_every", 25), ("report.to", ["tensorboard"])):
        set_path(data, path, value)
    assert problems_of(data) == []
