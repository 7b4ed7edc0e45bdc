"""The key footer (tui.widgets.footer.KeyFooter) is rebuilt only when the keys it shows change: moving the focus
through the wizard keeps its keys, and a key that is enabled or disabled shows at once."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Input
from textual.widgets._footer import FooterKey

from tests.tui.conftest import fixed_backends, run_async, settle
from tui.app import make_app
from tui.widgets.footer import KeyFooter


def test_tabbing_through_the_wizard_keeps_the_footer_keys() -> None:
    run_async(_tab_through_the_wizard())


async def _tab_through_the_wizard() -> None:
    app = make_app("runs", "records", "tiny-cpu", "model", backends=fixed_backends())
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        keys = list(app.screen.query(FooterKey))
        assert {"ctrl+n", "ctrl+l", "ctrl+q"} <= {k.key for k in keys}
        focused = set()
        for _ in range(12):
            await pilot.press("tab")
            await pilot.pause()
            focused.add(type(app.focused).__name__)
        assert {"Input", "Select", "Switch"} <= focused  # the walk crossed widgets with different bindings
        assert list(app.screen.query(FooterKey)) == keys  # the same widgets: nothing was rebuilt


class Keys(App):
    BINDINGS = [Binding("f2", "go", "Go"), Binding("f3", "hidden", "Hidden", show=False)]
    go_enabled = True

    def compose(self) -> ComposeResult:
        yield Input(id="a")
        yield Input(id="b")
        yield KeyFooter()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return None if action == "go" and not self.go_enabled else True  # None: shown, disabled

    def action_go(self) -> None:
        pass


def test_a_key_that_is_disabled_shows_disabled_at_once() -> None:
    run_async(_disable_and_enable_a_key())


async def _disable_and_enable_a_key() -> None:
    app = Keys()
    async with app.run_test() as pilot:
        await pilot.pause()

        def go() -> FooterKey:
            return next(k for k in app.query(FooterKey) if k.key == "f2")

        assert not go().has_class("-disabled") and "f3" not in {k.key for k in app.query(FooterKey)}
        app.go_enabled = False
        app.refresh_bindings()
        await pilot.pause()
        await pilot.pause()
        assert go().has_class("-disabled")
        app.go_enabled = True
        app.refresh_bindings()
        await pilot.pause()
        await pilot.pause()
        assert not go().has_class("-disabled")
