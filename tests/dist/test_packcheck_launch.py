"""Families the registry does not list, through a real `runner run`: what the packing check passes trains with no
failure after launch (llama4_text with LoRA, whose router 'all-linear' leaves alone), and what it refuses never
starts a rank (doge with blocks longer than its key window): exit 2, one line naming the family and the path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from runner.gate.shrink import shrunk_config
from tests.conftest import last_json, run_cli
from tests.families import TOKENIZER

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]


def _folder(tmp_path: Path, model_type: str) -> Path:
    """A config-only model folder of the type's transformers config, shrunk, with the embedded ChatML tokenizer."""
    out = tmp_path / model_type
    shrunk_config(AutoConfig.for_model(model_type), 512, 80).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (out / f).write_bytes((TOKENIZER / f).read_bytes())
    return out


def test_llama4_text_with_lora_trains_after_the_check_passes(tmp_path, capsys):
    folder = _folder(tmp_path, "llama4_text")
    code, out, err = run_cli(["run", "tiny-cpu", "--set", f"model.path={folder}", "--set", "model.init=random",
                              "--set", "method.kind=lora", "--set", "hardware.nproc_per_node=1",
                              "--set", "train.max_steps=2", "--json", "--plain",
                              "--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")],
                             capsys)
    assert code == 0, out + err
    record = json.loads(Path(last_json(out)["record"]).read_text())
    check = record["estimate"]["packing_check"]
    assert check["status"] == "exact" and check["model_type"] == "llama4_text" and not check["known"]
    assert record["status"] == "succeeded" and record["metrics"]["steps"] == 2


def test_doge_past_its_key_window_is_refused_before_any_rank_starts(tmp_path, capsys):
    folder = _folder(tmp_path, "doge")
    code, out, err = run_cli(["run", "tiny-cpu", "--set", f"model.path={folder}", "--set", "model.init=random",
                              "--set", "train.seq_len=4096", "--runs-dir", str(tmp_path / "runs"),
                              "--records-dir", str(tmp_path / "records")], capsys)
    text = out + err
    assert code == 2, text
    assert "packing check" in text and "doge" in text and "sdpa" in text and "train.packing=false" in text, text
    assert "Traceback" not in text and not (tmp_path / "runs").exists()
