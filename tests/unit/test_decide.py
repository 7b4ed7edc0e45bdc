"""`decide`: every engine choice made once, before launch, for every shipped recipe and the family matrix on the GPU
shapes we cannot run here (the kernels a GPU machine has are assumed): the estimator prices those decisions, the
file round-trips them, and they follow the rules (attention the family can train, FSDP wrapping, loss and its chunk,
one plan per layer). That every rank obeys them is `assert_ranks_obeyed`, run on real launches: tiny-cpu
(tiny_run), tiny-gpt-oss-cpu with both engines (tests/dist/test_engines_agree.py) and every family with both engines
in one launch (tests/dist/test_families.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.decide import Decisions, decide_run
from runner.decide.rules import (
    attention_refusal,
    chunk_tokens_for,
    fsdp_wrapped,
    fused_chunk_tokens_for,
)
from runner.events.paths import RunPaths
from runner.facts.families import family_of
from runner.plan import estimate, make_plan
from runner.plan.autotune import resolve_levers
from runner.spec import RunSpec, load_spec
from tests import families

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))


def assert_ranks_obeyed(run_dir: Path, levers: dict[str, Any] | None = None) -> Decisions:
    """Every rank's train_begin echoes the run's decisions file whole, and what it reports beside them (attention,
    loss, FSDP wrapping, levers) is what the file says."""
    paths = RunPaths(run_dir)
    written = json.loads(paths.decisions.read_text())
    ranks = sorted(paths.events.glob("rank*.jsonl"))
    assert ranks, run_dir
    for path in ranks:
        begin = next(e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == "train_begin")
        assert begin["decisions"] == written, path.name
        assert (begin["attn"], begin["loss_impl"], begin["fsdp_sharded"]) == \
            (written["attn"], written["loss_impl"], written["fsdp"]), path.name
        assert begin["levers"] == written["levers"] == (levers or written["levers"]), path.name
    return Decisions.from_dict(written)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    from runner.facts import catalog
    from runner.plan import _load_arch_cached

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(catalog, "_from_cache", lambda model_id, revision: None)
    _load_arch_cached.cache_clear()


def check_decisions(spec: RunSpec, monkeypatch) -> Decisions:
    """The plan of `spec` with its levers resolved holds its decisions, which are what a launch decides (the model
    class's declared support read through transformers; the kernels a GPU machine has, the one edge that cannot run
    here, assumed); they follow the rules and survive the file."""
    from runner.decide import support
    from runner.decide.rules import Kernels

    monkeypatch.setattr(support, "available_kernels", lambda device: Kernels.assumed(device))
    plan = make_plan(resolve_levers(spec))
    d = plan.decisions
    assert d is not None
    assert (plan.attn, plan.loss_impl, plan.sharded, plan.loss_chunk_tokens, plan.head_groups) == \
        (d.attn, d.loss_impl, d.fsdp, d.loss_chunk_tokens, d.head_groups)
    assert Decisions.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    assert d == decide_run(plan.spec, probe=True)  # the launch decides what the estimate priced
    config = plan.loaded.config
    if d.attn != "ulysses" and plan.spec.model.attn_implementation == "auto":
        assert attention_refusal(d.attn, d.device, config, packed=plan.spec.train.packing) is None, d.attn
    if d.device == "cpu":
        assert d.attn in ("sdpa", "eager")
    assert d.fsdp == fsdp_wrapped(spec.engine, plan.world, d.device, bool(plan.spec.train.fsdp_one_rank),
                                  weights_bf16=plan.dtype == "bfloat16" or spec.engine == "trl")
    vocab = plan.arch.vocab
    assert d.loss_chunk_tokens == {"chunked": chunk_tokens_for(vocab), "fused": fused_chunk_tokens_for(vocab)}.get(
        d.loss_impl)
    assert len(d.layers) == plan.arch.layers and d.recomputed == d.levers["recompute_layers"]
    if spec.engine == "trl":
        assert d.loss_impl == "trl-fused" and not d.tiled_mlp and d.head_groups == 1
    # liger-kernel's layer kernels: decided here, never by a rank (the GPU's kernels assumed installed).
    assert d.liger == (spec.engine == "trl" and d.device == "cuda" and family_of(config).liger)
    return d


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_is_decided_once_and_priced(recipe, monkeypatch):
    check_decisions(load_spec(recipe, []), monkeypatch)


MATRIX_CASES = [(name, engine, device, nproc, seq_len)
                for name in families.FAMILIES for engine in ("native", "trl")
                for device, nproc, seq_len in (("cpu", 2, 512), ("cuda", 1, 8192), ("cuda", 8, 32768))]


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("families")
    return {name: families.write_model_folder(name, base / name) for name in families.FAMILIES}


@pytest.mark.parametrize("name, engine, device, nproc, seq_len", MATRIX_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}{c[3]}-{c[4]}" for c in MATRIX_CASES])
def test_family_matrix_is_decided_once_and_priced(name, engine, device, nproc, seq_len, family_folders,
                                                  monkeypatch):
    overrides = [f"model.path={family_folders[name]}", "model.init=random", f"engine={engine}",
                 f"hardware.device={device}", f"hardware.nproc_per_node={nproc}", f"train.seq_len={seq_len}"]
    if device == "cuda":
        overrides.append("hardware.gpu=H200")
    d = check_decisions(load_spec("tiny-cpu", overrides), monkeypatch)
    if device == "cuda" and nproc == 8:
        assert d.fsdp and d.attn != "sdpa"  # 32k tokens a forward on a GPU: a kernel that reads cu_seqlens or flex


def test_an_eight_gpu_plan_offloads_what_the_host_holds_and_regenerates_the_rest():
    """The per-layer plan: inputs in host memory as far as the node's memory goes, then regenerated pairs, then the
    GPU; compiled layers never regenerate."""
    from runner.decide import Machine, decide
    from runner.facts.catalog import load_arch

    spec = resolve_levers(load_spec("tiny-cpu", ["hardware.device=cuda", "hardware.gpu=H200",
                                                 "hardware.nproc_per_node=8", "train.activation_checkpointing=true",
                                                 "train.offload_activations=true", "train.compile=false",
                                                 "train.recompute_layers=null"]))
    arch = load_arch(spec).arch
    layer_input = 2 * arch.hidden * spec.train.seq_len * int(spec.train.micro_batch)
    from runner.facts.gpus import HOST_RANK_BYTES, HOST_RESERVE_BYTES

    host = HOST_RESERVE_BYTES + 8 * HOST_RANK_BYTES + 8 * layer_input * 1.5  # one layer's input per rank, and half
    d = decide(spec, arch, Machine("cuda", 8, 8, 141 * 2**30, host))
    assert [layer.input for layer in d.layers] == ["source", "regenerated"] + ["gpu"] * (arch.layers - 2)
    assert d.offloaded_layers == 1 and d.regenerated_layers == 1
    compiled = resolve_levers(load_spec("tiny-cpu", ["hardware.device=cuda", "hardware.gpu=H200",
                                                     "hardware.nproc_per_node=8", "train.activation_checkpointing=true",
                                                     "train.offload_activations=true", "train.compile=true",
                                                     "train.recompute_layers=null"]))
    d = decide(compiled, arch, Machine("cuda", 8, 8, 141 * 2**30, host))
    assert [layer.input for layer in d.layers] == ["host"] + ["gpu"] * (arch.layers - 1)


def test_liger_is_decided_where_the_run_is_decided():
    """A node without liger-kernel decides without it; decisions written before liger was one read as without."""
    from runner.decide import Machine, decide
    from runner.decide.rules import Kernels
    from runner.facts.catalog import load_arch

    spec = resolve_levers(load_spec("tiny-cpu", ["engine=trl", "hardware.device=cuda", "hardware.gpu=H200",
                                                 "hardware.nproc_per_node=1"]))
    loaded = load_arch(spec)
    with_liger, without = (decide(spec, loaded.arch, Machine("cuda", 1, 1, 141 * 2**30, None,
                                                             Kernels(varlen=True, liger=installed)), loaded.config)
                           for installed in (True, False))
    assert with_liger.liger and not without.liger
    old = with_liger.to_dict()
    del old["liger"]
    assert not Decisions.from_dict(old).liger


def test_a_decisions_file_of_another_format_is_refused():
    d = decide_run(resolve_levers(load_spec("tiny-cpu", [])))
    with pytest.raises(ValueError, match="this runner reads"):
        Decisions.from_dict({**d.to_dict(), "format": "sft-tui.decisions/0"})
    with pytest.raises(ValueError, match="unknown keys"):
        Decisions.from_dict({**d.to_dict(), "new_lever": True})


@pytest.mark.dist
def test_the_embedded_run_obeyed_what_was_decided_and_planned(tiny_run):
    """The recipe's levers are auto: `runner estimate` of the recipe, the record's estimate, the decisions file and
    every rank's train_begin hold the same levers; the record keeps the decisions file whole."""
    from runner.record import records

    record = json.loads(tiny_run["record"].read_text())
    planned_levers = estimate(load_spec("tiny-cpu", ["train.max_steps=12"])).levers
    assert record["estimate"]["levers"] == planned_levers
    assert "auto" not in planned_levers.values() and None not in planned_levers.values()
    spec = load_spec(record["spec"], [])
    assert resolve_levers(spec) is spec
    run_dir = tiny_run["runs"] / record["id"]
    d = assert_ranks_obeyed(run_dir, planned_levers)
    assert records.load(tiny_run["record"])["decisions"] == d.to_dict()
    assert make_plan(spec).decisions == d


def test_a_launch_writes_the_spec_and_its_decisions_once(tmp_path):
    """The spawning view writes both files; the supervisor (and another node on a shared filesystem) finds them and
    writes neither again; a resume that goes on past its steps rewrites the spec and keeps the decisions."""
    from runner.launch.command import prepare_run
    from runner.spec import resolve

    paths = RunPaths(tmp_path / "run")
    spec, decided = prepare_run(paths, resolve(load_spec("tiny-cpu", []), cuda_available=False, gpu_count=0))
    written = {p: p.stat().st_ino for p in (paths.spec, paths.decisions)}
    again, kept = prepare_run(paths, spec)
    assert (again, kept) == (spec, decided) and {p: p.stat().st_ino for p in written} == written
    assert Decisions.read(paths.decisions) == decided and decided.device == "cpu"
    longer = spec.model_copy(update={"train": spec.train.model_copy(update={"max_steps": 999})})
    prepare_run(paths, longer)
    assert json.loads(paths.spec.read_text())["train"]["max_steps"] == 999
    assert paths.decisions.stat().st_ino == written[paths.decisions]


def test_a_layer_plan_says_what_it_keeps_and_reruns_in_the_estimators_terms():
    """The estimator prices `LayerPlan.kept` and `reruns_attention` and names no lever: every name a plan keeps
    has its bytes beside the decisions."""
    from runner.decide.decisions import KEPT_BYTES_PER_TOKEN, LayerPlan

    cases = {
        LayerPlan(False, False, "kept"): ((), False),  # keeps every activation, reruns nothing
        LayerPlan(True, False, "gpu"): (("input",), True),
        LayerPlan(True, True, "gpu"): (("input", "attention_out"), False),
        LayerPlan(True, False, "host"): ((), True),  # its input waits in host memory
        LayerPlan(True, False, "regenerated"): ((), True),
    }
    for plan, (kept, reruns) in cases.items():
        assert (plan.kept, plan.reruns_attention) == (kept, reruns), plan
        assert set(plan.kept) <= set(KEPT_BYTES_PER_TOKEN)
    # Recipes' own plans keep only priced names.
    for name in ("qwen3.8-27b-full-8xb300", "qwen3.5-hybrid-reduced-h200"):
        plan = make_plan(resolve_levers(load_spec(name, ["train.recompute_attention=false"])))
        assert {n for layer in plan.layers for n in layer.kept} <= set(KEPT_BYTES_PER_TOKEN)
