"""Plan, launch, train and record SFT runs; no UI code (the TUI lives in `tui`)."""

__version__ = "0.1.0"
