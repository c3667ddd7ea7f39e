"""Per-stream rules that turn tracks into alerts.

specs.py (config models) → engine.py (RuleEngine: pure, fed each frame's tracks) →
publishing.py (AlertPublisher: alert events, snapshots in the background). Geometry, the
hysteresis state per track and the per-subject alert lifecycle live in their own modules.
Import from the modules: this package stays import-free, because the config loads specs.py
and must not pull in the rest.
"""
