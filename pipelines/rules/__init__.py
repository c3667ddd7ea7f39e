"""Per-stream rules that turn tracks into alerts."""
