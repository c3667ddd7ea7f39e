"""Page tests: one headless Chromium per test session (see tests/support/browser.py), the real
service in-process, and the default people model so vtest's plaza has boxes to draw."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from engines.detector import Detector
from engines.registry import create_detector
from tests.support.browser import chromium, chromium_path, fake_media

HERE = Path(__file__).resolve().parent
SCREENSHOTS = Path(__file__).resolve().parents[4] / ".cache" / "screenshots"  # .cache is ignored by git


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The browser and the services live on the session's event loop, so the tests here run on it too.
    session_loop = pytest.mark.asyncio(loop_scope="session")
    for item in items:
        if pytest_asyncio.is_async_test(item) and item.path.is_relative_to(HERE):
            item.add_marker(session_loop, append=False)


@pytest.fixture(scope="session")
def people_detector(fall_model: Path) -> Iterator[Detector]:
    # The small nudenet model finds nothing on vtest; the people model finds 5-8 people per frame.
    detector = create_detector(fall_model, "onnx-cpu", threads=2)
    yield detector
    detector.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


__all__ = ["chromium", "chromium_path", "fake_media"]
