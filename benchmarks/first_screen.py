"""Time from starting `sft-tui` to its first screen, and to a screen that answers the keyboard, in an 80×24 tmux pane
(the real binary, read back with capture-pane), with the modules the first screen imported. Needs tmux.

    python benchmarks/first_screen.py [--repeats 5] [--out benchmarks/first-screen]   # writes .json and .md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tui_dashboard import Pane, machine, versions  # noqa: E402 (this folder is no package)

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 2.0
FIRST_SCREEN = ("1 Model", "hub id / name")  # the step list and the Model step's first field
AFTER_CTRL_N = "split"  # a field of the Dataset step: shown once the wizard has taken ^n


def wait_for(pane: Pane, texts: tuple[str, ...], t0: float, timeout_s: float = 60.0) -> float:
    while True:
        screen = pane.text()
        if all(t in screen for t in texts):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"sft-tui did not show {texts} within {timeout_s:g} s; the pane shows:\n{screen}")
        time.sleep(0.01)


def one_start(binary: str) -> dict[str, float]:
    """Seconds to the first screen, the CPU seconds the app's processes had used by then (what the wall time comes
    to on an idle machine, where nothing else takes the cores), then the seconds to the Dataset step after a ^n sent
    the moment the first screen showed."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        pane = Pane([binary, "--runs-dir", f"{tmp}/runs", "--records-dir", f"{tmp}/records"], width=80, height=24)
        try:
            proc = psutil.Process(pane.pid)
            first = wait_for(pane, FIRST_SCREEN, t0)
            cpu = sum(proc.cpu_times()[:2]) + sum(sum(c.cpu_times()[:2]) for c in proc.children(recursive=True))
            pane._tmux("send-keys", "-t", "b", "C-n")
            answered = wait_for(pane, (AFTER_CTRL_N,), t0)
        finally:
            pane.close()
    return {"first_screen_s": first, "first_screen_cpu_s": cpu, "ctrl_n_answered_s": answered}


def first_screen_modules() -> dict[str, bool]:
    """Whether the app and its first screen (the wizard) import torch or transformers before the first paint."""
    code = ("import sys, tui.app\nfrom tui.screens.wizard import WizardScreen\n"
            "print({m: m in sys.modules for m in ('torch', 'transformers', 'trl', 'peft')})")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return eval(out)  # noqa: S307 - our own print of a dict of bools


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "first-screen", help="writes OUT.json, OUT.md")
    p.add_argument("--binary", default=str(Path(sys.executable).with_name("sft-tui")))
    args = p.parse_args(argv)
    runs = [one_start(args.binary) for _ in range(args.repeats)]
    first = [r["first_screen_s"] for r in runs]
    answered = [r["ctrl_n_answered_s"] for r in runs]
    cpu = [r["first_screen_cpu_s"] for r in runs]
    load = os.getloadavg()
    result: dict[str, Any] = {
        "command": " ".join(["python benchmarks/first_screen.py", *(argv if argv is not None else sys.argv[1:])]),
        "gpu": None, "machine": machine(), "versions": versions(), "terminal": "tmux 80x24",
        "load_avg_1_5_15": [round(x, 2) for x in load],
        "imported_before_first_paint": first_screen_modules(),
        "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs],
        "rows": [
            {"name": f"time to first screen (`sft-tui`, median of {len(first)})",
             "value": round(statistics.median(first), 3), "unit": "s", "target": f"< {TARGET_S:g} s",
             "ok": statistics.median(first) < TARGET_S},
            {"name": "… slowest of them", "value": round(max(first), 3), "unit": "s", "target": "", "ok": None},
            {"name": "CPU time used by then (user+system, median)", "value": round(statistics.median(cpu), 3),
             "unit": "s", "target": f"< {TARGET_S:g} s", "ok": statistics.median(cpu) < TARGET_S},
            {"name": f"start → ^n answered (sent at the first screen, median of {len(answered)})",
             "value": round(statistics.median(answered), 3), "unit": "s", "target": "", "ok": None},
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(to_markdown(result))
    print(to_markdown(result))
    return 0 if statistics.median(first) < TARGET_S else 1


def to_markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = ["# Time to the wizard's first screen", "", f"Command: `{r['command']}`", "",
             f"Machine: {m.get('cores')} CPU cores, {m.get('ram_gib')} GiB RAM, no GPU ({m.get('os')}); "
             f"load average while measured (1/5/15 min): {', '.join(map(str, r['load_avg_1_5_15']))}.", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()), "",
             "`sft-tui` (the wizard on the embedded default) starts in a fresh 80×24 tmux pane; the screen is read "
             "with capture-pane every 10 ms until the step list and the Model step's first field show; the CPU time the "
             "app had used by then is what the wall time comes to on an idle machine. Then ^n is "
             "sent and the time until the Dataset step shows is taken (torch and transformers are imported by a "
             "worker after the first paint, so this is the first screen's answer while they load).", "",
             "| measure | value | target | ok |", "| --- | --- | --- | --- |"]
    for row in r["rows"]:
        ok = "" if row["ok"] is None else "yes" if row["ok"] else "no"
        lines.append(f"| {row['name']} | {row['value']} {row['unit']} | {row['target']} | {ok} |")
    imported = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in r["imported_before_first_paint"].items())
    lines += ["", f"Imported before the first paint (`import tui.app` and the wizard's screen): {imported}.", "",
              "Each start (first screen / its CPU time / ^n answered): " + "; ".join(
                  f"{x['first_screen_s']} / {x['first_screen_cpu_s']} / {x['ctrl_n_answered_s']} s" for x in r["runs"]),
              ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
