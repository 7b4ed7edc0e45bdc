"""The planner (runner.plan.autotune): its choice against pricing every candidate, on the catalog's architectures,
GPU types, block lengths and world sizes; what it leaves alone; and the CPU recipes' settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engines import SPEED_LEVERS as LEVERS
from runner.plan import autotune
from runner.spec import load_spec

ARCHS = {  # name: overrides on the embedded recipe
    "1.7B": ["model.id=Qwen/Qwen3-1.7B", "model.path=null"],
    "3B": ["model.id=sft-tui/llama-3.2-3b-random", "model.path=embedded:llama-3.2-3b"],
    "4B": ["model.id=Qwen/Qwen3-4B", "model.path=null"],
    "8B": ["model.id=Qwen/Qwen3-8B", "model.path=null"],
    "27B-hybrid": ["model.id=Qwen/Qwen3.5-27B", "model.path=null"],
    "120B-MoE-lora": ["model.id=openai/gpt-oss-120b", "model.path=null", "method.kind=lora"],
}
GPUS = ("H100-80GB", "H200", "B300")
LENGTHS = (8192, 32768, 131072)
WORLDS = (1, 8)
DOC_LEN, ATTN_LEN = 1500, 4000  # what the embedded conversations are like; fixed so nothing reads data


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    from runner.facts import catalog

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(catalog, "_from_cache", lambda model_id, revision: None)


def gpu_spec(arch: str, gpu: str, seq_len: int, world: int, *more: str):
    return load_spec("tiny-cpu", [*ARCHS[arch], "hardware.device=cuda", f"hardware.gpu={gpu}",
                                  f"hardware.nproc_per_node={world}", f"train.seq_len={seq_len}", *more])


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_choice_is_the_fastest_candidate_that_fits_by_brute_force(arch):
    """Every GPU type × tokens per block × 1 and 8 ranks: the planner's bisection picks what pricing every
    candidate picks, and what it picks fits under the limit (or, when nothing does, needs the least memory)."""
    fitted = 0
    for gpu in GPUS:
        for seq_len in LENGTHS:
            for world in WORLDS:
                spec = gpu_spec(arch, gpu, seq_len, world)
                space, pricer, _ = autotune.setup(spec, DOC_LEN, ATTN_LEN)
                chosen, runners_up = autotune.choose(space, pricer)
                searched = pricer.priced
                reference = autotune.brute_force(space, pricer)
                where = (gpu, seq_len, world)
                assert chosen.levers == reference.levers, where
                assert chosen.key == reference.key, where
                assert pricer.priced - searched == len(space.candidates()) > searched, where  # it did search less
                if chosen.fits:
                    fitted += 1
                    assert chosen.per_gpu <= pricer.limit, where
                    assert all(r.fits and r.key > chosen.key for r in runners_up), where
                else:  # nothing fits: no candidate needs less
                    assert not any(pricer.price(c, 0).fits for c in space.candidates()[:50]), where
    assert fitted  # the matrix is not all out of reach


def test_the_planner_takes_each_lever_from_its_row():
    """Every speed lever has one `CHOICES` row (its candidates) and the planner's search names none of them but the
    batch split and the loss: a lever the planner chooses is a row in runner/engines.py, not a line in autotune."""
    import dataclasses
    import re

    from runner.engines import CHOICES, Levers

    fields = [f for row in CHOICES for f in row.fields]
    assert sorted(fields) == sorted(LEVERS) == sorted(f.name for f in dataclasses.fields(Levers))
    source = Path(autotune.__file__).read_text()
    assert {f for f in LEVERS if re.search(rf"\b{f}\b", source)} <= {"micro_batch", "grad_accum", "loss_impl"}


def test_a_lever_the_user_sets_is_kept():
    spec = gpu_spec("4B", "H200", 32768, 1, "train.compile=false", "train.recompute_layers=30",
                    "train.loss_impl=chunked")
    tuned = autotune.tune(spec, DOC_LEN, ATTN_LEN)
    t = tuned.spec.train
    assert (t.compile, t.recompute_layers, t.loss_impl, t.activation_checkpointing) == (False, 30, "chunked", True)
    assert set(tuned.tuned) == {"recompute_attention", "offload_activations", "fsdp_one_rank", "micro_batch",
                                "grad_accum", "activation_checkpointing"}
    assert not [f for f in LEVERS if getattr(t, f) == "auto"]


def test_headroom_is_left_free():
    """A larger hardware.headroom_gib recomputes more layers; the default leaves 5% of the GPU."""
    default = autotune.tune(gpu_spec("8B", "H200", 32768, 8), DOC_LEN, ATTN_LEN)
    roomy = autotune.tune(gpu_spec("8B", "H200", 32768, 8, "hardware.headroom_gib=60"), DOC_LEN, ATTN_LEN)
    assert default.capacity - default.limit == pytest.approx(0.05 * default.capacity)
    assert roomy.chosen.per_gpu <= roomy.capacity - 60 * 2**30 < default.chosen.per_gpu
    assert roomy.chosen.step_s > default.chosen.step_s


def test_global_batch_tokens_are_split_between_micro_batch_and_accumulation():
    spec = gpu_spec("1.7B", "H200", 8192, 8, "train.global_batch_tokens=262144")
    tuned = autotune.tune(spec, DOC_LEN, ATTN_LEN)
    t = tuned.spec.train
    assert t.micro_batch * t.grad_accum * 8192 * 8 == 262144
    bad = gpu_spec("1.7B", "H200", 8192, 8, "train.global_batch_tokens=8192")
    from runner.errors import UserError

    with pytest.raises(UserError, match="multiple of 65536"):
        autotune.tune(bad, DOC_LEN, ATTN_LEN)


@pytest.mark.parametrize("recipe", ["tiny-cpu", "tiny-gpt-oss-cpu"])
def test_on_cpu_auto_picks_what_the_cpu_recipes_ran_with(recipe):
    """No recompute, no compile, the chunked loss (native), one rank unwrapped: the fields' old defaults."""
    spec = autotune.resolve_levers(load_spec(recipe, []))
    t = spec.train
    got = {f: getattr(t, f) for f in LEVERS if f != "loss_impl" or spec.engine == "native"}
    want = {"activation_checkpointing": False, "recompute_layers": None, "recompute_attention": True,
            "offload_activations": False, "compile": False, "fsdp_one_rank": False,
            "micro_batch": 1, "grad_accum": 2 if recipe == "tiny-gpt-oss-cpu" else 1}
    if spec.engine == "native":
        want["loss_impl"] = "chunked"
    assert got == want
    assert autotune.resolve_levers(spec) is spec  # nothing auto left: nothing chosen again


def test_tune_keeps_the_measured_fastest_and_an_out_of_memory_probe_does_not_fit(monkeypatch, tmp_path, capsys):
    """`runner tune --probe 3`, the probes faked: the predicted best ran out of memory, the third measured faster
    than the second; the recipe written has the third's levers."""
    from runner.cli import tune as tune_mod
    from runner.cli.main import main

    results = iter([{"fits": False, "status": "failed"}, {"fits": True, "step_s": 2.0},
                    {"fits": True, "step_s": 1.5}])
    ran = []

    def fake_probe(spec, runs_dir, records_dir):
        ran.append({f: getattr(spec.train, f) for f in LEVERS})
        return next(results)

    monkeypatch.setattr(tune_mod, "probe", fake_probe)
    out = tmp_path / "tuned.yaml"
    assert main(["tune", "tiny-cpu", "--probe", "3", "-o", str(out), "--set", "hardware.nproc_per_node=1"]) == 0
    assert len(ran) == 3 and len({tuple(r.items()) for r in ran}) == 3
    tuned = load_spec(str(out)).train
    assert {f: getattr(tuned, f) for f in LEVERS} == ran[2]
    assert "out of memory" in capsys.readouterr().out


ON_ONE_H200 = ["--set", "hardware.device=cuda", "--set", "hardware.gpu=H200", "--set", "hardware.nproc_per_node=1",
               "--set", "model.path=embedded:llama-3.2-3b", "--set", "train.seq_len=32768"]


@pytest.mark.parametrize("recipe, more, choices", [("tiny-cpu", [], True), ("tiny-cpu", ON_ONE_H200, True),
                                                   ("gpt-oss-120b-lora-8xh100", [], False)],
                         ids=["cpu", "h200", "trl-8xh100"])
def test_estimate_json_has_every_lever_resolved_and_the_runners_up(recipe, more, choices, capsys):
    """The 120B recipe sets every lever its engine (TRL, 8 ranks) has: nothing else to rank."""
    import json

    from runner.cli.main import main

    assert main(["estimate", recipe, *more, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert set(est["levers"]) == set(LEVERS)
    assert not [k for k, v in est["levers"].items() if v in ("auto", None)]
    assert est["levers_reason"] and bool(est["runners_up"]) is choices
    for row in est["runners_up"]:
        assert {"step_s", "per_gpu_gib", "fits", *LEVERS} <= set(row)
        if est["fits"] and row["fits"]:
            assert row["step_s"] >= est["step_s"]


def test_the_candidates_table_judges_every_row_by_one_rule(capsys):
    """A block only the planner's margin refuses: the chosen row and its runners-up of the same size read "tight"
    alike (the chosen one once read "yes" beside runners-up of its size that read "no"), and the reason names the
    margin."""
    from runner.cli.main import main

    folder = Path(__file__).resolve().parents[2] / "recipes" / "embedded" / "qwen3-4b"
    code = main(["estimate", "qwen3-4b-bench-h200", "--set", f"model.path={folder}",
                 "--set", "model.init=random", "--set", "train.seq_len=1048576", "--set", "hardware.gpu=H200",
                 "--set", "hardware.host_memory_gib=125.8", "--set", "hardware.nproc_per_node=1"])
    out = capsys.readouterr().out
    assert code == 0 and "nothing fits within the planner's margin (" in out
    rows = [line for line in out.splitlines() if "recompute 35 of 36 layers" in line and "│" in line]
    cells = [line.rstrip(" │").rsplit("│", 1)[1].strip() for line in rows]
    assert cells[0] == "tight" and "yes" not in cells and "tight" in cells[1:], cells
