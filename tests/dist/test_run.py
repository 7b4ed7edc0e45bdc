"""End to end on the embedded default: a real 2-rank torchrun run, its events and record, verify and replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runner.record import records
from tests.conftest import dir_args, last_json, run_cli

pytestmark = pytest.mark.dist


def test_run_writes_events_and_record_and_loss_falls(tiny_run):
    rec = records.load(tiny_run["record"])
    assert tiny_run["result"]["status"] == "succeeded" and rec["status"] == "succeeded"
    run_dir = Path(rec["run_dir"])
    for r in (0, 1):
        lines = [json.loads(x) for x in (run_dir / "events" / f"rank{r}.jsonl").read_text().splitlines()]
        steps = [e for e in lines if "event" not in e]
        assert [e["step"] for e in steps] == list(range(1, 13))
        assert {"t", "rank", "step", "loss", "lr", "grad_norm", "tokens", "step_s", "mem_gib"} <= set(steps[0])
        assert lines[0]["event"] == "start" and lines[-1]["event"] == "end"
    # The engines' one schedule (runner.train.schedule; tests/dist/test_trl.py checks the TRL side): the recipe's
    # 10 warmup steps from step 1, then cosine over 12.
    from runner.spec import RunSpec
    from runner.train.schedule import lr_at

    spec = RunSpec.model_validate(rec["spec"])
    assert [e["lr"] for e in steps] == pytest.approx([lr_at(spec, s, 12) for s in range(1, 13)], rel=1e-12, abs=0)
    assert steps[0]["lr"] == pytest.approx(spec.train.lr / 10) and steps[9]["lr"] == steps[10]["lr"] == spec.train.lr
    m = rec["metrics"]
    assert m["steps"] == 12 and set(m["loss_curve"]) == {"0", "1"}
    assert m["final_loss"] < m["first_loss"] - 0.5
    # bfd leaves the room no whole conversation fits as padding: tokens are the blocks' real tokens (a buffer's
    # last, partly filled blocks may come among the first steps: blocks leave a buffer in a seeded order).
    assert m["tokens"] == sum(r["data"]["real_tokens"] for r in m["per_rank"].values()) > 0.9 * 2 * 12 * 512
    assert m["packing"]["real_tokens"] == m["tokens"] and m["packing"]["blocks"] == 2 * 12  # what trained
    assert m["tokens_per_s"] > 0
    pins = rec["pins"]
    assert pins["packages"]["torch"].startswith("2.") and pins["model"]["content_sha256"]
    assert pins["dataset"]["content_sha256"] and pins["tokenizer_sha256"] and pins["git"]["commit"] is not None
    assert rec["launch"]["world_size"] == 2 and "torch.distributed.run" in rec["launch"]["command"]


def test_verify_passes_then_fails_after_any_change(tiny_run, tmp_path: Path, capsys):
    code, out, _ = run_cli(["verify", str(tiny_run["record"])], capsys)
    assert code == 0 and "ok" in out
    copy = tmp_path / "copy.json"
    text = tiny_run["record"].read_text()
    i = text.index('"final_loss": ') + len('"final_loss": ') + 2
    copy.write_text(text[:i] + ("1" if text[i] != "1" else "2") + text[i + 1:])
    code, _, err = run_cli(["verify", str(copy)], capsys)
    assert code != 0 and "lock mismatch" in err and len(err.strip().splitlines()) == 1


def test_replay_reproduces_bit_for_bit(tiny_run, monkeypatch, capsys):
    """Replay reproduces the curve bit for bit, and says where the environment drifted from the record's pins (a
    package version simulated different here) without refusing (`--strict` refuses: the test below)."""
    from runner.record import pins

    real = pins.packages
    monkeypatch.setattr(pins, "packages", lambda: {**real(), "transformers": "0.0.1-simulated"})
    code, out, _ = run_cli(["replay", str(tiny_run["record"]), "--json", "--plain", *dir_args(tiny_run)], capsys)
    result = last_json(out)
    assert code == 0, out
    assert result["reproduced"] is True and result["max_abs_loss_diff"] == 0.0
    assert any(r["pin"] == "package transformers" and r["current"] == "0.0.1-simulated" for r in result["drift"])
    replay = records.load(Path(result["record"]))
    assert replay["replay_of"] == tiny_run["result"]["id"]
    original = records.load(tiny_run["record"])
    assert replay["metrics"]["loss_curve"] == original["metrics"]["loss_curve"]
    # The run's decisions file is recorded whole, and the replay's ranks are given it whole (its reasons too: the
    # replay does not decide again); the spec fields that decide the same are pinned besides.
    assert original["decisions"]["attn"] == "sdpa" and original["decisions"]["fsdp"] is True
    assert result["pinned"] == {"model.attn_implementation": "sdpa", "train.loss_impl": "chunked"}
    assert replay["decisions"] == original["decisions"]


def test_replay_strict_refuses_drift(tiny_run, monkeypatch, capsys):
    """A drifted pin refuses a `--strict` replay before launch (the same drift without it is reported and replayed
    above)."""
    from runner.record import pins

    real = pins.packages
    monkeypatch.setattr(pins, "packages", lambda: {**real(), "transformers": "0.0.1-simulated"})
    code, _, err = run_cli(["replay", str(tiny_run["record"]), "--strict", *dir_args(tiny_run)], capsys)
    assert code == 2 and "--strict" in err and "package transformers" in err


def test_list_and_diff(tiny_run, capsys):
    code, out, _ = run_cli(["list", "--records-dir", str(tiny_run["records"]), "--json"], capsys)
    rows = json.loads(out)
    assert code == 0 and any(r["id"] == tiny_run["result"]["id"] for r in rows)
    ids = [r["id"] for r in rows]
    code, out, _ = run_cli(["diff", ids[0], ids[-1], "--records-dir", str(tiny_run["records"])], capsys)
    assert code == 0


@pytest.mark.parametrize("args,needle", [
    (["run", "no-such-recipe"], "unknown recipe"),
    (["run", "tiny-cpu", "--set", "train.seqlen=3"], "train.seq_len"),
    (["run", "tiny-cpu", "--set", "train.lr=fast"], "train.lr"),
    (["run", "tiny-cpu", "--set", "train.bogus=1"], "train.bogus"),
    (["run", "tiny-cpu", "--set", "nonsense"], "field=value"),
])
def test_bad_input_exits_2_and_leaves_nothing(args, needle, dirs, capsys):
    code, _, err = run_cli([*args, *dir_args(dirs)], capsys)
    assert code == 2 and needle in err and "Traceback" not in err
    assert not dirs["runs"].exists() and not dirs["records"].exists()


def test_bad_files_exit_2(tmp_path: Path, dirs, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {seq_len: 128\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("trian: {}\n")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("train: {max_steps: many}\n")
    for f, needle in ((bad, "not valid YAML"), (unknown, "did you mean 'train'"), (wrong, "train.max_steps")):
        code, _, err = run_cli(["run", str(f), *dir_args(dirs)], capsys)
        assert code == 2 and needle in err and "Traceback" not in err
    assert not dirs["runs"].exists() and not dirs["records"].exists()


def test_secrets_never_reach_record_run_dir_or_logs(dirs, monkeypatch, capsys):
    secret_token = "hf_PLANTEDsecretTOKEN0123456789abcd"
    url_password = "PLANTEDpassw0rd"
    monkeypatch.setenv("HF_TOKEN", secret_token)
    monkeypatch.setenv("MY_SERVICE_API_KEY", "PLANTEDapikey")
    monkeypatch.setenv("HF_ENDPOINT", f"https://alice:{url_password}@hub.internal.example")
    code, out, _ = run_cli(["run", "tiny-cpu", "--set", "train.max_steps=2", "--set",
                            f"dataset.id=https://bob:{url_password}@data.example.com/chat.jsonl",
                            "--json", "--plain", *dir_args(dirs)], capsys)
    assert code == 0, out
    for root in (dirs["records"], dirs["runs"]):
        for f in root.rglob("*"):
            if f.is_file():
                text = f.read_text(errors="replace")
                for s in (secret_token, url_password, "PLANTEDapikey"):
                    assert s not in text, f"{s} leaked into {f}"
    rec = records.load(Path(last_json(out)["record"]))
    assert rec["launch"]["env"]["HF_TOKEN"] == "<redacted>"


def test_recipes_found_from_an_installed_layout(tmp_path: Path):
    # The package ships recipes/ beside runner/: a copy of both elsewhere still finds recipes by name.
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "runner", tmp_path / "runner")
    shutil.copytree(repo / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("embedded"))
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "runner", "recipes"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and "tiny-cpu" in out.stdout


def test_resume_from_the_cli_continues_bit_for_bit(dirs, capsys):
    common = ["--set", "train.schedule=constant", "--set", "train.warmup_steps=0", "--plain", "--json"]
    code, out, _ = run_cli(["run", "tiny-cpu", "--set", "train.max_steps=8", *common, *dir_args(dirs)], capsys)
    assert code == 0
    straight = records.load(Path(last_json(out)["record"]))["metrics"]["loss_curve"]
    code, out, _ = run_cli(["run", "tiny-cpu", "--set", "train.max_steps=4", "--set", "train.checkpoint_every=4",
                            *common, *dir_args(dirs)], capsys)
    assert code == 0
    first = last_json(out)
    run_dir = dirs["runs"] / first["id"]
    code, out, _ = run_cli(["run", "--resume", str(run_dir), "--set", "train.max_steps=8", "--plain", "--json",
                            "--records-dir", str(dirs["records"])], capsys)
    assert code == 0, out
    resumed = records.load(Path(last_json(out)["record"]))
    assert last_json(out)["id"] == first["id"] and len(resumed["resumes"]) == 1
    assert resumed["metrics"]["loss_curve"] == straight
    assert records.verify(Path(last_json(out)["record"]))[0]
    # Both launches' time: the training time of the two never exceeds their wall time.
    m = resumed["metrics"]
    assert resumed["resumes"][0]["wall_s_before"] > 0 and 0 < m["train_s"] <= m["wall_s"], m


def test_resume_without_checkpoint_is_bad_input(tiny_run, capsys):
    run_dir = Path(records.load(tiny_run["record"])["run_dir"])
    before = tiny_run["record"].read_bytes()
    # Finished at its max_steps: nothing to resume. With more steps asked for: no checkpoint to start from.
    code, _, err = run_cli(["run", "--resume", str(run_dir), "--records-dir", str(tiny_run["records"])], capsys)
    assert code == 2 and "nothing to resume: the run succeeded at step 12" in err
    code, _, err = run_cli(["run", "--resume", str(run_dir), "--set", "train.max_steps=24", "--records-dir",
                            str(tiny_run["records"])], capsys)
    assert code == 2 and "no complete checkpoint" in err
    assert tiny_run["record"].read_bytes() == before
