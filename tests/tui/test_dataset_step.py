"""The wizard's Dataset step sets what its own errors ask for: the format, the columns, the role names and which
turns train (a tool call among the trained tokens), at 80×24; the data's id follows a new path; no "messages
column: messages" for data without one."""

from __future__ import annotations

import json
import re
from pathlib import Path

from textual.widgets import Select

from tests.tui.conftest import fixed_backends, ready, run_async, wait_for
from tests.tui.helpers import fill, terminal_text, text_of
from tui.app import make_app
from tui.specform import load_recipe_dict

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
RENAMED = {"instruction": "question", "input": "context", "output": "answer"}


def _qa(tmp_path: Path) -> Path:
    """The alpaca fixture under a user's own column names."""
    rows = json.loads((DATA / "alpaca_en_demo.json").read_text())
    path = tmp_path / "qa.json"
    path.write_text(json.dumps([{RENAMED[k]: v for k, v in r.items()} for r in rows]))
    return path


def _app(tmp_path: Path, data: dict):
    return make_app(tmp_path / "runs", tmp_path / "records", data, "dataset", backends=fixed_backends())


async def _detected(pilot, wiz, text: str, what: str) -> str:
    await wait_for(pilot, lambda: text in text_of(wiz.query_one("#data-detect")), 60, what)
    return text_of(wiz.query_one("#data-detect"))


def test_format_and_columns_set_in_the_wizard_read_the_users_file(tmp_path: Path) -> None:
    qa = _qa(tmp_path)

    async def go() -> None:
        app = _app(tmp_path, load_recipe_dict("tiny-cpu", [f"dataset.path={qa}"]))
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            assert "messages column" not in terminal_text(app) and "format" in terminal_text(app)
            await _detected(pilot, wiz, "cannot tell the dataset's format", "the file's columns")
            wiz.query_one("#f-dataset-format Select", Select).value = "alpaca"
            await _detected(pilot, wiz, "needs columns 'instruction' and 'output'", "alpaca without its columns")
            assert wiz.data_problems and wiz.query_one("#launch").disabled
            fill(wiz, "dataset.columns", "instruction=question, input=context, output=answer")
            detect = await _detected(pilot, wiz, "alpaca (set)", "the rows through the mapped columns")
            assert "✓" in detect and "question, context, answer" in detect
            assert wiz.data["dataset"]["format"] == "alpaca" and wiz.data["dataset"]["columns"] == RENAMED
            await wait_for(pilot, lambda: "first conversation" in text_of(wiz.query_one("#data-preview")), 30,
                           "the preview")
            assert "Reverse the letters of the word." in text_of(wiz.query_one("#data-preview"))
            assert not wiz.data_problems and "✗" not in str(wiz.query_one("#steps").get_option_at_index(1).prompt)

    run_async(go())


def test_role_names_and_trained_turns_set_in_the_wizard(tmp_path: Path) -> None:
    """ShareGPT rows whose roles are `customer` and `bot` read once the role names are mapped; `train on` set to
    assistant+tool_calls puts a tool call in the trained tokens of the preview (the call and the tool list show)."""
    chat = tmp_path / "support.jsonl"
    chat.write_text(json.dumps({"conversations": [{"from": "customer", "value": "Where is my parcel?"},
                                                  {"from": "bot", "value": "It left the depot today."}]}) + "\n")

    async def go() -> None:
        app = _app(tmp_path, load_recipe_dict("tiny-cpu", [f"dataset.path={chat}", "dataset.format=sharegpt"]))
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            assert wiz.data["dataset"]["id"] == "local/support"  # `sft-tui --set dataset.path=...` names it too
            preview = wiz.query_one("#data-preview")
            fill(wiz, "dataset.roles", "customer=user, bot=assistant")
            await wait_for(pilot, lambda: "It left the depot today." in _trained(preview), 60,
                           "the preview with the mapped roles")
            assert wiz.data["dataset"]["roles"] == {"customer": "user", "bot": "assistant"} and not wiz.data_problems
            # Tool calls: the glaive fixture, its calls trained as `train on` says.
            fill(wiz, "dataset.roles", "")
            wiz.query_one("#f-dataset-train-on Select", Select).value = "assistant+tool_calls"
            fill(wiz, "dataset.path", str(DATA / "glaive_toolcall_en_demo.json"))
            await wait_for(pilot, lambda: "How many letters" in text_of(preview), 60, "the tool-calling preview")
            # The data is named after its new file, and the field shows it.
            assert wiz.data["dataset"]["id"] == "local/glaive_toolcall_en_demo"
            assert wiz.query_one("#f-dataset-id Input").value == "local/glaive_toolcall_en_demo"
            assert wiz.data["dataset"]["train_on"] == "assistant+tool_calls"
            assert "<tools>" in text_of(preview)  # the tool list is rendered
            assert _trained(preview).startswith('<tool_call>\n{"name": "get_word_length", "arguments": {"word": '
                                                '"apple"}}\n</tool_call>'), _trained(preview)

    run_async(go())


def _trained(preview) -> str:
    """The text of the preview's trained tokens (styled bold underline)."""
    content = preview.content
    if isinstance(content, str):
        return ""
    return "".join(content.plain[s.start:s.end] for s in content.spans if "underline" in str(s.style))


def test_the_preview_shows_characters_whole_and_packs_enough_conversations(tmp_path: Path) -> None:
    """An alpaca-style file with "Klämbt": the preview shows the word as written (each token
    decoded alone showed "Kl��mbt", "ä" being two byte-level tokens), and packing is judged on a count of
    conversations (at least 64 of the file's 80, where 8 blocks' worth of tokens took 57), not on what a few seconds
    of a loaded machine allowed."""
    import unicodedata

    from runner.gate.preview import SAMPLE_CONVERSATIONS_MIN

    names = tmp_path / "names.jsonl"
    rows = [{"instruction": f"Who is Klämbt? ({i})", "input": "",
             "output": f"Klämbt ({i}) is a name: Kläm-bt, façade, naïve."} for i in range(80)]
    names.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")

    async def go() -> None:
        app = _app(tmp_path, load_recipe_dict("tiny-cpu", [f"dataset.path={names}"]))
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: "first conversation" in text_of(wiz.query_one("#data-preview")), 60,
                           "the preview")
            preview = text_of(wiz.query_one("#data-preview"))
            assert "Klämbt" in preview and "façade" in preview and "naïve" in preview
            assert "\ufffd" not in preview
            assert all(unicodedata.category(c) != "Cs" for c in preview)
            await wait_for(pilot, lambda: "packing" in text_of(wiz.query_one("#data-packing")), 60, "packing")
            packing = text_of(wiz.query_one("#data-packing"))
            sampled = int(re.search(r"on a sample of (\d+) conversations", packing).group(1))
            assert SAMPLE_CONVERSATIONS_MIN <= sampled <= len(rows), packing

    run_async(go())
