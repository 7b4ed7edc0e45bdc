"""Tests of the Textual app: Pilot walks, real runs through the app, snapshots, the binary in tmux."""
