"""What the estimator plans equals what each engine chooses: attention path, FSDP wrapping, loss implementation and
its chunk size, for every shipped recipe and the family matrix.

GPU recipes cannot run here: their plan is checked against the engines' own choice functions given the inputs the
engine gives them (the model class's declared attention support, the loaded weights' dtype), with the kernel probe
replaced by what a GPU machine has. Real `train_begin` events: tiny-cpu here; tiny-gpt-oss-cpu under both engines in
tests/dist/test_engines_agree.py; every family of the matrix with both engines in tests/dist/test_families.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.decide.rules import (
    Kernels,
    choose_loss,
    chunk_tokens_for,
    fsdp_wrapped,
    fused_chunk_tokens_for,
)
from runner.plan import estimate, make_plan
from runner.plan.autotune import resolve_levers
from runner.spec import RunSpec, load_spec
from tests import families

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
TRL_LOSS_IN_EVENTS = "trl fused lm head"


def hf_config(spec: RunSpec, config_dict: dict[str, Any]) -> Any:
    """The transformers config the engine loads: from model.path, else (a hub model, offline here) built from the
    config.json the estimator read."""
    from transformers import AutoConfig

    if spec.model.path:
        from runner.train.model import load_config

        return load_config(spec)
    cfg = dict(config_dict)
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def engine_choices(spec: RunSpec, device: str, config: Any, world: int, dtype: str, monkeypatch) -> dict[str, Any]:
    """The engine's decisions for this spec, by the functions the engines call at run time."""
    from runner.train import attention

    if device == "cuda":  # the one edge that cannot run here: which kernels a GPU machine has
        monkeypatch.setattr(attention, "available_kernels", lambda d: Kernels.assumed(d))
    choice, _ = attention.attention_for(spec, config, device)
    t = spec.train
    loss, _ = choose_loss(spec.engine, t.loss_impl, config)
    vocab = _vocab(config)
    chunk = {"chunked": chunk_tokens_for(vocab), "fused": fused_chunk_tokens_for(vocab)}.get(loss)
    weights_bf16 = dtype == "bfloat16"  # the engines load the weights in the resolved model.dtype
    wrapped = fsdp_wrapped(spec.engine, world, device, t.fsdp_one_rank,
                           weights_bf16 if spec.engine == "native" else True)
    return {"attn": choice.impl, "fsdp": wrapped, "loss_impl": loss, "loss_chunk_tokens": chunk}


def _vocab(config: Any) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def planned(spec: RunSpec) -> tuple[dict[str, Any], Any]:
    """The plan of a spec with its levers as the launcher resolves them (plan.spec: what the ranks are given)."""
    plan = make_plan(resolve_levers(spec))
    return {"attn": plan.attn, "fsdp": plan.sharded, "loss_impl": plan.loss_impl,
            "loss_chunk_tokens": plan.loss_chunk_tokens}, plan


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    from runner.facts import catalog
    from runner.plan import _load_arch_cached

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(catalog, "_from_cache", lambda model_id, revision: None)
    _load_arch_cached.cache_clear()


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_plans_what_its_engine_chooses(recipe, monkeypatch):
    plan_choices, plan = planned(load_spec(recipe, []))
    spec = plan.spec
    config = hf_config(spec, plan.loaded.config)
    assert _vocab(config) == plan.arch.vocab
    assert plan_choices == engine_choices(spec, plan.device, config, plan.world, plan.dtype, monkeypatch)


MATRIX_CASES = [(name, engine, device, nproc, seq_len)
                for name in families.FAMILIES for engine in ("native", "trl")
                for device, nproc, seq_len in (("cpu", 2, 512), ("cuda", 1, 8192), ("cuda", 8, 32768))]


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("families")
    return {name: families.write_model_folder(name, base / name) for name in families.FAMILIES}


@pytest.mark.parametrize("name, engine, device, nproc, seq_len", MATRIX_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}{c[3]}-{c[4]}" for c in MATRIX_CASES])
def test_family_matrix_plans_what_the_engines_choose(name, engine, device, nproc, seq_len, family_folders,
                                                      monkeypatch):
    overrides = [f"model.path={family_folders[name]}", "model.init=random", f"engine={engine}",
                 f"hardware.device={device}", f"hardware.nproc_per_node={nproc}", f"train.seq_len={seq_len}"]
    if device == "cuda":
        overrides.append("hardware.gpu=H200")
    plan_choices, plan = planned(load_spec("tiny-cpu", overrides))
    spec = plan.spec
    config = hf_config(spec, plan.loaded.config)
    assert plan_choices == engine_choices(spec, device, config, plan.world, plan.dtype, monkeypatch)


def begin_choices(begin: dict[str, Any], engine: str) -> dict[str, Any]:
    """The choices a `train_begin` event records, in the plan's terms."""
    loss = "trl-fused" if begin["loss_impl"] == TRL_LOSS_IN_EVENTS else begin["loss_impl"]
    return {"attn": begin["attn"], "fsdp": str(begin["fsdp"]).startswith("fsdp2"), "loss_impl": loss,
            "loss_chunk_tokens": begin.get("loss_chunk_tokens")}


def assert_run_chose_the_plan(spec: RunSpec, events_dir: Path, levers: dict[str, Any] | None = None) -> None:
    """Every rank's train_begin event against the plan of the same spec (and the levers an estimate planned)."""
    expected, _ = planned(spec)
    for path in sorted(events_dir.glob("rank*.jsonl")):
        begin = next(e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == "train_begin")
        assert begin_choices(begin, spec.engine) == expected, path.name
        if levers is not None:
            assert begin["levers"] == levers, path.name


def test_the_embedded_run_chose_what_was_planned(tiny_run):
    """The recipe's levers are auto: `runner estimate` of the recipe, the record's estimate and every rank's
    train_begin report the same levers, and the record's spec holds them (nothing auto left to choose again)."""
    record = json.loads(tiny_run["record"].read_text())
    planned_levers = estimate(load_spec("tiny-cpu", ["train.max_steps=12"])).levers
    assert record["estimate"]["levers"] == planned_levers
    assert "auto" not in planned_levers.values() and None not in planned_levers.values()
    spec = load_spec(record["spec"], [])
    assert resolve_levers(spec) is spec
    assert_run_chose_the_plan(spec, tiny_run["runs"] / record["id"] / "events", planned_levers)
