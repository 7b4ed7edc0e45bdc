"""After the loss curve, on real runs: what `output.save: auto` leaves, merged exports (in training, both engines,
and after the fact) exact against peft's own merge and loaded with peft blocked, and the run's model tried with
`runner generate` (against transformers' greedy generate) and `runner chat` through a real pty."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from runner.spec import RECIPES_DIR, resolve_embedded
from runner.cli.main import main as runner_main
from tests.conftest import last_json

pytestmark = pytest.mark.dist

BASE = resolve_embedded("embedded:model")
PROMPT = "Name the capital city of Canada."
SECOND_QUESTIONS = ["Count the letters in garden.", "Uppercase this word: window", "And the one before?",
                    "Reverse these words: yellow bird music", "What did I ask?"]
SHORT = ["--set", "train.warmup_steps=1", "--json", "--plain"]


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """`runner ARGS` in this process, its stdout and stderr captured (module fixtures cannot take capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = runner_main(args)
    return code, out.getvalue(), err.getvalue()


def _run(tmp: Path, name: str, sets: list[str]) -> dict:
    """A run of tiny-cpu whose recipe has no `output` section (so the default applies), and its record."""
    spec = yaml.safe_load((RECIPES_DIR / "tiny-cpu.yaml").read_text())
    spec.pop("output")
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    d = tmp / name
    code, out, err = run_cli(["run", str(path), *sets, *SHORT, "--runs-dir", str(d / "runs"),
                              "--records-dir", str(d / "records")])
    assert code == 0, out + err
    record = json.loads(Path(last_json(out)["record"]).read_text())
    return {"record": record, "path": last_json(out)["record"], "records": d / "records"}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("after")


def _logits_without_peft(model_dir: Path, ids: list[int], out: Path) -> torch.Tensor:
    """The model in model_dir run on ids in a fresh interpreter where `import peft` fails."""
    code = ("import sys, torch; sys.modules['peft'] = None\n"
            "from transformers import AutoModelForCausalLM\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(model_dir)!r}, dtype=torch.float32).eval()\n"
            "assert 'peft' not in [k for k, v in sys.modules.items() if v is not None]\n"
            f"torch.save(m(torch.tensor([{ids}])).logits, {str(out)!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return torch.load(out)


def _peft_merged_logits(adapter_dir: Path, ids: list[int]) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().eval()
    with torch.no_grad():
        return merged(torch.tensor([ids])).logits


def _prompt_ids() -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(BASE))(PROMPT)["input_ids"]


@pytest.fixture(scope="module")
def full_run(tmp) -> dict:
    return _run(tmp, "full", ["--set", "train.max_steps=40"])


def test_auto_saves_the_full_model_that_transformers_loads(full_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rec = full_run["record"]
    assert rec["spec"]["output"]["save"] == "full" and rec["metrics"]["export"]["kind"] == "full"
    folder = Path(rec["metrics"]["export"]["dir"])
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= \
        set(rec["metrics"]["export"]["files"])
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert sum(p.numel() for p in model.parameters()) > 0
    assert AutoTokenizer.from_pretrained(str(folder)).chat_template


def test_auto_saves_a_lora_runs_adapter_that_peft_loads(tmp):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = _run(tmp, "lora", ["--set", "train.max_steps=4", "--set", "method.kind=lora"])
    rec = run["record"]
    assert rec["spec"]["output"]["save"] == "adapter" and rec["metrics"]["export"]["kind"] == "adapter"
    folder = Path(rec["metrics"]["export"]["dir"])
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(BASE)), str(folder))
    assert any("lora_A" in n for n, _ in model.named_parameters())
    # after the fact: the adapter merged by `runner export` equals peft's merge of it, loaded with peft blocked
    out = tmp / "lora-merged"
    code, text, err = run_cli(["export", run["path"], "--as", "merged", "-o", str(out), "--json"])
    assert code == 0, text + err
    assert json.loads(text.strip().splitlines()[-1])["source"] == "export (adapter)"
    ids = _prompt_ids()
    diff = (_logits_without_peft(out, ids, tmp / "l1.pt") - _peft_merged_logits(folder, ids)).abs().max().item()
    print(f"after-the-fact merged vs peft merge: max |logit diff| {diff:.3g}")
    assert diff <= 1e-5


@pytest.mark.parametrize("engine", ["native", "trl"])
def test_merged_export_equals_peft_merge_of_the_runs_adapter(tmp, engine):
    run = _run(tmp, f"merged-{engine}", ["--set", f"engine={engine}", "--set", "train.max_steps=4",
                                         "--set", "method.kind=lora", "--set", "output.save=merged",
                                         "--set", "train.checkpoint_every=4"])
    rec = run["record"]
    assert rec["metrics"]["export"]["kind"] == "merged"
    merged = Path(rec["metrics"]["export"]["dir"])
    assert not (merged / "adapter_config.json").exists() and (merged / "generation_config.json").is_file()
    adapter = tmp / f"adapter-{engine}"
    code, text, err = run_cli(["export", run["path"], "--as", "adapter", "-o", str(adapter), "--json"])
    assert code == 0, text + err
    assert json.loads(text.strip().splitlines()[-1])["source"].startswith("checkpoint")
    ids = _prompt_ids()
    diff = (_logits_without_peft(merged, ids, tmp / f"m-{engine}.pt")
            - _peft_merged_logits(adapter, ids)).abs().max().item()
    print(f"{engine}: merged export vs peft merge of the checkpoint's adapter: max |logit diff| {diff:.3g}")
    assert diff <= 1e-5


def test_generate_equals_transformers_greedy_generate_on_the_export(full_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = full_run["record"]["metrics"]["export"]["dir"]
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = model.generate(ids, do_sample=False, max_new_tokens=24)[0, ids.shape[1]:].tolist()
    code, out, err = run_cli(["generate", full_run["path"], "--prompt", PROMPT, "--max-new-tokens", "24", "--json"])
    assert code == 0, err
    got = last_json(out)
    print(f"generate: {got['token_ids']} ({got['text']!r})")
    assert got["token_ids"] == expected and got["source"] == "export (full)"


def _read_until(fd: int, seen: bytearray, needle: bytes, start: int = 0, timeout_s: float = 120) -> str:
    """Read the terminal until needle shows after byte `start` of what it showed so far."""
    deadline = time.time() + timeout_s
    while needle not in seen[start:]:
        left = deadline - time.time()
        assert left > 0, f"no {needle!r} within {timeout_s} s; the terminal shows: {seen.decode(errors='replace')}"
        if select.select([fd], [], [], left)[0]:
            seen += os.read(fd, 4096)
    return seen.decode(errors="replace")


def test_chat_through_a_pty_keeps_the_conversation(full_run):
    from runner.train.generate import load_for_try

    model = load_for_try(full_run["record"])
    first = model.answer([{"role": "user", "content": PROMPT}], 16).text
    # A second question whose greedy answer changes with the first turn before it: only then does the answer
    # through the pty show that the chat kept the conversation.
    for question in SECOND_QUESTIONS:
        second = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": first},
                  {"role": "user", "content": question}]
        expected = model.answer(second, 16).text
        if expected != model.answer(second[-1:], 16).text:
            break
    else:
        raise AssertionError("no second question whose answer depends on the first turn")
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(sys.executable, [sys.executable, "-m", "runner", "chat", full_run["path"], "--max-new-tokens",
                                   "16"])
    try:
        seen = bytearray()
        _read_until(fd, seen, b"you> ")
        os.write(fd, (PROMPT + "\n").encode())
        _read_until(fd, seen, f"model> {first}\r\nyou> ".encode())
        mark = len(seen)
        os.write(fd, (question + "\n").encode())
        screen = _read_until(fd, seen, f"model> {expected}\r\nyou> ".encode(), mark)
        print(screen)
        os.write(fd, b"\x04")  # Ctrl+D ends the chat
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        os.close(fd)
