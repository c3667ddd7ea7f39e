"""The page's declarations (realtime.http.page): what a Panel may be, how the cards are laid out in
each mode, and that the page is fixed once it has been served. The browser tests show it working."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from realtime.http.page import CORE_PANELS, Page, Panel
from realtime.service.plugins import SERVICE_PLUGINS


def js(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text("export default function mount() { return { show() {}, clear() {} }; }\n")
    return path


def cards(page: Page, mode: str) -> list[str]:
    index = page.index()[0].decode()
    return re.findall(rf'data-panel="([^"]+)" data-mode="{mode}"', index)


def test_the_core_page_has_the_alerts_card_in_both_modes_and_the_plugins_add_theirs() -> None:
    page = Page()
    assert [p.name for p in page.panels] == [p.name for p in CORE_PANELS] == ["alerts"]
    assert cards(page, "live") == cards(page, "watch") == ["alerts"]
    page = Page()
    for plugin in SERVICE_PLUGINS:
        page.add(plugin.panels)
    # Captions, scene, alerts beside the video; captions, scene, alerts, clips below the frame.
    assert cards(page, "live") == ["captions", "scene", "alerts"]
    assert cards(page, "watch") == ["captions", "scene", "alerts", "clips"]
    assert {"alerts.js", "captions.js", "scene.js", "clips.js", "app.js", "router.js"} <= set(page.files)
    assert "index.html" not in page.files  # served as / only


def test_a_card_is_escaped_and_its_module_preloaded(tmp_path: Path) -> None:
    page = Page()
    page.add([Panel("odd", 'Odd <b>"title"</b>', js(tmp_path, "odd.js"), kinds=("a", "b"), modes=("watch",))])
    index = page.index()[0].decode()
    assert (
        '<section class="card" data-panel="odd" data-mode="watch" data-module="/static/odd.js" data-kinds="a b">\n'
        "  <h2>Odd &lt;b&gt;&quot;title&quot;&lt;/b&gt;</h2>\n</section>"
    ) in index
    assert '<link rel="modulepreload" href="/static/odd.js">' in index
    assert cards(page, "live") == ["alerts"]
    assert page.file("odd.js")[0] == (tmp_path / "odd.js").read_bytes()


def test_what_a_panel_may_not_be(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be a .js file"):
        Panel("p", "P", tmp_path / "p.py", kinds=("x",))
    with pytest.raises(ValueError, match="modes must be among"):
        Panel("p", "P", js(tmp_path, "p.js"), kinds=("x",), modes=("ask",))
    with pytest.raises(ValueError, match="modes must be among"):
        Panel("p", "P", js(tmp_path, "p.js"), kinds=("x",), modes=())
    page = Page()
    with pytest.raises(ValueError, match="two panels are named alerts"):
        page.add([Panel("alerts", "Again", js(tmp_path, "again.js"), kinds=("alerts",))])
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ValueError, match=r"two files are declared as /static/app.js"):
        page.add([Panel("mine", "Mine", js(other, "app.js"), kinds=("x",))])


def test_the_page_is_fixed_once_served(tmp_path: Path) -> None:
    page = Page()
    page.index()
    with pytest.raises(RuntimeError, match="before the page is first served"):
        page.add([Panel("late", "Late", js(tmp_path, "late.js"), kinds=("x",))])
