"""QLoRA on real 2-rank CPU runs of the embedded model (torchrun, gloo, FSDP2 over NF4 weights): it learns as LoRA
does over the same steps, the record pins the quantization, the adapter is exported, and replay is bit for bit."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.cli.main import main as runner_main
from runner.train.qlora import torchao_version
from tests.conftest import dir_args, last_json, run_cli
from tests.dist.test_ulysses import _free_port

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["--set", "train.max_steps=40", "--set", "train.warmup_steps=5"]


def _run(name: str, kind: str, d: dict[str, Path], *sets: str) -> dict:
    args = ["run", "tiny-cpu", "--json", "--plain", "--run-id", name, "--set", f"method.kind={kind}", *STEPS,
            *sets, *dir_args(d)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = runner_main(args)
    assert code == 0, err.getvalue()[-2000:]
    return json.loads(Path(last_json(out.getvalue())["record"]).read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("qlora")
    d = {"runs": base / "runs", "records": base / "records"}
    return {"lora": _run("lora", "lora", d), "qlora": _run("qlora", "qlora", d, "--set", "output.save=adapter"),
            "dirs": d}


def _drop(record: dict) -> float:
    return record["metrics"]["first_loss"] - record["metrics"]["final_loss"]


def test_qlora_learns_within_a_tenth_of_loras_drop(runs):
    lora, qlora = _drop(runs["lora"]), _drop(runs["qlora"])
    assert lora > 0.1, lora  # the run learns at all: the ratio means something
    assert abs(qlora - lora) <= 0.1 * lora, (qlora, lora)


def test_the_record_pins_nf4_and_the_adapter_is_exported(runs):
    q = runs["qlora"]["quantization"]
    assert q["type"] == "nf4" and q["block_size"] == 64 and q["double_quantized"]
    assert q["library"] == f"torchao {torchao_version()}" and q["quantized_layers"] == 28
    assert runs["qlora"]["pins"]["packages"]["torchao"] == torchao_version()
    assert "quantization" not in runs["lora"]
    export = Path(runs["qlora"]["run_dir"]) / "export"
    assert (export / "adapter_model.safetensors").is_file() and (export / "adapter_config.json").is_file()


def test_a_qlora_run_replays_bit_for_bit(runs, capsys):
    record = runs["dirs"]["records"] / "qlora.json"
    code, out, err = run_cli(["replay", str(record), "--json", *dir_args(runs["dirs"])], capsys)
    result = last_json(out)
    assert code == 0 and result["reproduced"] and result["max_abs_loss_diff"] == 0.0, (out[-1500:], err[-1500:])
    replay = json.loads(Path(result["record"]).read_text())
    assert replay["quantization"] == runs["qlora"]["quantization"]
    assert replay["metrics"]["loss_curve"] == runs["qlora"]["metrics"]["loss_curve"]


def test_the_dequantized_base_gathered_from_fsdp2_shards_is_the_whole_models():
    """What a merged export of a QLoRA run starts from (runner.train.qlora.base_state_dict), on 2 gloo ranks."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", str(_free_port()),
                          str(ROOT / "tests" / "dist" / "qlora_ranks.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=220)
    assert out.returncode == 0 and "qlora base ok" in out.stdout, (out.stdout + out.stderr)[-3000:]
