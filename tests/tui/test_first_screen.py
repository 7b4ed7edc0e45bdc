"""The wizard's first screen imports neither torch nor transformers: a worker warms them once it is painted (they
took seconds of a 2-core machine before anything showed). Its time is measured in benchmarks/first_screen.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import asyncio, json, sys
from tui.app import SftApp, make_app

at_warm = {}

def warm(self):  # what the first screen had imported when the app starts warming (and no warming here)
    at_warm.update({m: m in sys.modules for m in ("torch", "transformers", "trl", "peft")})

SftApp.warm_imports = warm

async def main():
    app = make_app(sys.argv[1] + "/runs", sys.argv[1] + "/records")
    async with app.run_test(size=(80, 24)) as pilot:
        while not at_warm:
            await pilot.pause()
        at_warm["screen"] = type(app.screen).__name__
        at_warm["ready"] = app.screen.ready

asyncio.run(main())
print(json.dumps(at_warm))
"""


@pytest.mark.launches
def test_the_first_screen_is_painted_before_torch_and_transformers_are_imported(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"torch": False, "transformers": False, "trl": False, "peft": False, "screen": "WizardScreen",
                    "ready": True}
