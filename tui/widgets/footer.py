"""KeyFooter: Textual's key footer, recomposed only when the keys it would show change."""

from __future__ import annotations

from typing import Any

from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's Footer recomposes all its keys whenever the screen's bindings are refreshed, which is every focus
    change: each Tab or arrow through the wizard's fields rebuilt and restyled every key. This one does so only when
    the bindings it would show (those with `show`, and the command palette's; each with its enabled state and
    tooltip) differ from those it shows."""

    _shown: tuple[Any, ...] | None = None

    def bindings_changed(self, screen: Any) -> None:
        palette = screen.app.COMMAND_PALETTE_BINDING  # shown whatever its `show` (Footer.compose)
        shown = tuple((key, binding, enabled, tooltip) for key, (_, binding, enabled, tooltip)
                      in screen.active_bindings.items() if binding.show or key == palette)
        if self._bindings_ready and shown == self._shown:
            return
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self._shown = shown  # what the recompose below will show
        super().bindings_changed(screen)
