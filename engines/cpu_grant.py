"""How many CPU threads the current model call was granted, for engines that can use more or fewer.

A scheduler above the engines (pipelines.compute) decides how many of the machine's cores a model
call may use and says so here, on the calling thread, for the length of the call. An engine with
a choice of thread pools (ONNX Runtime's wide session against its narrow ones) reads it and never
uses more threads than it was given. With no scheduler, nothing is granted and every engine keeps
its own choice.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()


def granted_threads() -> int | None:
    """Threads granted to the model call running on this thread; None when no scheduler decides."""
    return getattr(_local, "threads", None)


@contextlib.contextmanager
def granted(threads: int) -> Iterator[None]:
    previous = granted_threads()
    _local.threads = threads
    try:
        yield
    finally:
        _local.threads = previous
