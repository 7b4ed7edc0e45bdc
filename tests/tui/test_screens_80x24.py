"""Screens in an 80×24 terminal as a new user first sees them. The dashboard: a run line on one row, one precision
on the loss axis and in the rank table, a log title on one row and a log tail of the rank's steps and what it
printed (library progress bars and warnings left in the file). The plan's memory bar: one row however far over."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tui.conftest import CLOCK_T, DASH_ID, fixed_backends, run_async, settle, wait_for
from tests.tui.helpers import table_rows, terminal_text, text_of
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen, terminal_lines

# What transformers' weight loading leaves in a rank's log: one tqdm bar redrawn with carriage returns.
TQDM = "".join(f"\rLoading weights: {p:3d}%|{'█' * (p // 10):<10}| {p * 46 // 100}/46" for p in range(0, 101, 4))


def test_dashboard_at_80x24_keeps_its_lines_and_one_precision(synth: Path) -> None:
    log = synth / "runs" / DASH_ID / "logs" / "rank0.log"
    log.write_text(TQDM + "\n" + log.read_text())

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "dashboard", run_dir=Path("runs") / DASH_ID,
                       backends=fixed_backends(), clock=lambda: CLOCK_T, poll_s=60.0)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.view.ranks, 10,
                           "the dashboard's ranks")
            await settle(pilot)
            screen = app.screen
            rows = terminal_text(app).splitlines()
            assert len(rows) == 24
            # The run line is one row that ends with the ranks count (it used to wrap "ranks 2/2" onto a row alone).
            run_line = [r for r in rows if "step 37/100" in r]
            assert len(run_line) == 1 and "ranks 2/2" in run_line[0] and "tok/s" in run_line[0]
            assert screen.query_one("#run-line").size.height == 1
            # Every y label of the chart has 4 decimals, as the rank table's loss and smooth columns do.
            labels = re.findall(r"^ *(-?\d+(?:\.\d+)?) ┤", "\n".join(rows), re.M)
            assert len(labels) == 3 and all(re.fullmatch(r"\d+\.\d{4}", x) for x in labels), labels
            for row in table_rows(screen.query_one("#ranks")):
                assert re.fullmatch(r"\d+\.\d{4}", row[3]) and re.fullmatch(r"\d+\.\d{4}", row[4]), row
            # The log title is one row; the progress bar (one line, its last state) is left in the file and
            # counted in the title; the rank's steps come first, then what it printed.
            assert screen.query_one("#log-title").size.height == 1
            assert "log of rank 0" in text_of(screen.query_one("#log-title"))
            assert "1 library line(s) hidden" in text_of(screen.query_one("#log-title"))
            shown = text_of(screen.query_one("#log")).splitlines()
            assert [s for s in shown if "Loading weights" in s] == []
            assert shown[-4:] == ["[rank 0] loading sft-tui/tiny-qwen3 (4 layers)",
                                  "[rank 0] fully_shard: 4 decoder layers + root",
                                  "[rank 0] data: 2,500 conversations, packing into 512-token blocks",
                                  "[rank 0] training"]
            assert shown[:-4] == [f"step {s}/100  loss {loss:.4f}"
                                  for s, loss in screen.view.ranks[0].losses][-36:]

    run_async(go())


def test_terminal_lines_keep_what_was_drawn_last() -> None:
    assert terminal_lines("a\rb\rc\nplain\r\n\rdone\n") == ["c", "plain", "done"]
    assert terminal_lines("x\n\ny") == ["x", "", "y"]


def test_a_plan_many_times_too_big_keeps_its_memory_bar_on_one_row() -> None:
    """The capacity marker of a plan 10,000 times over its memory fell at column -1 and the bar was drawn twice
    over, onto a second row: the bar is one row of the pane's width, the marker at its first column."""
    from textual.app import App

    from tui.widgets.membar import MemoryBar

    class One(App):
        def compose(self):
            yield MemoryBar(id="bar")

    async def go() -> None:
        app = One()
        async with app.run_test(size=(78, 6)) as pilot:
            bar = app.query_one(MemoryBar)
            for cap in (11.8, 0.0001, 5000.0):
                bar.set_estimate({"activations": 114796.2, "process": 0.5}, 132016.19, cap, "host RAM")
                await settle(pilot)
                rows = bar.render().plain.splitlines()
                assert 0 < len(rows[0]) <= 78 and rows[0].count("│") == 1, (cap, rows[0])
                assert rows[1:] == ["■ activations 114796.2  ■ process 0.50"]
                assert bar.size.height == 2

    run_async(go())


def test_the_diff_gives_a_long_value_the_room_its_neighbour_leaves(synth: Path) -> None:
    """Two records compared at 80 columns: B's column needs 9 cells, so A's failure message and most of its log
    path show (each column got half and both were cut at 23 cells), and the head is one row."""
    from tui.screens.records import DiffScreen

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "records", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            for key in ("down", "space", "down", "space", "d"):
                await pilot.press(key)
            await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen), 10, "the diff")
            rows = {r[0]: r[1:] for r in table_rows(app.screen.query_one("#diff"))}
            assert rows["failure.message"] == ["killed by signal 9 (SIGKILL)", "-"]
            log = rows["failure.log"][0]
            assert log.startswith("runs/20260101-001500-demo-3d4e5f/logs") and len(log) > 30
            assert rows["status"] == ["failed", "succeeded"]
            assert app.screen.query_one("#diff-head").size.height == 1
            assert "(9 differ)" in text_of(app.screen.query_one("#diff-head"))

    run_async(go())


def test_a_record_names_the_data_it_trained_on() -> None:
    from tui.screens.records import dataset_line

    spec = {"dataset": {"id": "local/qa", "path": "qa.json", "format": "alpaca",
                        "columns": {"instruction": "question", "output": "answer"}}}
    assert dataset_line(spec) == "local/qa (qa.json) · alpaca · instruction=question, output=answer"
    assert dataset_line({"dataset": {"id": "sft-tui/tiny-chat", "path": "embedded:data/chat.jsonl",
                                     "format": "auto", "columns": {}}}) == "sft-tui/tiny-chat"


def test_the_what_if_of_gpu_types_is_for_gpu_plans(tmp_path: Path) -> None:
    """A GPU plan's what-if table (GiB per GPU by tokens per block × GPU type), whole at 80 columns; a CPU plan
    shows none (it showed the GPU table there too), only where to ask for it."""
    from tests.tui.conftest import ready
    from tui.specform import load_recipe_dict

    async def plan(sets: list[str]):
        app = make_app(tmp_path / "runs", tmp_path / "records", load_recipe_dict("tiny-cpu", sets), "plan",
                       backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: wiz.sweep is not None, 20, "the what-if")
            await settle(pilot)
            grid_w = wiz.query_one("#sweep")
            return wiz.sweep, text_of(wiz.query_one("#sweep-title")), grid_w.display, text_of(grid_w), \
                grid_w.size.width

    async def go() -> None:
        sweep, title, shown, _, _ = await plan([])
        assert sweep == {"cpu": True} and not shown and "plan for GPUs" in title
        sweep, title, shown, text, width = await plan(["hardware.device=cuda", "hardware.gpu=H100-80GB"])
        assert shown and title.startswith("what-if: GiB needed per GPU, 2 GPU(s) per node"), (sweep, title)
        lines = text.splitlines()
        assert max(map(len, lines)) <= width  # whole in the pane
        # beneath the grid, the run (on its H100 at 512 tokens) as each method, its own marked
        assert lines.pop() == "by method: full• 21.9 ✓ · LoRA 21.9 ✓ · QLoRA 21.9 ✓"  # the fake plans all alike
        grid = [line.split() for line in lines]
        # the spec's own 512 (marked •), then 2,048 / 8,192 / 32,768 tokens per block
        assert grid[0] == ["GPU", "512", "•", "2,048", "8,192", "32,768"]
        rows = {r[0]: [f"{r[i]} {r[i + 1]}" for i in range(1, len(r), 2)] for r in grid[1:]}
        assert set(rows) == {"H100-80GB", "H200", "B300"}
        # activations 5, 20 and 80 GiB over 20.7 GiB of the rest
        assert rows["H100-80GB"][1:] == ["25.7 ✓", "40.7 ✓", "100.7 ✗"]
        assert rows["B300"][1:] == ["25.7 ✓", "40.7 ✓", "100.7 ✓"]

    run_async(go())


def test_the_rank_table_widens_when_the_first_losses_arrive(synth: Path) -> None:
    """Ranks seen before their first step have "-" for a loss; the column must widen when 4 decimals arrive (it kept
    its width and showed "6.28" beside the smooth column's "6.2656")."""
    events = synth / "runs" / DASH_ID / "events"
    later = {r: (events / f"rank{r}.jsonl").read_text().splitlines() for r in (0, 1)}
    for r, lines in later.items():
        (events / f"rank{r}.jsonl").write_text(lines[0] + "\n" if r == 1 else "")  # rank 1's start event only

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "dashboard", run_dir=Path("runs") / DASH_ID,
                       backends=fixed_backends(), clock=lambda: CLOCK_T, poll_s=60.0)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.view.ranks, 10,
                           "the ranks' start")
            table = app.screen.query_one("#ranks")
            assert [row[3] for row in table_rows(table)] == ["-"]
            (events / "rank0.jsonl").write_text(later[0][0] + "\n")  # rank 0 starts second
            app.screen._tick(reschedule=False)
            await settle(pilot)
            assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == ["0", "1"]  # listed by rank
            # The highlighted row is the rank whose log shows.
            assert str(table.get_row_at(table.cursor_row)[0]) == str(app.screen.log_rank)
            for r, lines in later.items():
                (events / f"rank{r}.jsonl").write_text("\n".join(lines) + "\n")
            app.screen._tick(reschedule=False)
            await settle(pilot)
            rows = [line for line in terminal_text(app).splitlines() if line.startswith((" 0 ", " 1 "))]
            assert len(rows) == 2
            assert [row.split()[0] for row in rows] == ["0", "1"]
            for row, cells in zip(rows, [[str(c) for c in table.get_row_at(i)] for i in range(2)]):
                assert re.fullmatch(r"\d+\.\d{4}", cells[3]) and f" {cells[3]} " in row and f" {cells[4]} " in row

    run_async(go())


def test_the_diff_shows_the_selected_rows_values_whole(synth: Path) -> None:
    """The table cuts values to its columns; the selected row's field and both values show whole below it."""
    from tui.screens.records import DiffScreen

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "records", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            for key in ("down", "space", "down", "space", "d"):
                await pilot.press(key)
            await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen), 10, "the diff")
            diff = app.screen
            table = diff.query_one("#diff")
            keys = [r[0] for r in table_rows(table)]
            assert text_of(diff.query_one("#diff-detail")) == "status\nA: failed\nB: succeeded"
            await pilot.press(*["down"] * keys.index("failure.log"))
            await settle(pilot)
            cells = table_rows(table)[keys.index("failure.log")]
            assert cells[1].endswith("…")  # cut in the table
            whole = diff.a["failure"]["log"]
            assert not whole.startswith(cells[1]) and whole.startswith(cells[1][:-1])
            assert text_of(diff.query_one("#diff-detail")) == f"failure.log\nA: {whole}\nB: -"
            assert f"A: {whole}" in terminal_text(app).splitlines()[-3]

    run_async(go())


def test_the_records_browser_says_which_run_a_replay_re_ran(synth: Path) -> None:
    from runner.record import records as records_mod
    from tests.tui.conftest import RUN_ID, synthetic_record

    replay_id = "20260101-010000-demo-9f8e7d"
    records_mod.save(synth / "records" / f"{replay_id}.json",
                     synthetic_record(replay_id, replay_of=RUN_ID, created="2026-01-01T01:00:00+00:00"))

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "records", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            table = app.screen.query_one("#records")
            labels = [str(c.label) for c in table.columns.values()]
            rows = {r[1]: dict(zip(labels, r)) for r in table_rows(table)}
            assert rows[replay_id]["origin"] == f"replay of {RUN_ID}"
            assert rows[RUN_ID]["origin"] == "-"

    run_async(go())


def test_the_log_pane_shows_training_not_library_noise(synth: Path) -> None:
    """transformers' FutureWarning (and the source line under it) and its weight-loading bar stay in the log file;
    the pane shows the rank's steps and what it printed itself, and says how many lines it left out."""
    log = synth / "runs" / DASH_ID / "logs" / "rank0.log"
    noise = ("/x/site-packages/transformers/modeling_utils.py:1234: FutureWarning: `torch_dtype` is deprecated! "
             "Use `dtype` instead!\n  warnings.warn(\n" + TQDM + "\n")
    log.write_text(noise + log.read_text() + "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "RuntimeError: boom\n")

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "dashboard", run_dir=Path("runs") / DASH_ID,
                       backends=fixed_backends(), clock=lambda: CLOCK_T, poll_s=60.0)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.view.ranks, 10,
                           "the dashboard's ranks")
            await settle(pilot)
            shown = text_of(app.screen.query_one("#log")).splitlines()
            assert not [s for s in shown if "Warning" in s or "warnings.warn" in s or "Loading weights" in s]
            assert shown[-4:] == ["[rank 0] training", "Traceback (most recent call last):", '  File "x.py", line 1',
                                  "RuntimeError: boom"]
            steps = [s for s in shown if s.startswith("step ")]
            assert steps[-1] == f"step 40/100  loss {app.screen.view.ranks[0].losses[-1][1]:.4f}"
            assert "3 library line(s) hidden" in text_of(app.screen.query_one("#log-title"))
            assert noise in log.read_bytes().decode()  # the file keeps them

    run_async(go())


def test_training_lines_leave_warnings_and_progress_bars_out() -> None:
    from tui.screens.dashboard import training_lines

    lines = ["a.py:3: UserWarning: careful", "  warnings.warn(", "Loading weights: 100%|██| 46/46",
             "Writing model shards: 100%|█| 1/1", "[rank 0] done after 6 steps", "", "  indented own line"]
    assert training_lines(lines) == (["[rank 0] done after 6 steps", "  indented own line"], 4)


def test_a_cancelled_runs_summary_says_how_to_resume_it(synth: Path) -> None:
    """The wizard's summary of a cancelled run says, in the CLI's words, whether and how it resumes."""
    from runner.record.compare import resume_sentence
    from runner.record import records as records_mod
    from tests.tui.conftest import synthetic_record
    from tui.screens.summary import SummaryScreen

    cases = {
        "20260101-020000-demo-111111": {"cause": "cancelled", "by": "the wizard", "resumable": True,
                                        "checkpoint_step": 20, "checkpoint": "runs/x/checkpoints/step-20",
                                        "resume": "runner run --resume runs/20260101-020000-demo-111111"},
        "20260101-020000-demo-222222": {"cause": "cancelled", "signal": "SIGINT", "resumable": False,
                                        "checkpoint_step": None, "checkpoint": None, "resume": None},
    }
    recs = {}
    for run_id, cancel in cases.items():
        rec = synthetic_record(run_id, status="cancelled")
        rec["cancel"] = cancel
        recs[run_id] = records_mod.save(synth / "records" / f"{run_id}.json", rec)

    async def summary(run_id: str) -> str:
        app = make_app("runs", "records", "tiny-cpu", "summary", record_path=Path("records") / f"{run_id}.json",
                       backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen), 10, "the summary")
            await settle(pilot)
            return text_of(app.screen.query_one("#summary-resume")), terminal_text(app)

    async def go() -> None:
        for run_id in cases:
            line, screen = await summary(run_id)
            assert line == "resume: " + resume_sentence(recs[run_id])
            assert line.replace(" ", "") in screen.replace("\n", "").replace(" ", "").replace("│", "")
        line, _ = await summary("20260101-020000-demo-111111")
        assert line.endswith("checkpoint at step 20: resume with `runner run --resume "
                             "runs/20260101-020000-demo-111111`")
        line, _ = await summary("20260101-020000-demo-222222")
        assert line.startswith("resume: cancelled by SIGINT; no checkpoint, so it cannot be resumed")

    run_async(go())


def test_the_not_fit_dialog_asks_its_own_question(tmp_path: Path) -> None:
    """A CPU run over a 0.05 GiB memory cap, launched from the wizard: the real preflight refuses it as predicted
    not to fit, and the dialog says why and asks "Launch anyway?" without the CLI's "pass --force"."""
    from tests.tui.conftest import ready
    from tui.screens.modals import ConfirmScreen
    from tui.specform import load_recipe_dict

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records",
                       load_recipe_dict("tiny-cpu", ["hardware.memory_gib=0.05"]), "launch")
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: wiz.plan_complete, 120, "the plan")
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 120, "the not-fit dialog")
            question = app.screen.question
            assert question.startswith("predicted not to fit:") and question.endswith("\n\nLaunch anyway?")
            assert "--force" not in question
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen is wiz, 10, "back to the wizard")
            assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

    run_async(go())


def test_the_load_dialog_shows_its_buttons(tmp_path: Path) -> None:
    from textual.widgets import Button

    from tests.tui.conftest import ready
    from tui.screens.modals import PathPrompt

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "launch", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, PathPrompt), 10, "the load dialog")
            await settle(pilot)
            for button in app.screen.query(Button):
                region = button.region
                assert region.height >= 1 and region.bottom <= 24, (button.id, region)
            shown = terminal_text(app)
            assert "Load" in shown and "Cancel (esc)" in shown

    run_async(go())


def test_the_launch_step_shows_the_description_whole(tmp_path: Path) -> None:
    """The description field shows only what its row holds (its tail, once typed); the Launch step's summary gives
    the name and description the run is recorded under, whole, wrapped at 80 columns."""
    from tests.tui.conftest import ready
    from tests.tui.helpers import fill

    long = ("a full fine-tune of the embedded model on the chat data, to compare with the LoRA run of yesterday "
            "at the same learning rate and block length")

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "launch", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            fill(wiz, "description", long)
            await wait_for(pilot, lambda: wiz.data["description"] == long, 10, "the description")
            await settle(pilot)
            summary = text_of(wiz.query_one("#launch-summary"))
            assert f"recorded as tiny-cpu: {long}" in " ".join(summary.split())
            shown = " ".join(" ".join(r.split("▕", 1)[-1].split()) for r in terminal_text(app).splitlines())
            assert long in shown

    run_async(go())
