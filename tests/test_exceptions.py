"""One way to fail: every exception class the project defines derives from its layer's root, and
every root from the one project root (`engines.errors.VidsentryError`). A library's error is never
subclassed into our API: it is raised as one of ours, `from` the library's. A builtin base beside the
root (ValueError, TimeoutError, ...) is fine: callers catch those."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from engines.errors import EngineError, VidsentryError
from pipelines.errors import PipelineError
from realtime.errors import ServiceError

LAYER_ROOTS: dict[str, type[BaseException]] = {
    "engines": EngineError,
    "pipelines": PipelineError,
    "realtime": ServiceError,
}


def exception_classes(package: str) -> list[type[BaseException]]:
    """Every exception class defined at the top level of a module of `package`."""
    found: list[type[BaseException]] = []
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":  # runs the CLI when imported
            continue
        module = importlib.import_module(info.name)
        found += [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
        ]
    return found


@pytest.mark.parametrize("package", sorted(LAYER_ROOTS))
def test_every_exception_derives_from_its_layers_root(package: str) -> None:
    classes = exception_classes(package)
    assert classes
    root = LAYER_ROOTS[package]
    outside = [
        f"{c.__module__}.{c.__qualname__}" for c in classes if c is not VidsentryError and not issubclass(c, root)
    ]
    assert not outside, f"derive these from {root.__module__}.{root.__name__}"
    assert issubclass(root, VidsentryError)


@pytest.mark.parametrize("package", sorted(LAYER_ROOTS))
def test_no_exception_subclasses_a_third_party_error(package: str) -> None:
    ours = {*LAYER_ROOTS, "builtins"}
    borrowed = [
        f"{c.__module__}.{c.__qualname__} < {base.__module__}.{base.__qualname__}"
        for c in exception_classes(package)
        for base in c.__mro__
        if base.__module__.split(".")[0] not in ours
    ]
    assert not borrowed, "wrap the library's error (raise ours from it) rather than subclass it"


def test_the_check_sees_a_borrowed_base() -> None:
    import nats.errors

    class Borrowed(ServiceError, nats.errors.TimeoutError):
        pass

    assert [b for b in Borrowed.__mro__ if b.__module__.split(".")[0] == "nats"]
