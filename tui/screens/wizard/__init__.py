"""The wizard screen, split along its seams: fields (steps and spec fields), screen (layout, navigation, editing),
checks (background work), launch (the Launch step's actions) and render (what the checks' results look like)."""

from tui.screens.wizard.fields import ALL_FIELDS, FIELDS, STEP_IDS, STEP_OF_FIELD, STEPS
from tui.screens.wizard.screen import WizardScreen

__all__ = ["ALL_FIELDS", "FIELDS", "STEPS", "STEP_IDS", "STEP_OF_FIELD", "WizardScreen"]
