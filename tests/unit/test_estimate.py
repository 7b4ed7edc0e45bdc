"""Estimator: catalog parameter counts, the notebooks' memory claims, monotonic properties, and `runner estimate`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.facts import catalog
from runner.facts.catalog import CATALOG, PUBLISHED_PARAMS, catalog_arch, gpu_type, load_arch, match_gpu_name, parse_arch
from runner.cli.main import main
from runner.errors import UserError
from runner.plan import estimate, lora_params, parse_sweep, sweep
from runner.engines import PLAIN
from runner.spec import RECIPES_DIR, load_spec

REPO = Path(__file__).resolve().parents[2]
R27 = "qwen3.8-27b-full-8xb300"
R120 = "gpt-oss-120b-lora-8xh100"
R17 = "qwen3-1.7b-full-h200"

# The speed levers are auto (the planner's choice is tests/unit/test_autotune.py's); these tests price given
# settings: a lever left auto takes the value the field had before auto, and the bench recipes the values they
# were measured with before they relied on auto (benchmarks/autotune-h200.md compares them with the planner's).
BEFORE_AUTO = PLAIN
HAND_SET = {
    "qwen3-1.7b-bench-h200": {"activation_checkpointing": True, "recompute_layers": 24, "loss_impl": "fused",
                              "compile": True},
    "qwen3-4b-bench-h200": {"activation_checkpointing": True, "recompute_layers": 30, "loss_impl": "fused",
                            "compile": True},
    "llama-3.2-3b-bench-h200": {"activation_checkpointing": True, "recompute_layers": 20,
                                "recompute_attention": False, "loss_impl": "fused", "compile": True},
}
TRL_HAND_SET = ("activation_checkpointing", "compile")  # what the bench recipes' TRL rows ran with of those
# A bench recipe's run is named after its data once `--set dataset.path=...` changes it (runner.naming): its model
# (one per bench recipe) says which recipe it came from.
BENCH_RECIPE_OF_MODEL = {"sft-tui/qwen3-1.7b-random": "qwen3-1.7b-bench-h200",
                         "sft-tui/qwen3-4b-random": "qwen3-4b-bench-h200",
                         "sft-tui/llama-3.2-3b-random": "llama-3.2-3b-bench-h200"}


def as_set(spec):
    """The spec with every lever still auto at its value before auto (HAND_SET's for the bench recipes)."""
    data = spec.to_dict()
    hand = HAND_SET.get(spec.name) or HAND_SET.get(BENCH_RECIPE_OF_MODEL.get(spec.model.id, ""), {})
    if spec.engine != "native":
        hand = {k: v for k, v in hand.items() if k in TRL_HAND_SET}
    for field, value in {**BEFORE_AUTO, **hand}.items():
        if data["train"][field] == "auto":
            data["train"][field] = value
    return spec.model_validate(data)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub must not be called with HF_HUB_OFFLINE=1")

    monkeypatch.setattr(catalog, "_from_hub", no_hub)
    # An empty cache: every hub id resolves through the built-in catalog.
    monkeypatch.setattr(catalog, "_from_cache", lambda model_id, revision: None)
    from runner import plan as est_mod

    est_mod._load_arch_cached.cache_clear()
    # The notebooks install flash-linear-attention (their claims are about that setup); the machine running the
    # tests may not have it. The H200 measurements below say which setup they ran in.
    monkeypatch.setattr("runner.plan.choices.gdn_kernels_installed", lambda: True)
    from runner.plan import autotune, core

    monkeypatch.setattr(core, "tune", lambda spec, *lengths: autotune.tune(as_set(spec), *lengths))


def est(ref: str, *overrides: str, **kw):
    return estimate(load_spec(ref, list(overrides)), **kw)


# ---------------------------------------------------------------------------------------------
# Parameter counts


@pytest.mark.parametrize("model_id", ["Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
                                      "Qwen/Qwen3-30B-A3B", "openai/gpt-oss-120b", "openai/gpt-oss-20b",
                                      "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B",
                                      "mistralai/Mistral-7B-v0.3"])
def test_catalog_params_match_published_totals_within_1pct(model_id):
    got = catalog_arch(model_id).params_total
    assert abs(got - PUBLISHED_PARAMS[model_id]) / PUBLISHED_PARAMS[model_id] < 0.01, (model_id, got)


def test_exact_counts_equal_transformers_module_counts():
    # Counted from transformers' own modules on the meta device (transformers 5.24) when the catalog was built.
    exact = {"Qwen/Qwen3-8B": 8_190_735_360, "Qwen/Qwen3-1.7B": 1_720_574_976, "openai/gpt-oss-120b": 116_829_156_672,
             "openai/gpt-oss-20b": 20_914_757_184, "Qwen/Qwen3-30B-A3B": 30_532_122_624,
             "meta-llama/Llama-3.1-8B": 8_030_261_248, "Qwen/Qwen3.8-27B": 27_356_728_560}
    for model_id, n in exact.items():
        assert catalog_arch(model_id).params_total == n, model_id


def test_moe_active_params():
    a = catalog_arch("openai/gpt-oss-120b")
    # OpenAI's 5.1B active excludes the 0.58B input embedding.
    assert abs((a.params_active - a.embed_params) - 5.13e9) / 5.13e9 < 0.01
    q = catalog_arch("Qwen/Qwen3-30B-A3B")
    assert abs(q.params_active - 3.3e9) / 3.3e9 < 0.02


def test_embedded_model_count_equals_its_safetensors():
    from safetensors import safe_open

    model_dir = RECIPES_DIR / "embedded" / "model"
    arch = parse_arch(json.loads((model_dir / "config.json").read_text()))
    with safe_open(str(model_dir / "model.safetensors"), "np") as f:
        names = list(f.keys())
        numel = sum(math.prod(f.get_slice(k).get_shape()) for k in names)
    if arch.tied_embeddings and "lm_head.weight" in names:
        numel -= arch.embed_params  # a tied head stored twice is one parameter
    assert arch.params_total == numel


def test_hybrid_vlm_config_is_parsed_from_text_config():
    a = catalog_arch("Qwen/Qwen3.8-27B")
    assert (a.model_type, a.hidden, a.layers, a.vocab) == ("qwen3_5", 5120, 64, 248320)
    assert a.layer_types.count("linear_attention") == 48 and a.layer_types.count("full_attention") == 16
    assert a.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert a.vision_params == 460_730_096  # counted, never trained: text-only SFT
    assert a.params_total - a.vision_params == a.text_params
    assert not a.approximate


def test_gpt_oss_layers_alternate_sliding_and_full():
    a = catalog_arch("openai/gpt-oss-120b")
    assert a.layer_types[:2] == ("sliding_attention", "full_attention") and a.sliding_window == 128
    assert (a.num_experts, a.experts_per_token, a.attention_sinks) == (128, 4, True)


def test_unknown_model_type_is_approximate_with_reason():
    a = parse_arch({"model_type": "mystery", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
                    "intermediate_size": 1024, "vocab_size": 1000})
    assert a.approximate and "mystery" in a.approximate_reasons[0]


def test_config_without_hidden_size_names_the_missing_fields():
    with pytest.raises(UserError, match="hidden_size"):
        parse_arch({"model_type": "x", "num_hidden_layers": 4})
    with pytest.raises(UserError, match="hidden_size or num_hidden_layers"):
        parse_arch({"text_config": {"model_type": "x"}})


def test_lora_params_follow_peft_shapes():
    a = catalog_arch("openai/gpt-oss-120b")
    spec = load_spec(R120)
    n, stack, _ = lora_params(a, spec.method.lora)
    attn = 32 * ((2880 + 4096) + 2 * (2880 + 512) + (4096 + 2880))  # q, k, v, o at r 32
    experts = 8 * 128 * ((2880 + 5760) + (2880 + 2880))  # ParamWrapper: r·E·(in + out) per expert tensor, r 8
    assert n == 36 * (attn + experts)
    assert stack == 128 * (2880 * 5760 + 2880 * 2880)


# ---------------------------------------------------------------------------------------------
# GPU types


def test_gpu_types_and_errors():
    assert gpu_type("h100-80gb").name == "H100-80GB" and gpu_type("H100").name == "H100-80GB"
    assert gpu_type("B300").memory_gib == pytest.approx(268.59, abs=0.01)
    assert gpu_type("H200").ceiling_tflops == 790.0
    with pytest.raises(UserError, match="did you mean 'H200'"):
        gpu_type("H2000")
    with pytest.raises(UserError, match="A100-40GB"):
        gpu_type("A100")  # ambiguous family: the message lists the names
    assert match_gpu_name("NVIDIA H100 80GB HBM3").name == "H100-80GB"
    assert match_gpu_name("NVIDIA B300 SXM6 AC").name == "B300"
    assert match_gpu_name("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert match_gpu_name("Tesla T4") is None


def test_gpu_auto_without_a_gpu_asks_for_a_type(monkeypatch):
    monkeypatch.setattr("runner.facts.nvml.detect_gpus", lambda: [])
    with pytest.raises(UserError, match="hardware.gpu=H100-80GB"):
        est(R27, "hardware.gpu=auto", "hardware.device=auto")


def test_gpu_auto_detects_type_and_count(monkeypatch):
    gpus = [{"index": i, "name": "NVIDIA H200", "mem_total_gib": 140.4} for i in range(4)]
    monkeypatch.setattr("runner.facts.nvml.detect_gpus", lambda: gpus)
    e = est(R17, "hardware.gpu=auto", "hardware.nproc_per_node=auto")
    assert (e.gpu, e.world_size) == ("H200", 4)


# ---------------------------------------------------------------------------------------------
# The notebooks' claims, from the catalog alone


def test_27b_fits_8k_not_32k_on_h100_and_32k_on_b300():
    assert est(R27, "hardware.gpu=H100-80GB", "train.seq_len=8192").fits
    h100_32k = est(R27, "hardware.gpu=H100-80GB")
    assert not h100_32k.fits and h100_32k.verdict == "does not fit"
    assert "chunked" in h100_32k.suggestion
    b300 = est(R27)
    assert b300.fits and b300.gpu == "B300" and b300.world_size == 8
    assert b300.arch["params_total"] == 27_356_728_560


def test_27b_full_pass_says_where_its_steps_and_rate_come_from():
    """The notebook's 995 steps are an input (ultrachat's token count is taken from them), and no B300 was
    measured: the estimate must say both rather than claim the notebook's ~2.5 h as a prediction."""
    e = est(R27)
    assert e.steps == 995 and e.tokens_per_step == 8 * 32768
    assert "the 27B notebook's 995 steps" in e.approximate_reason
    assert e.approximate and "GPU B300" in e.approximate_scope and "8 ranks" in e.approximate_scope
    assert e.hfu_source.startswith("the H200 figure, for lack of a measurement here")


def test_gpt_oss_120b_lora_fits_8xh100_and_full_does_not():
    lora = est(R120)
    assert lora.fits and lora.gpu == "H100-80GB" and lora.world_size == 8
    assert lora.breakdown["lora"] > 0 and lora.breakdown["grads"] == 0
    full = est(R120, "method.kind=full")
    assert not full.fits


def test_precision_model_per_engine():
    a = catalog_arch("Qwen/Qwen3-8B")
    n = 8
    states = lambda e: (e.breakdown["params"] + e.breakdown["optimizer"]) * 2**30  # noqa: E731 (grads may be freed)
    native = est(R17, "model.id=Qwen/Qwen3-8B", f"hardware.nproc_per_node={n}", "hardware.gpu=H100-80GB",
                 "train.seq_len=2048", "train.grad_accum=2")
    trl = est(R17, "model.id=Qwen/Qwen3-8B", f"hardware.nproc_per_node={n}", "hardware.gpu=H100-80GB",
              "train.seq_len=2048", "train.grad_accum=2", "engine=trl")
    # grad_accum > 1 keeps the sharded grads through the forward: params + grads + AdamW at the peak.
    assert (native.breakdown["params"] + native.breakdown["grads"] + native.breakdown["optimizer"]) == \
        pytest.approx(8 * a.params_total / n / 2**30, rel=0.01)
    assert (trl.breakdown["params"] + trl.breakdown["grads"] + trl.breakdown["optimizer"]) == \
        pytest.approx(16 * a.params_total / n / 2**30, rel=0.01)
    assert states(trl) > states(native)


def test_cpu_run_estimates_host_memory():
    e = est("tiny-cpu")
    assert e.device == "cpu" and e.gpu == "cpu" and e.approximate and e.fits
    assert e.world_size == 2 and e.steps == 150


def test_sdpa_on_packed_blocks_costs_memory_and_time():
    flex = est(R17, "model.attn_implementation=flex_attention")
    sdpa = est(R17, "model.attn_implementation=sdpa")
    assert sdpa.per_gpu_gib > flex.per_gpu_gib and sdpa.step_s > 2 * flex.step_s


def test_reference_h200_peaks_within_5pct():
    # references.md, the H200 plain loop: fp32 weights with bf16 compute, full loss, flex attention.
    ref = {8192: 36.5, 32768: 88.0}
    for seq, measured in ref.items():
        e = est(R17, "model.dtype=float32", "train.loss_impl=full", f"train.seq_len={seq}")
        assert abs(e.per_gpu_allocated_gib - measured) / measured < 0.05, (seq, e.per_gpu_allocated_gib)


# ---------------------------------------------------------------------------------------------
# Properties

MODELS = ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b", "Qwen/Qwen3.8-27B",
          "meta-llama/Llama-3.1-8B"]
spec_args = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS),
    "gpu": st.sampled_from(["H100-80GB", "H200", "B300", "A100-40GB"]),
    "engine": st.sampled_from(["native", "trl"]),
    "attn": st.sampled_from(["flex_attention", "sdpa", "eager", "flash_attention_2"]),
    "loss": st.sampled_from(["auto", "full", "chunked"]),
    "ac": st.booleans(),
    "method": st.sampled_from(["full", "lora"]),
    "seq": st.integers(min_value=256, max_value=65536),
    "nproc": st.sampled_from([2, 4, 8]),
})


def _spec(a, **change):
    a = {**a, **change}
    return load_spec(R17, [f"model.id={a['model']}", f"hardware.gpu={a['gpu']}", f"engine={a['engine']}",
                           f"model.attn_implementation={a['attn']}", f"train.loss_impl={a['loss']}",
                           f"train.activation_checkpointing={str(a['ac']).lower()}", f"method.kind={a['method']}",
                           f"train.seq_len={a['seq']}", f"hardware.nproc_per_node={a['nproc']}",
                           "train.max_steps=10", f"train.tiled_mlp={a.get('tiled', 'auto')}"])


def _gib(a, **change) -> float:
    return estimate(_spec(a, **change), suggest=False).per_gpu_gib


PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(spec_args, st.integers(min_value=256, max_value=65536))
def test_memory_rises_with_tokens_per_block(a, other):
    # With the levers held: `auto` tiles the MLP once a layer's intermediates outgrow a share of the GPU, and a
    # longer block may then need less (Qwen3-8B on 2 A100-40GB: 196 GiB at 27,000 tokens, 159 at 27,500).
    lo, hi = sorted((a["seq"], other))
    for tiled in ("false", "true"):
        assert _gib(a, seq=lo, tiled=tiled) <= _gib(a, seq=hi, tiled=tiled)


@PROPS
@given(spec_args)
def test_memory_falls_with_more_gpus(a):
    values = [_gib(a, nproc=n) for n in (2, 4, 8)]
    assert values == sorted(values, reverse=True)


@PROPS
@given(spec_args)
def test_checkpointing_never_increases_memory(a):
    # Except by the first layer's kept input: at that layer's backward the checkpoint still holds the input it
    # recomputes from, which the plain forward does not keep (a few MB; it decides the peak only when the
    # gradients outweigh the activations, at short blocks).
    layer_input_gib = a["seq"] * catalog_arch(a["model"]).hidden * 2 / 2**30
    assert _gib(a, ac=True) <= _gib(a, ac=False) + 1.15 * layer_input_gib + 0.01


@PROPS
@given(spec_args)
def test_lora_never_uses_more_than_full(a):
    assert _gib(a, method="lora") <= _gib(a, method="full")


# ---------------------------------------------------------------------------------------------
# Loading the architecture


def test_load_arch_order(monkeypatch, tmp_path):
    spec = load_spec("tiny-cpu")
    assert load_arch(spec).source == "path"
    spec = load_spec(R27)
    assert load_arch(spec).source == "catalog"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CATALOG["Qwen/Qwen3-1.7B"]))
    monkeypatch.setattr(catalog, "_from_cache", lambda model_id, revision: cfg)
    loaded = load_arch(spec)
    assert loaded.source == "cache" and loaded.arch.hidden == 2048
    monkeypatch.setattr(catalog, "_from_cache", lambda model_id, revision: None)
    with pytest.raises(UserError, match="not in the built-in catalog"):
        load_arch(load_spec(R27, ["model.id=someone/unknown-model"]))


# ---------------------------------------------------------------------------------------------
# CLI

REQUIRED = {"fits", "verdict", "headroom_gib", "per_gpu_gib", "per_gpu_allocated_gib", "gpu_memory_gib", "gpu",
            "world_size", "breakdown", "step_s", "steps", "total_s", "tokens_per_step", "flops_per_step",
            "hfu_assumed", "approximate", "approximate_reason", "suggestion", "arch"}
PARTS = {"params", "grads", "optimizer", "fsdp_buffers", "activations", "logits_loss", "lora", "cuda_context_nccl",
         "fragmentation"}


def test_cli_json_keys(capsys):
    assert main(["estimate", R27, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert REQUIRED <= set(out) and set(out["breakdown"]) == PARTS
    assert out["per_gpu_gib"] == pytest.approx(sum(out["breakdown"].values()), abs=0.05)
    assert set(out["arch"]) >= {"model_type", "params_total", "params_active", "layers", "vocab"}


def test_cli_sweep_gives_every_combination(capsys):
    assert main(["estimate", R27, "--json", "--sweep", "train.seq_len=2048,8192,32768",
                 "--sweep", "hardware.gpu=H100-80GB,B300"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 6
    assert [(r["train.seq_len"], r["hardware.gpu"]) for r in rows] == \
        [(s, g) for s in (2048, 8192, 32768) for g in ("H100-80GB", "B300")]
    fits = {(r["train.seq_len"], r["hardware.gpu"]): r["fits"] for r in rows}
    assert fits[(8192, "H100-80GB")] and not fits[(32768, "H100-80GB")] and fits[(32768, "B300")]


def test_cli_table(capsys):
    assert main(["estimate", R120]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "fsdp_buffers" in out and "s/step" in out


@pytest.mark.parametrize("args, message", [
    (["--set", "hardware.gpu=H1000"], "unknown GPU type 'H1000'"),
    (["--set", "hardware.nproc_per_node=0"], "hardware.nproc_per_node"),
    (["--sweep", "train.seq_len="], "has no values"),
    (["--sweep", "train.seq_length=1,2"], "train.seq_length"),
    (["--sweep", "seq_len"], "has no '='"),
    (["--sweep", "train.seq_len=0,8"], "train.seq_len"),
])
def test_cli_bad_input_exits_2_without_traceback(capsys, args, message):
    assert main(["estimate", R27, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_config_missing_fields_exits_2(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "odd", "vocab_size": 100}))
    assert main(["estimate", R17, "--set", f"model.path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "hidden_size or num_hidden_layers" in err and "Traceback" not in err


def test_parse_sweep_types_values():
    assert parse_sweep("train.seq_len=8192,32768") == ("train.seq_len", ["8192", "32768"])
    rows = sweep(load_spec(R17), [parse_sweep("train.activation_checkpointing=true,false")])
    assert [r["train.activation_checkpointing"] for r in rows] == [True, False]


@pytest.mark.launches
def test_cli_is_fast_offline_without_gpu():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = ("import sys, runner.cli.main; rc = runner.cli.main.main(['estimate', %r, '--json']); "
            "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules), file=sys.stderr); "
            "sys.exit(rc)") % R27
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpu"] == "B300"
    assert proc.stderr.strip().splitlines()[-1] == "[]"  # no torch, transformers or textual on the default path
    assert elapsed < 4.0, f"runner estimate took {elapsed:.2f} s"  # loose guard; ~0.5 s measured on 2 cores


# ---------------------------------------------------------------------------------------------
# Measured peaks on one H200: every row of benchmarks/memory-calibration-h200.json (either engine's train(),
# rebuilt from the row's overrides as benchmarks/calibrate_memory.py builds them), of benchmarks/native-h200.json
# (benchmarks/native_gpu_check.py rows, rebuilt from the recipe of the same architecture) and of every `runner
# bench` result in benchmarks/bench-h200 (rebuilt from the command and the row's overrides). Nothing runs: the
# estimate of each spec is compared with the peak torch measured. benchmarks/memory-calibration-h200.md explains
# the rows outside 10 %.

BENCH = REPO / "benchmarks"
ALLOC_BOUND = 0.10
RESERVED_BOUND = 0.15
# Rows outside the bounds above, with the bound each achieves (estimator-notes.md, "Rows outside 10 %").
ALLOC_EXCEPTIONS: dict[str, float] = {}  # none: every row is within 10 % of its allocated peak
RESERVED_EXCEPTIONS = {
    # 11.5 GiB of the reserved peak are cached free blocks (reserved 32.2 vs 20.7 allocated): the expert stacks'
    # all-gathered copies leave holes the fragmentation share does not cover.
    "calibration gpt-oss-2l full 2k ckpt": 0.21,
    # 20 of 28 layers keep their activations at 8k: 26.6 GiB reserved against 32.0 counted (allocated is within
    # 10%). The fragmentation share was fitted where most layers recompute; not refitted for this pattern.
    "bench bench-1p7b-8k native 8192": 0.21,
    "bench bench-1p7b-8k native 8192 run 2": 0.21,
    "bench bench-1p7b-8k-b native 8192": 0.21,
    "bench bench-1p7b-8k-b native 8192 run 2": 0.21,
    "bench bench-1p7b-8k-native-gcfreeze native 8192": 0.21,
    "bench bench-1p7b-8k-native-gcfreeze native 8192 run 2": 0.21,
    "bench bench-1p7b-8k-native-gcfreeze native 8192 run 3": 0.21,
    # The same at 8k with one rank unwrapped: 22.4 GiB reserved against 26.9 counted (allocated within 6.2%).
    "bench bench-1p7b-8k-unwrapped native 8192": 0.21,
    # The same pattern on the bench data (8 of 28 layers recompute): 22.4 GiB reserved against 26.9 counted
    # (allocated 22.1 against 23.4, within 6%).
    "bench longchat-tail-1p7b-8k native 8192": 0.21,
    "bench longchat-tail-1p7b-8k native 8192 run 2": 0.21,
    "bench longchat-recompile-1p7b-8k native 8192": 0.21,
    "bench longchat-recompile-1p7b-8k-native-b native 8192": 0.21,
    "bench longchat-1p7b-8k-native native 8192": 0.21,
    "bench longchat-1p7b-8k-native-b native 8192": 0.21,
    "bench lever-1p7b-8k-loss-recompile native 8192": 0.21,
    "bench bench-1p7b-8k-unwrapped native 8192 run 2": 0.21,
    "bench bench-1p7b-8k-unwrapped-b native 8192": 0.21,
    "bench bench-1p7b-8k-unwrapped-b native 8192 run 2": 0.21,
    "bench bench-1p7b-8k-plain native 8192": 0.21,
    "bench bench-1p7b-8k-plain native 8192 run 2": 0.21,
    "bench bench-1p7b-8k-plain-b native 8192": 0.21,
    "bench bench-1p7b-8k-plain-b native 8192 run 2": 0.21,
}
NATIVE_RECIPES = {"qwen3-1.7b": R17, "qwen3.5-hybrid-reduced": "qwen3.5-hybrid-reduced-h200"}
BENCH_RUNS = sorted((BENCH / "bench-h200").glob("*.json"))


def _as_measured(row: dict) -> list[str]:
    """Whether the row's one rank ran in FSDP2, as it did: from what the run said (`choices.fsdp`) where the result
    keeps it; results from before one native rank trained the plain module lack the spec field too (wrapped). And
    the MLP untiled where the row predates tiling."""
    said = row.get("choices", {}).get("fsdp")
    # Results from before the MLP could be tiled ran it untiled (their spec has no tiled_mlp).
    untiled = [] if "tiled_mlp" in row.get("spec", {}) else ["train.tiled_mlp=false"]
    if said is not None:
        return [f"train.fsdp_one_rank={'true' if said.startswith('fsdp2') else 'false'}", *untiled]
    return untiled + ([] if "fsdp_one_rank" in row.get("spec", {}) else ["train.fsdp_one_rank=true"])


def _recompute_as_measured(row: dict) -> list[str]:
    """A row's speed levers as it ran (the recipe's settings may have moved on since): from the spec the row
    recorded ("auto" there is the loss before auto: chunked). Recompute levers for native rows only."""
    from runner.engines import SPEED_LEVERS as LEVERS

    spec = row.get("spec", {})
    native_only = ("recompute_layers", "recompute_attention", "offload_activations")
    fields = [f for f in LEVERS if row["engine"] == "native" or f not in native_only]
    return [f"train.{f}={'chunked' if spec[f] == 'auto' else str(spec[f]).lower() if isinstance(spec[f], bool) else spec[f]}"
            for f in fields if f in spec and spec[f] is not None]


def _data_as_measured(row: dict) -> list[str]:
    """The data a bench row ran on when its command did not name one: rows without document statistics
    (`doc_tokens`) were measured when the bench recipes trained on the embedded chat data with the packing their
    spec says (wrapped before the field existed)."""
    if "doc_tokens" in row:
        return []
    return ["dataset.path=embedded:data/chat.jsonl", "dataset.id=sft-tui/tiny-chat",
            f"train.packing_strategy={row.get('spec', {}).get('packing_strategy', 'wrapped')}"]


def _calibration_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("calibrate_memory", BENCH / "calibrate_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def calibration_configs(tmp_path_factory):
    """The script's own configurations: model folders (config + tokenizer) made under a temporary root."""
    return dict(_calibration_script().configs(tmp_path_factory.mktemp("calib"), quick=False))


# Datasets the bench commands name by a local path, and how they were made (benchmarks/make_long_chat.py, seeded).
GENERATED_DATA = {"/tmp/long.jsonl": 1200}


@pytest.fixture(scope="module")
def generated_data(tmp_path_factory):
    """Rebuilds, once and only if a row asks, the generated datasets the bench commands read."""
    made: dict[str, str] = {}

    def path_for(original: str) -> str:
        if original not in made:
            import importlib.util

            spec = importlib.util.spec_from_file_location("make_long_chat", BENCH / "make_long_chat.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            out = tmp_path_factory.mktemp("data") / Path(original).name
            module.make_uniform(out, rows=GENERATED_DATA[original], min_tokens=400, max_tokens=3000)
            made[original] = str(out)
        return made[original]

    return path_for


def _measured_rows() -> list[tuple[str, dict]]:
    rows = [(f"calibration {r['name']}", r)
            for r in json.loads((BENCH / "memory-calibration-h200.json").read_text())["rows"] if "peak_alloc_gib" in r]
    for run in json.loads((BENCH / "native-h200.json").read_text())["runs"]:
        for r in run["rows"]:
            if "peak_alloc_gib" in r:
                rows.append((f"native {r['model']} {r['seq_len']} {r['attn']}{' compile' if r['compile'] else ''}", r))
    for path in BENCH_RUNS:
        result = json.loads(path.read_text())
        seen: dict[str, int] = {}
        for r in result["rows"]:
            if r.get("peak_alloc_gib") is not None:
                name = f"bench {path.stem} {r['engine']} {r['seq_len']}"
                swept = [o for o in r["overrides"] if not o.startswith(("engine=", "train.seq_len="))]
                name += "".join(f" {o}" for o in swept)  # a --sweep over another field
                seen[name] = seen.get(name, 0) + 1
                if seen[name] > 1:  # --repeat: the same configuration run again
                    name += f" run {seen[name]}"
                rows.append((name, {**r, "command": result["command"], "versions": result.get("versions", {}),
                                    "peak_tflops": result.get("peak_tflops")}))
    return rows


MEASURED = _measured_rows()


def _bench_command(command: str, data_path) -> tuple[str, list[str]]:
    """The spec and the --set overrides of a recorded `runner bench` command, generated datasets rebuilt here."""
    import shlex

    argv = shlex.split(command)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    sets = [f"dataset.path={data_path(v.split('=', 1)[1])}" if v.split("=", 1)[1] in GENERATED_DATA else v
            for v in sets]
    # Every option of `runner bench` takes a value: the spec is the first word that is neither.
    spec_ref = next(w for prev, w in zip(argv[1:], argv[2:]) if not w.startswith("--") and not prev.startswith("--"))
    return spec_ref, sets


def _measured_spec(name: str, row: dict, configs: dict, data_path=None):
    from runner.spec import resolve

    if name.startswith("bench "):
        spec_ref, sets = _bench_command(row["command"], data_path)
        from runner.engines import LEVERS, engine_for

        # A row runs without the levers its engine lacks (the bench drops them, and says so in newer results).
        left_out = [f"{f}={LEVERS[f].off}" for f in engine_for(row["engine"]).lacks]
        # Rows measured with flash-attn-4 installed ran their varlen attention through it.
        kernel = ["model.varlen_kernel=flash-attn-4"] if row.get("versions", {}).get("flash-attn-4") else []
        return load_spec(spec_ref, [*_data_as_measured(row), *_recompute_as_measured(row), *sets, *row["overrides"],
                                    *left_out, *_as_measured(row), *kernel])
    if name.startswith("calibration "):
        ours = configs[row["name"]]
        # The row's overrides, with its temporary model folder swapped for the one made here; the rest must be
        # what the script builds today, or the row no longer describes what the script would run.
        # (Rows measured before the script said train.fsdp_one_rank=true ran wrapped all the same.)
        same = ("model.path=", "train.fsdp_one_rank=")
        assert [o for o in row["overrides"] if not o.startswith(same)] == [o for o in ours if not o.startswith(same)]
        overrides = [o if not o.startswith("model.path=") else next(x for x in ours if x.startswith("model.path="))
                     for o in row["overrides"]]
        # Measured when one rank always ran FSDP2.
        return resolve(load_spec("tiny-cpu", [*overrides, "hardware.device=cuda", "hardware.nproc_per_node=1",
                                              "hardware.gpu=H200", "train.fsdp_one_rank=true"]),
                       cuda_available=True, gpu_count=1)
    spec = load_spec(NATIVE_RECIPES[row["model"]], ["model.dtype=bfloat16", f"train.seq_len={row['seq_len']}",
                                                     "train.fsdp_one_rank=true",
                                                     f"model.attn_implementation={row['attn']}",
                                                     f"train.compile={str(row['compile']).lower()}"])
    arch = load_arch(spec).arch
    # The script's params count the input embedding only when it is the LM head's weight too.
    assert row["params"] == arch.text_params - (0 if arch.tied_embeddings else arch.embed_params)
    return spec


def test_measured_rows_are_all_there():
    names = [n for n, _ in MEASURED]
    assert len(names) == 155 and len(set(names)) == 155
    assert {n.split()[0] for n in names} == {"calibration", "native", "bench"}
    assert set(ALLOC_EXCEPTIONS) <= set(names) and set(RESERVED_EXCEPTIONS) <= set(names)
    assert LONG_DOCUMENT_EXCEPTIONS <= set(names)


@pytest.mark.parametrize("name, row", MEASURED, ids=[n for n, _ in MEASURED])
def test_estimate_matches_measured_h200_peak(name, row, calibration_configs, generated_data, monkeypatch):

    # flash-linear-attention was not installed on the H200 (the hybrid rows ran the PyTorch path).
    monkeypatch.setattr("runner.plan.choices.gdn_kernels_installed", lambda: False)
    e = estimate(_measured_spec(name, row, calibration_configs, generated_data), suggest=False)
    alloc_err = (e.per_gpu_allocated_gib - row["peak_alloc_gib"]) / row["peak_alloc_gib"]
    assert abs(alloc_err) <= ALLOC_EXCEPTIONS.get(name, ALLOC_BOUND), (name, e.per_gpu_allocated_gib, alloc_err)
    reserved = e.per_gpu_reserved_gib - e.breakdown["cuda_context_nccl"]  # torch's reserved excludes the context
    reserved_err = (reserved - row["peak_reserved_gib"]) / row["peak_reserved_gib"]
    assert abs(reserved_err) <= RESERVED_EXCEPTIONS.get(name, RESERVED_BOUND), (name, reserved, reserved_err)


def test_trl_lora_on_one_gpu_trains_the_plain_module_at_the_measured_peak():
    """The reduced GPT-OSS LoRA recipe, TRL engine, one H200 (the last run of trl-gpt-oss-reduced-h200.json): the
    plain module's peak, without FSDP2's copy of the drawn model at setup (which made the wrapped run's peak)."""
    runs = json.loads((BENCH / "trl-gpt-oss-reduced-h200.json").read_text())["runs"]
    row = runs[-1]["rows"][0]
    assert row["fsdp"] == "none (one rank)" and row["recipe"] == "gpt-oss-reduced-lora-h200"
    e = est(row["recipe"], suggest=False)
    assert e.peak_phase != "setup"
    assert abs(e.per_gpu_allocated_gib - row["peak_alloc_gib"]) / row["peak_alloc_gib"] <= ALLOC_BOUND
    wrapped = est(row["recipe"], "train.fsdp_one_rank=true", suggest=False)
    assert wrapped.peak_phase == "setup" and wrapped.per_gpu_allocated_gib > 1.5 * e.per_gpu_allocated_gib


def test_gated_delta_torch_path_costs_memory_only_on_hybrid_models(monkeypatch):
    """Without flash-linear-attention, gated-delta layers keep fp32 intermediates: more memory, said in the notes."""

    hybrid = ["model.path=embedded:qwen3.5-hybrid-reduced", "model.loader=image_text_to_text", "method.kind=lora",
              "train.activation_checkpointing=true", "train.seq_len=8192", "hardware.device=cuda",
              "hardware.gpu=H200", "hardware.nproc_per_node=1", "model.init=random", "model.dtype=bfloat16"]
    with_kernels = estimate(load_spec("tiny-cpu", hybrid), suggest=False)
    dense_with = est(R17)
    monkeypatch.setattr("runner.plan.choices.gdn_kernels_installed", lambda: False)
    without = estimate(load_spec("tiny-cpu", hybrid), suggest=False)
    assert without.per_gpu_allocated_gib > with_kernels.per_gpu_allocated_gib + 2
    assert "PyTorch path" in without.approximate_reason and "PyTorch path" not in with_kernels.approximate_reason
    assert est(R17).per_gpu_allocated_gib == dense_with.per_gpu_allocated_gib


def test_partial_recompute_trades_memory_for_time():
    """train.recompute_layers: each layer left out of recomputation adds memory and takes time off the step."""
    rows = [est(R17, "train.activation_checkpointing=true", f"train.recompute_layers={k}") for k in (28, 24, 20, 0)]
    mem = [e.per_gpu_allocated_gib for e in rows]
    step = [e.step_s for e in rows]
    assert mem == sorted(mem) and len(set(mem)) == 4
    assert step == sorted(step, reverse=True)
    assert est(R17, "train.activation_checkpointing=true").per_gpu_allocated_gib == mem[0]
    assert est(R17, "train.activation_checkpointing=false").per_gpu_allocated_gib == mem[-1]


@pytest.mark.parametrize("recipe, heads, q_width", [(R17, 16, 2048), ("llama-3.2-3b-bench-h200", 24, 3072)])
def test_kept_attention_outputs_cost_their_bytes_and_save_the_recomputed_attention(recipe, heads, q_width):
    """train.recompute_attention=false: each recomputed layer keeps its attention output (bf16, q width) and fp32
    log-sum-exp per token, and its attention forward runs once; only with varlen attention, whose kernel the
    native engine's checkpoint policy keeps. Qwen3-1.7B and the Llama-3.2-3B layout (measured +3.8 GiB on the H200
    with 20 recomputed layers at 32k: 46.8 -> 50.6 GiB allocated)."""
    n, k = 32768, 20
    base = [f"train.seq_len={n}", "train.activation_checkpointing=true", f"train.recompute_layers={k}",
            "model.attn_implementation=varlen"]
    again = est(recipe, *base, "train.recompute_attention=true")
    kept = est(recipe, *base, "train.recompute_attention=false")
    per_layer = (2 * q_width + 4 * heads) * n / 2**30
    # The peak phase holds every recomputed layer's extra bytes (rounded to the estimate's 0.01 GiB).
    assert kept.per_gpu_allocated_gib - again.per_gpu_allocated_gib == pytest.approx(k * per_layer, abs=0.02)
    assert kept.step_s < again.step_s
    # With sdpa the policy finds no varlen kernel to keep: nothing is counted.
    sdpa = [f"train.seq_len={n}", "train.activation_checkpointing=true", "model.attn_implementation=sdpa"]
    assert est(recipe, *sdpa, "train.recompute_attention=true").per_gpu_allocated_gib == \
        est(recipe, *sdpa, "train.recompute_attention=false").per_gpu_allocated_gib


def test_activation_offload_moves_layer_inputs_to_host_memory():
    """train.offload_activations: each recomputed layer's bf16 input (hidden × 2 bytes a token) leaves the GPU."""
    n = 262144  # long enough that the backward peak is made of kept layer inputs
    base = ["train.activation_checkpointing=true", f"train.seq_len={n}"]
    on_gpu = est(R17, *base)
    off = est(R17, *base, "train.offload_activations=true")
    layers, hidden = 28, 2048  # Qwen3-1.7B
    one_input = hidden * 2 * n / 2**30
    assert off.host_offload_gib == pytest.approx(layers * one_input, rel=1e-3)
    assert on_gpu.host_offload_gib == 0
    # At most all but the one input that comes back for its recompute; at least most of that (the peak may move
    # to another phase once the inputs are gone).
    saved = on_gpu.per_gpu_allocated_gib - off.per_gpu_allocated_gib
    assert 0.8 * (off.host_offload_gib - one_input) < saved <= off.host_offload_gib - one_input + 0.01
    assert off.step_s > on_gpu.step_s  # the copies back are on the compute stream
    assert "pinned host memory" in off.approximate_reason and not off.approximate
    # Only recomputed layers offload: fewer of them, less moves to the host.
    part = est(R17, *base, "train.offload_activations=true", "train.recompute_layers=14")
    assert part.host_offload_gib == pytest.approx(off.host_offload_gib / 2, rel=1e-3)


@pytest.mark.parametrize("seq_len", [8192, 32768, 131072])
def test_activation_offload_lets_longer_blocks_fit(seq_len):
    base = ["train.activation_checkpointing=true", f"train.seq_len={seq_len}"]
    # Never more GPU memory; less once kept inputs make the peak (at 8k the optimizer step does).
    off, on = (est(R17, *base, *o).per_gpu_allocated_gib for o in (["train.offload_activations=true"], []))
    assert off < on if seq_len >= 32768 else off <= on
    rows = [est(R17, "train.activation_checkpointing=true", "train.offload_activations=true", f"train.seq_len={n}")
            for n in (seq_len, 2 * seq_len)]
    assert rows[0].host_offload_gib * 2 == pytest.approx(rows[1].host_offload_gib, rel=0.01)


def test_random_init_counts_the_whole_model_drawn_on_each_gpu():
    """Random init draws every weight on each GPU before FSDP2 shards them: a setup peak no training phase shows."""
    over = ["model.init=random", "hardware.nproc_per_node=8", "hardware.gpu=H100-80GB", "train.seq_len=2048"]
    small = est(R17, *over)
    whole_gib = small.arch["params_total"] * 2 / 2**30  # bf16
    assert small.phases_gib["setup"] < max(v for k, v in small.phases_gib.items() if k != "setup")
    assert whole_gib < small.phases_gib["setup"] < whole_gib * 1.05  # plus one layer's shard
    # A model larger than one GPU cannot be drawn there, however many GPUs share it afterwards.
    big = est("gpt-oss-120b-lora-8xh100", "model.init=random")
    assert big.peak_phase == "setup" and big.verdict == "does not fit"
    assert "setup" not in est("gpt-oss-120b-lora-8xh100").phases_gib  # weights from a checkpoint load on the host


LIMIT_RUNS = sorted((BENCH / "bench-h200").glob("limit-*.json"))


@pytest.mark.parametrize("path", LIMIT_RUNS, ids=[p.stem for p in LIMIT_RUNS])
def test_estimator_predicts_the_measured_limits_within_10_percent(path, generated_data):
    """`runner bench --max-seq-len` results: the largest block that fit on the H200, per engine, against the
    limit the estimator gives today for the same spec on the same grid."""
    from runner.cli.bench_limit import grid, predicted_limit
    from runner.engines import LEVERS, engine_for

    result = json.loads(path.read_text())
    spec_ref, sets = _bench_command(result["command"], generated_data)
    lo, hi, step = result["limits"]["grid"]
    assert result["limits"]["engines"]
    for engine, row in result["limits"]["engines"].items():
        left_out = [f"{f}={LEVERS[f].off}" for f in engine_for(engine).lacks]
        spec = load_spec(spec_ref, [*sets, f"engine={engine}", *left_out, *_as_measured(row)])
        measured = row["measured_max_seq_len"]
        assert row["search_complete"] and measured < hi  # a real limit, inside the range searched
        predicted = predicted_limit(spec, grid(lo, hi, step))
        assert abs(predicted - measured) / measured <= 0.10, (engine, predicted, measured)


STEP_TIME_EXCEPTIONS = {
    # The chunked loss recomputes lm_head in backward and runs its softmax eagerly; the time model counts its FLOPs
    # only (0.857 s estimated, 0.968 measured).
    "bench ablation-1p7b-chunked native 32768",
    # Measured two engine changes ago (0.900 s; before the compiled fused-loss chunks and the checkpoint inside the
    # compiled layers): the same command now measures 0.819 s (bench-1p7b-longchat-32k), 0.792 estimated.
    "bench bench-1p7b-longchat native 32768",
}
# Rows on the bench data whose measured steps are not what the time model describes (benchmarks/throughput-h200.md).
LONG_DOCUMENT_EXCEPTIONS = {
    # The fused loss compiled again after the warm-up (runner/train/loss.py, CompiledChunkCE: the first step whose
    # targets fit in one chunk, a buffer's partly filled block), 0.3-1.1 s in one of 8 measured steps; and the host
    # of the 8k rows ran the same command's median step 25-30 % slower than the host of the 32k rows.
    "bench longchat-recompile-1p7b-8k native 8192", "bench longchat-recompile-1p7b-8k-native-b native 8192",
    "bench longchat-recompile-llama3b-8k native 8192", "bench lever-1p7b-8k-loss-recompile native 8192",
    # TRL through FSDP2 around its one GPU at 8k, 8 measured steps on that slower host: 0.514 and 0.614 s a step
    # against 0.328 and 0.500 estimated; the Llama command's 30-step row on another host
    # (longchat-llama3b-8k-trl-wrapped) measures 0.493 s, within 0.2 %.
    "bench longchat-recompile-1p7b-8k-trl-wrapped trl 8192", "bench longchat-recompile-llama3b-8k-trl-wrapped trl 8192",
}
STEP_TIME_ROWS = [(n, r) for n, r in MEASURED
                  if n.startswith("bench ") and r["seq_len"] == 32768 and n not in STEP_TIME_EXCEPTIONS]


def _measured_step_s(row: dict) -> float:
    """The average step of the measured steps (tokens per step over tokens/s, as the bench sums their time): what
    the estimate of a run's steps predicts. On conversations of realistic lengths a block's attention work varies
    with the documents it holds, so the median step is not the average (1.27 s against 1.49 on the Llama layout
    at 32k)."""
    return row["tokens_per_step"] / row["tokens_per_s"] if row.get("tokens_per_s") else row["step_s_median"]


def _measured_attention_len(row: dict, spec) -> int | None:
    """Σ doc_len² / tokens of the blocks a row measured, for rows with document statistics: back from its MFU
    (model + attention FLOPs over the step and the ceiling, runner/facts/flops.py). Those rows measured the first blocks
    of the bench data (bfd filled a buffer's first blocks with its longest conversations before it shuffled them):
    their attention work is not the data's average, which is what the estimate of a whole run assumes."""
    if "doc_tokens" not in row or not row.get("mfu"):
        return None
    from runner.facts.flops import attention_flops_per_doc_len_sq, model_flops_per_token

    arch = load_arch(spec).arch
    done = row["mfu"] * row["step_s_median"] * row["peak_tflops"] * 1e12
    squares = (done - model_flops_per_token(arch) * row["tokens_per_step"]) / attention_flops_per_doc_len_sq(arch)
    return round(squares / row["tokens_per_step"])


LONG_DOCUMENT_ROWS = [(n, r) for n, r in MEASURED
                      if n.startswith("bench ") and "doc_tokens" in r and n not in LONG_DOCUMENT_EXCEPTIONS]


@pytest.mark.parametrize("name, row", STEP_TIME_ROWS, ids=[n for n, _ in STEP_TIME_ROWS])
def test_estimated_step_time_matches_the_h200_benches_at_32k(name, row, generated_data):
    """The time model (FLOPs at a calibrated rate, plus per-step overhead) against every 32k `runner bench` row.
    The calibration was fitted on bench-1p7b-longchat; the rest are held out. The 8k rows of the embedded chat data
    are not held to this: the same command's median 8k step varied by up to 48 % between calls (throughput-h200.md)."""
    spec = _measured_spec(name, row, {}, generated_data)
    e = estimate(spec, doc_len=_measured_attention_len(row, spec), suggest=False)
    measured = _measured_step_s(row)
    assert abs(e.step_s - measured) / measured <= 0.10, (name, e.step_s, measured)


@pytest.mark.parametrize("name, row", LONG_DOCUMENT_ROWS, ids=[n for n, _ in LONG_DOCUMENT_ROWS])
def test_estimated_step_time_on_long_conversations_at_8k_and_32k(name, row, generated_data):
    """Rows on the bench data (conversations of realistic lengths), both families, both engines, 8k and 32k: the
    estimated step within 10 % of the measured average step, given the attention work of the blocks measured."""
    assert row["seq_len"] in (8192, 32768)
    spec = _measured_spec(name, row, {}, generated_data)
    e = estimate(spec, doc_len=_measured_attention_len(row, spec), suggest=False)
    measured = _measured_step_s(row)
    assert abs(e.step_s - measured) / measured <= 0.10, (name, e.step_s, measured)


def test_measured_coverage_is_what_the_measured_rows_cover(calibration_configs, generated_data, monkeypatch):
    """The families, GPU types and world sizes the estimate calls measured are exactly those of the measured rows."""
    from runner.plan import coverage

    monkeypatch.setattr("runner.plan.choices.gdn_kernels_installed", lambda: False)
    families, gpus, worlds = set(), set(), set()
    for name, row in MEASURED:
        e = estimate(_measured_spec(name, row, calibration_configs, generated_data), suggest=False)
        families.add(e.arch["model_type"])
        gpus.add(e.gpu)
        worlds.add(e.world_size)
        assert e.approximate_scope == "", (name, e.approximate_scope)
    assert (families, gpus, worlds) == (set(coverage.MEASURED_MODEL_TYPES), set(coverage.MEASURED_GPUS),
                                        set(coverage.MEASURED_WORLD_SIZES))


def test_outside_the_measured_rows_the_estimate_says_it_is_approximate():
    inside = est(R17)
    assert not inside.approximate and inside.approximate_scope == ""
    for overrides, said in ((["hardware.gpu=H100-80GB"], "GPU H100-80GB"), (["hardware.nproc_per_node=8"], "8 ranks"),
                            (["model.id=mistralai/Mistral-7B-v0.3"], "model family mistral")):
        e = est(R17, *overrides)
        assert e.approximate and said in e.approximate_scope and e.approximate_scope in e.approximate_reason
        assert e.to_dict()["approximate"] is True


def test_sequence_parallel_activations_drop_with_the_ranks_sharing_a_block():
    """A rank holds seq_len / N tokens of every tensor but attention's, which after the exchange holds the whole
    block for H / N heads (as many elements) and the block's dense mask."""
    from runner.plan.constants import SDPA_MASK_BYTES_PER_ELEM

    seq = 32768
    fixed = [f"train.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in PLAIN.items()
             if v is not None]
    acts, masks = [], []
    for n in (1, 2, 4, 8):
        spec = load_spec(R17, ["model.id=Qwen/Qwen3-8B", "hardware.gpu=H100-80GB", "hardware.nproc_per_node=8",
                               f"hardware.sequence_parallel={n}", f"train.seq_len={seq}", "train.max_steps=10",
                               "model.attn_implementation=sdpa", *fixed])
        est = estimate(spec, suggest=False)
        acts.append(est.breakdown["activations"])
        masks.append(SDPA_MASK_BYTES_PER_ELEM * seq * seq / 2**30)
    assert all(a > b for a, b in zip(acts, acts[1:])), acts
    # Past the mask, what is left shrinks as 1 / N.
    for n, a in zip((2, 4, 8), acts[1:]):
        assert a - masks[0] == pytest.approx((acts[0] - masks[0]) / n, rel=0.05), (n, acts)
