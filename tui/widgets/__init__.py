"""Widgets drawn here because Textual has none like them: the loss chart, the memory bar and the spec field."""
