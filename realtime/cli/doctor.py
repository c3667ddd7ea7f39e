"""`vidsentry doctor`: which engines can run on this machine, and why not."""

from __future__ import annotations

from engines.registry import doctor


def doctor_command() -> int:
    checks = doctor()
    width = max(len(c.name) for c in checks)
    for check in checks:
        mark = "yes" if check.available else "no "
        print(f"{check.name:<{width}}  {mark}  {check.detail}")
    return 0 if any(c.available and c.name.startswith("onnxruntime") for c in checks) else 1
