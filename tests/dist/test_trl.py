"""The trl engine: a real 2-rank torchrun run of a tiny GPT-OSS with LoRA on attention and expert tensors, its
record and replay, the first-step loss against the native engine's, packed documents kept apart, and bad input."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import itertools
import json
import re
from pathlib import Path

import pytest
import torch

from runner.record import records
from runner.errors import SpecError
from runner.spec import load_spec, resolve
from runner.train import trl_engine
from runner.train.attention import install_packed_mask
from runner.train.runtime import Runtime
from tests.conftest import dir_args, last_json, run_cli

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "tiny-gpt-oss-cpu"
STEPS = 8
# The recipe's LoRA: r 16 on every Linear (GPT-OSS: q, k, v, o), r 8 on both expert stacks via rank_pattern.
R_LINEAR, R_EXPERTS = 16, 8
# TRL scores targets with its chunked log-softmax, the native engine with F.cross_entropy over full logits: same
# float32 math in a different summation order. Over ~400 targets the mean differs by ~4e-7 (measured); 1e-5 is
# that with margin, and 100× below the effect of one document seeing another (~1e-2 here).
LOSS_TOL = 1e-5
WARMUP = 3  # the engines' one schedule, warmup counted from step 1 (runner.train.schedule)


def _make_tiny(out: Path, seed: int = 0, sizes: dict | None = None) -> Path:
    spec = importlib.util.spec_from_file_location("make_tiny_gpt_oss", ROOT / "recipes/embedded/make_tiny_gpt_oss.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.make_tiny(out, seed=seed, sizes=sizes)


def independent_lora_count(config: dict, r: int, r_experts: int) -> int:
    """From config.json alone: r·(in+out) per adapted Linear; for an expert stack (E, d1, d2) peft's ParamWrapper
    adds A = Linear(d1, r·E) and B = Linear(r·E, d2), r·E·(d1+d2). gate_up_proj is (E, hidden, 2·I), down_proj is
    (E, I, hidden)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    e, i = config["num_local_experts"], config["intermediate_size"]
    linear = r * ((h + q) + 2 * (h + kv) + (q + h))
    experts = r_experts * e * (h + 2 * i) + r_experts * e * (i + h)
    return layers * (linear + experts)


def _events(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A finished 2-rank CPU run of the trl engine on a tiny GPT-OSS drawn here from a seed, adapter exported."""
    base = tmp_path_factory.mktemp("trl_run")
    model_dir = _make_tiny(base / "gpt-oss-tiny", seed=1)
    d = {"runs": base / "runs", "records": base / "records"}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run_cli(["run", RECIPE, "--set", f"model.path={model_dir}", "--set", f"train.max_steps={STEPS}",
                        "--set", f"train.warmup_steps={WARMUP}", "--set", "train.lr=5e-3", "--set", "output.save=adapter",
                        "--json", "--plain", *dir_args(d)])[0]
    assert code == 0, buf.getvalue()
    result = last_json(buf.getvalue())
    rec = records.load(Path(result["record"]))
    return {"result": result, "record": Path(result["record"]), "rec": rec, "run_dir": Path(rec["run_dir"]),
            "model_dir": model_dir, **d}


# ---------------------------------------------------------------------------------------------
# A real run through torchrun


@pytest.mark.dist
def test_trl_run_trains_with_fsdp2_and_lora_on_experts(trl_run):
    rec, run_dir = trl_run["rec"], trl_run["run_dir"]
    assert rec["status"] == "succeeded" and rec["spec"]["engine"] == "trl"
    for r in (0, 1):
        evs = _events(run_dir, r)
        steps = [e for e in evs if "event" not in e]
        assert [e["step"] for e in steps] == list(range(1, STEPS + 1))
        assert {"loss", "lr", "grad_norm", "tokens", "step_s", "mem_gib", "global_loss", "target_tokens"} <= \
            set(steps[0])
        # grad_accum 2 × one 512-token block per rank, holding whole conversations (bfd) and some padding; a
        # buffer's last, partly filled block may come among them (blocks leave a buffer in a seeded order).
        tokens = [e["tokens"] for e in steps]
        assert all(0 < n <= 2 * 512 for n in tokens) and sum(tokens) > 0.9 * 2 * 512 * len(tokens)
        begin = next(e for e in evs if e.get("event") == "train_begin")
        assert begin["engine"] == "trl" and begin["attn"] == "eager" and begin["packed_mask_hook"] is True
        assert begin["fsdp"] == "fsdp2 (accelerate) over 2 rank(s)" and begin["tokenisation"] == "generation markers"
        end = next(e for e in evs if e.get("event") == "end")
        assert end["fsdp_sharded"] is True and end["steps"] == STEPS
        # Every rank's global loss is the same number: the mean over every target of the step, all ranks.
        if r == 0:
            global0 = [e["global_loss"] for e in steps]
        else:
            assert [e["global_loss"] for e in steps] == global0
    curve = rec["metrics"]["loss_curve"]["0"]
    assert curve[-1][1] < curve[0][1] - 0.1, curve
    # The packing statistics count the rows the steps trained on (grad_accum 2 × 1 block × 2 ranks a step), not
    # the whole file.
    m = rec["metrics"]
    assert m["packing"]["real_tokens"] == m["tokens"] and m["packing"]["blocks"] == 2 * 2 * STEPS
    # The native engine's schedule, step for step (tests/dist/test_run.py checks the native side on its run).
    from runner.spec import RunSpec
    from runner.train.schedule import lr_at

    spec = RunSpec.model_validate(rec["spec"])
    logged = [e["lr"] for e in _events(run_dir, 0) if "event" not in e]
    assert logged == pytest.approx([lr_at(spec, s, STEPS) for s in range(1, STEPS + 1)], rel=1e-12, abs=0)
    assert logged[0] == pytest.approx(5e-3 / WARMUP) and logged[WARMUP - 1] == logged[WARMUP] == pytest.approx(5e-3)


@pytest.mark.dist
def test_trainable_parameter_count_equals_the_count_from_the_config(trl_run):
    config = json.loads((trl_run["model_dir"] / "config.json").read_text())
    expected = independent_lora_count(config, R_LINEAR, R_EXPERTS)
    assert expected == 34_816
    for r in (0, 1):
        evs = _events(trl_run["run_dir"], r)
        assert next(e for e in evs if e.get("event") == "train_begin")["trainable_params"] == expected
        assert next(e for e in evs if e.get("event") == "end")["trainable_params"] == expected
    log = (trl_run["run_dir"] / "logs" / "rank0.log").read_text()
    printed = re.search(r"trainable params ([\d,]+)", log)
    assert printed and int(printed.group(1).replace(",", "")) == expected


@pytest.mark.dist
def test_adapter_export_is_hashed_and_holds_every_adapter(trl_run):
    from safetensors import safe_open

    end = next(e for e in _events(trl_run["run_dir"], 0) if e.get("event") == "end")
    export = end["export"]
    assert export["kind"] == "adapter"
    folder = Path(export["dir"])
    weights = folder / "adapter_model.safetensors"
    assert export["files"]["adapter_model.safetensors"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert "training_args.bin" not in export["files"]
    with safe_open(str(weights), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    config = json.loads((trl_run["model_dir"] / "config.json").read_text())
    assert sum(torch.Size(s).numel() for s in shapes.values()) == independent_lora_count(config, R_LINEAR, R_EXPERTS)
    experts_a = {s for k, s in shapes.items() if "experts" in k and "lora_A" in k}
    assert experts_a == {(R_EXPERTS * 4, 64)}  # A of both stacks: (r·E, in) with in = hidden = I = 64
    adapter = json.loads((folder / "adapter_config.json").read_text())
    assert sorted(adapter["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert adapter["rank_pattern"] == {"mlp.experts.gate_up_proj": 8, "mlp.experts.down_proj": 8}


@pytest.mark.dist
def test_replay_reproduces_the_trl_loss_curve_exactly(trl_run, capsys):
    code, out, _ = run_cli(["replay", str(trl_run["record"]), "--json", "--plain", *dir_args(trl_run)], capsys)
    result = last_json(out)
    assert code == 0, out
    assert result["reproduced"] is True and result["max_abs_loss_diff"] == 0.0
    replay = records.load(Path(result["record"]))
    assert replay["metrics"]["loss_curve"] == trl_run["rec"]["metrics"]["loss_curve"]


# ---------------------------------------------------------------------------------------------
# In one process: documents kept apart, and the first-step loss against the native engine


def _gpt_oss(sliding_window: int, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, GptOssConfig

    config = GptOssConfig(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                          num_experts_per_tok=2, sliding_window=sliding_window, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.mark.parametrize("window", [128, 5])
def test_packed_documents_do_not_see_each_other(window):
    # GPT-OSS builds its masks without position_ids: packed documents attend to each other unless the hook does.
    a, b = torch.randint(3, 512, (1, 10)), torch.randint(3, 512, (1, 12))
    packed = torch.cat([a, b], 1)
    positions = torch.cat([torch.arange(10), torch.arange(12)])[None]
    model = _gpt_oss(window)
    with torch.no_grad():
        alone = model(input_ids=b).logits[0]
        leaky = model(input_ids=packed, position_ids=positions).logits[0, 10:]
        assert install_packed_mask(model, torch.float32)
        kept = model(input_ids=packed, position_ids=positions).logits[0, 10:]
        first = model(input_ids=a).logits[0]
        kept_first = model(input_ids=packed, position_ids=positions).logits[0, :10]
    assert (leaky - alone).abs().max() > 1e-2
    assert (kept - alone).abs().max() < 1e-5 and (kept_first - first).abs().max() < 1e-5


@pytest.fixture
def accelerate_state():
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # the trainer's process-wide state must not leak into other tests


def test_first_step_loss_equals_the_native_engines(tmp_path: Path, accelerate_state):
    """The same packed micro-batch (two 512-token blocks of the recipe's data), the same LoRA model: TRL's loss
    (compute_loss, its chunked LM head, normalised by its own target count) against the native loss sum over its
    target count. Both keep documents apart through the mask hook; the native engine without it sees across
    documents, which moves the loss by ~1e-2."""
    from runner.train.data import BlockStream, collate
    from runner.train.lora import apply_lora
    from runner.train.loss import loss_sum
    from runner.train.model import load_config, load_tokenizer

    from runner.plan.autotune import resolve_levers

    spec = resolve_levers(resolve(load_spec(RECIPE, ["hardware.nproc_per_node=1", "train.micro_batch=2"]), False, 0))
    rt = Runtime(rank=0, local_rank=0, world_size=1, node_rank=0, device="cpu")
    config, tok = load_config(spec), load_tokenizer(spec)

    def model(hook: bool) -> torch.nn.Module:
        torch.manual_seed(spec.train.seed)
        m = apply_lora(trl_engine.load_model(spec, "cpu", config, "eager"), spec)
        if hook:
            install_packed_mask(m, torch.float32)
        return m

    from runner.train.native import block_source

    blocks = list(itertools.islice(iter(BlockStream(block_source(spec, tok), tok, 0, 1)), 2))
    batch = collate(blocks)
    targets = sum(b.target_tokens for b in blocks)
    with torch.no_grad():
        native = {impl: float(loss_sum(model(True), batch, impl)) / targets for impl in ("full", "chunked")}
        leaky = float(loss_sum(model(False), batch, "full")) / targets

    from datasets import Dataset

    rows = [trl_engine.block_row(b) for b in blocks]
    loader = trl_engine.RankLoader(Dataset.from_list(rows), batch_size=2, sampler=trl_engine.EpochOrder(2, 0),
                                   collate_fn=trl_engine.CountingCollator(tok.pad_token_id))
    args = trl_engine.sft_config(spec, rt, tmp_path / "out", None, bf16=False)
    trainer = trl_engine._trainer_class()(model=model(True), args=args, train_dataset=Dataset.from_list(rows),
                                          processing_class=tok, rank_loader=loader, spec=spec)
    inputs = next(iter(loader))
    assert torch.equal(inputs["input_ids"], batch["input_ids"]) and torch.equal(inputs["labels"], batch["labels"])
    assert torch.equal(inputs["position_ids"], batch["position_ids"])
    trl_loss = float(trainer.compute_loss(trainer.model, dict(inputs)).detach())
    assert trainer.targets == targets
    assert abs(trl_loss - native["full"]) < LOSS_TOL and abs(native["chunked"] - native["full"]) < LOSS_TOL
    assert abs(trainer.ce_sum / trainer.targets - trl_loss) < LOSS_TOL
    assert abs(leaky - trl_loss) > 100 * LOSS_TOL


# ---------------------------------------------------------------------------------------------
# Bad input: found before any weight is read, exit code 2


def _bad(spec_overrides: list[str], tmp_path: Path | None = None) -> list:
    spec = load_spec(RECIPE, spec_overrides)
    with pytest.raises(SpecError) as err:
        trl_engine.check(spec, device="cpu")
    assert err.value.exit_code == 2
    return err.value.problems


def test_lora_targets_that_match_nothing_are_refused():
    problems = _bad(["method.lora.target_modules=[q_proj, gate_proj]",
                     "method.lora.target_parameters=[mlp.experts.up_proj, mlp.experts.down_proj]",
                     "method.lora.rank_pattern={mlp.experts.down_proj: 8}"])
    assert [p.field for p in problems] == ["method.lora.target_modules", "method.lora.target_parameters"]
    assert "'gate_proj' matches no module" in problems[0].message
    assert "'mlp.experts.up_proj'" in problems[1].message and "mlp.experts.gate_up_proj" in problems[1].fix


def test_attention_without_sinks_is_refused_for_gpt_oss():
    for impl in ("sdpa", "flex_attention"):
        problems = _bad([f"model.attn_implementation={impl}"])
        assert [p.field for p in problems] == ["model.attn_implementation"]
        assert "sink" in problems[0].message and "eager" in problems[0].fix


def _mxfp4_folder(tmp_path: Path) -> Path:
    folder = _make_tiny(tmp_path / "mxfp4", seed=0)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_an_mxfp4_checkpoint_without_the_dequantizer_is_refused(tmp_path: Path, monkeypatch):
    folder = _mxfp4_folder(tmp_path)
    monkeypatch.setattr(trl_engine, "mxfp4_dequantize_available",
                        lambda: (False, "MXFP4 quantization requires the `kernels` package"))
    problems = _bad([f"model.path={folder}", "method.lora.target_modules=[nope]"])
    assert [p.field for p in problems] == ["model.path", "method.lora.target_modules"]
    assert "MXFP4-quantized" in problems[0].message and "`kernels` package" in problems[0].message
    # With the dequantizer present the same checkpoint passes, and loads with Mxfp4Config(dequantize=True).
    monkeypatch.setattr(trl_engine, "mxfp4_dequantize_available", lambda: (True, ""))
    spec = load_spec(RECIPE, [f"model.path={folder}"])
    assert trl_engine.trl_problems(spec, device="cpu") == []
    seen = {}

    class Capture:
        @staticmethod
        def from_pretrained(src, **kwargs):
            seen.update(kwargs)
            raise RuntimeError("stop after the call")

    from runner.train import model as model_mod

    monkeypatch.setattr(model_mod, "model_class", lambda spec, config: Capture)
    from runner.train.model import load_config

    with pytest.raises(RuntimeError, match="stop after the call"):
        trl_engine.load_model(spec, "cpu", load_config(spec), "eager")
    q = seen["quantization_config"]
    assert type(q).__name__ == "Mxfp4Config" and q.dequantize is True and seen["dtype"] == torch.bfloat16


def test_this_environment_can_dequantize_mxfp4():
    ok, why = trl_engine.mxfp4_dequantize_available()
    assert ok, why


def test_preflight_reports_lora_problems_before_launch():
    from runner.gate.preflight import preflight_problems

    spec = load_spec(RECIPE, ["method.lora.target_parameters=[mlp.experts.up_proj]",
                              "method.lora.rank_pattern={}"])
    problems = preflight_problems(spec)
    assert [p.field for p in problems] == ["method.lora.target_parameters"]
