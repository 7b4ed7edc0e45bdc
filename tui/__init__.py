"""sft-tui: the Textual wizard, live dashboard, run summary and records browser over `runner`."""
