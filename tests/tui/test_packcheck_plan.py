"""The Plan step shows the packing check's verdict beside preflight's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.tui.conftest import fixed_backends, ready, run_async, wait_for
from tests.tui.helpers import text_of
from tui.app import make_app

VERDICT = "packing check: exact for qwen3 on sdpa, native engine, float32 on cpu"


def test_the_plan_shows_the_packing_check_verdict(tmp_path: Path) -> None:
    backends = dataclasses.replace(fixed_backends(), packing_check_fn=lambda spec: VERDICT)

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", "tiny-cpu", "launch", backends=backends)
        async with app.run_test(size=(140, 40)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: wiz.plan_complete, 60, "the plan and preflight")
            shown = text_of(wiz.query_one("#plan-preflight"))
            assert "✓ preflight" in shown and VERDICT in shown.replace("\n", " "), shown

    run_async(go())
