"""Dashboard tests: the TUI under Pilot, its SVG snapshots, replay, and real terminals (tmux)."""
