"""RunSpec: loading, --set overrides typed by the schema, defaults, and validation that lists every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.spec import RunSpec, apply_override, field_docs, load_spec, recipe_names, resolve


def test_recipe_loads_and_defaults_fill():
    spec = load_spec("tiny-cpu")
    assert spec.name == "tiny-cpu"
    assert spec.train.seq_len == 512
    assert spec.train.deterministic is True  # a default the recipe does not set
    assert "tiny-cpu" in recipe_names()


def test_set_overrides_are_typed_by_schema():
    spec = load_spec("tiny-cpu", ["train.lr=1e-5", "train.max_steps=7", "method.kind=lora", "method.lora.r=4",
                                  "train.betas=[0.8, 0.9]", "model.revision=abc123"])
    assert spec.train.lr == 1e-5 and isinstance(spec.train.lr, float)
    assert spec.train.max_steps == 7
    assert spec.method.lora.r == 4
    assert spec.train.betas == (0.8, 0.9)
    assert spec.model.revision == "abc123"


def test_set_on_missing_path_names_field_and_suggests():
    with pytest.raises(SpecError) as e:
        load_spec("tiny-cpu", ["train.seqlen=1024"])
    assert e.value.problems[0].field == "train.seqlen"
    assert "train.seq_len" in e.value.problems[0].fix


def test_set_into_a_leaf_is_rejected():
    with pytest.raises(SpecError) as e:
        apply_override({}, "train.lr.x=1")
    assert "no sub-fields" in str(e.value)


def test_every_problem_reported_at_once():
    with pytest.raises(SpecError) as e:
        load_spec({"engine": "deepspeed", "train": {"seq_len": -5, "lrr": 1, "lr": "fast"}})
    fields = {p.field for p in e.value.problems}
    assert fields == {"engine", "train.seq_len", "train.lrr", "train.lr"}
    text = str(e.value)
    assert "4 problems" in text and "did you mean 'train.lr'" in text and "got -5" in text


def test_unknown_recipe_suggests_close_name():
    with pytest.raises(SpecError) as e:
        load_spec("tiny-cpy")
    assert "tiny-cpu" in str(e.value)


def test_malformed_yaml_reports_position(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  seq_len: [1, 2\n")
    with pytest.raises(SpecError) as e:
        load_spec(str(bad))
    assert "not valid YAML" in str(e.value) and "line" in str(e.value)


def test_json_spec_and_cross_field_checks(tmp_path: Path):
    f = tmp_path / "s.json"
    f.write_text('{"output": {"save": "adapter"}, "model": {"path": "/nonexistent/dir"}}')
    with pytest.raises(SpecError) as e:
        load_spec(str(f))
    fields = {p.field for p in e.value.problems}
    assert fields == {"output.save", "model.path"}


def test_resolve_fills_machine_defaults():
    spec = resolve(load_spec({}), cuda_available=False, gpu_count=0)
    assert spec.hardware.device == "cpu" and spec.hardware.nproc_per_node == 2 and spec.model.dtype == "float32"
    gpu = resolve(load_spec({}), cuda_available=True, gpu_count=8)
    assert gpu.hardware.device == "cuda" and gpu.hardware.nproc_per_node == 8 and gpu.model.dtype == "bfloat16"
    with pytest.raises(SpecError):
        resolve(load_spec({"hardware": {"nproc_per_node": 4, "device": "cuda"}}), cuda_available=True, gpu_count=2)


def test_every_field_has_docs_and_defaults():
    docs = field_docs()
    assert len(docs) > 30
    missing = [path for path, doc, _ in docs if not doc]
    assert missing == []
    assert RunSpec().to_dict()["train"]["seq_len"] == 512


def test_all_shipped_recipes_validate():
    for name in recipe_names():
        load_spec(name)


@pytest.mark.parametrize("rev,ok", [("main", True), ("v1.0", True), ("refs/pr/1", True),
                                    ("1d4bf0f2ff6012fd82039f2fa52739d0dd7c60c0", True), ("bad rev", False),
                                    ("a..b", False), ("x~1", False), ("feat/", False), ("", False)])
def test_revision_must_be_a_ref_name(rev: str, ok: bool):
    if ok:
        assert load_spec("tiny-cpu", [f"dataset.revision={rev}"]).dataset.revision == rev
    else:
        with pytest.raises(SpecError) as e:
            load_spec({"dataset": {"revision": rev}})
        assert [p.field for p in e.value.problems] == ["dataset.revision"]


@pytest.mark.parametrize("field, on, off, trl_says", [
    ("recompute_layers", "1", "null", "checkpoints every layer or none"),
    ("offload_activations", "true", "false", "does not offload activations")])
def test_native_recompute_levers_need_checkpointing_and_the_native_engine(field, on, off, trl_says):
    with pytest.raises(SpecError) as e:
        load_spec("tiny-cpu", [f"train.{field}={on}", "engine=trl", "train.activation_checkpointing=false"])
    problems = e.value.problems
    assert [p.field for p in problems] == [f"train.{field}"] * 2
    assert "activation checkpointing" in problems[0].message and trl_says in problems[1].message
    assert all(f"train.{field}={off}" in p.fix for p in problems)
    spec = load_spec("tiny-cpu", ["train.activation_checkpointing=true", f"train.{field}={on}"])
    assert getattr(spec.train, field) == (1 if on == "1" else True)
    # Checkpointing left auto: the planner turns it on for the lever that needs it; the engine still refuses.
    assert getattr(load_spec("tiny-cpu", [f"train.{field}={on}"]).train, field) == (1 if on == "1" else True)
    with pytest.raises(SpecError) as e:
        load_spec("tiny-cpu", [f"train.{field}={on}", "engine=trl"])
    assert [p.field for p in e.value.problems] == [f"train.{field}"]


@pytest.mark.parametrize("sets, field, words", [
    (["engine=trl", "hardware.sequence_parallel=2"], "hardware.sequence_parallel", "the trl engine"),
    (["hardware.nproc_per_node=6", "hardware.sequence_parallel=4"], "hardware.sequence_parallel",
     "4 does not divide the 6 ranks per node"),
    (["hardware.sequence_parallel=2", "train.seq_len=511"], "train.seq_len", "multiple of hardware.sequence_parallel=2"),
])
def test_sequence_parallel_is_refused_where_it_cannot_run(sets, field, words):
    with pytest.raises(SpecError) as err:
        load_spec("tiny-cpu", sets)
    [p] = err.value.problems
    assert p.field == field and words in p.message and p.fix


def test_sequence_parallel_is_checked_against_the_ranks_resolved_at_launch():
    spec = load_spec("tiny-cpu", ["hardware.nproc_per_node=auto", "hardware.sequence_parallel=4"])
    with pytest.raises(SpecError) as err:
        resolve(spec, cuda_available=False, gpu_count=0)  # auto on CPU: 2 ranks
    assert "4 does not divide the 2 ranks per node" in str(err.value)
    ok = resolve(load_spec("tiny-cpu", ["hardware.nproc_per_node=auto", "hardware.sequence_parallel=2"]),
                 cuda_available=False, gpu_count=0)
    assert ok.hardware.sequence_parallel == 2 and ok.hardware.nproc_per_node == 2


def test_output_save_auto_keeps_the_adapter_of_adapter_methods_and_the_model_otherwise():
    from types import SimpleNamespace

    from runner.engines import saved_as

    assert RunSpec().output.save == "auto"
    assert resolve(RunSpec(), cuda_available=False, gpu_count=0).output.save == "full"
    lora = load_spec("tiny-cpu", ["method.kind=lora", "output.save=auto"])
    assert resolve(lora, cuda_available=False, gpu_count=0).output.save == "adapter"
    # the rule is written for every adapter method, qlora included, whatever the schema admits today
    assert saved_as(SimpleNamespace(output=SimpleNamespace(save="auto"), method=SimpleNamespace(kind="qlora"))) \
        == "adapter"
    assert saved_as(load_spec("tiny-cpu", ["output.save=none"])) == "none"


def test_shipped_recipes_keep_what_they_meant_to_save():
    # every shipped recipe (benchmarks and the notebooks' runs) saves nothing, as they did before `auto`
    assert {name: load_spec(name).output.save for name in recipe_names()} == \
        {name: "none" for name in recipe_names()}
