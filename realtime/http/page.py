"""`GET /` and `/static/{name}`: the page, plain HTML + JS + CSS shipped inside the package.

The page holds no stream data itself: its script reads `/api` like any client (with the bearer
token when one is configured), so the page needs no token and leaks nothing. There is no inline
script or style, so the default `Content-Security-Policy` (`default-src 'self'`) covers it.

Its cards are declared, not written into the page: a `Panel` names a JS module, a title and the
event kinds it shows. The core declares the page's own files and its core panels here; each
service plugin declares its capability's panels (`ServicePlugin.panels`), and the service hands
them to `add_panels`. `index.html` gets one card shell per panel and mode; the page's script
imports each declared module and routes each event to the panels that declared its kind.
Exactly what is declared is served, each file read once, on first use; every other name is a 404.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable

from aiohttp import web

STATIC = resources.files("realtime.http").joinpath("static")
MODES = ("live", "watch")  # the tabs a panel can be shown in: Go live, Watch cameras

CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".html": "text/html"}


@dataclass(frozen=True, slots=True)
class Panel:
    """A card on the page that shows some event kinds of the stream in view.

    Its module is served as `/static/<file name>` and default-exports `mount(card, view)`, which
    fills the card and returns `{show(kind, body, message), clear(), select?(streamId, signal)}`
    (realtime/http/static/router.js says what each is for)."""

    name: str  # unique on the page; its card carries it as data-panel
    title: str  # the card's heading
    module: Traversable  # the JS module (a package resource, or any readable file)
    kinds: tuple[str, ...]  # the event kinds routed to it, from the DataChannel and from SSE alike
    modes: tuple[str, ...] = MODES  # where it is shown
    order: int = 50  # cards are laid out by this, then by name, in each mode

    def __post_init__(self) -> None:
        if not self.module.name.endswith(".js"):
            raise ValueError(f"panel {self.name}: its module must be a .js file, not {self.module.name}")
        if not self.modes or set(self.modes) - set(MODES):
            raise ValueError(f"panel {self.name}: modes must be among {MODES}, not {self.modes}")


# The page's own files: its skeleton and the two modes' views that route events to the panels.
PAGE_FILES = tuple(
    STATIC.joinpath(name)
    for name in (
        "app.js",
        "api.js",
        "router.js",
        "sse.js",
        "overlay.js",
        "masks.js",
        "golive.js",
        "watch.js",
        "whep.js",
        "streams.js",
        "timeline.js",
        "app.css",
        "icon.svg",
    )
)

CORE_PANELS = (Panel("alerts", "Alerts", STATIC.joinpath("alerts.js"), kinds=("alerts",), order=30),)


def static(name: str) -> Traversable:
    """A file shipped in the page's own folder, for a plugin's panel."""
    return STATIC.joinpath(name)


class Page:
    """What the page is made of: its files and the declared panels (frozen once first served)."""

    def __init__(self) -> None:
        self.files: dict[str, Traversable] = {}
        self.panels: list[Panel] = []
        self._cache: dict[str, tuple[bytes, str]] = {}
        self._index: tuple[bytes, str] | None = None
        for file in PAGE_FILES:
            self._add_file(file)
        self.add(CORE_PANELS)

    def _add_file(self, file: Traversable) -> None:
        known = self.files.setdefault(file.name, file)
        if known != file:
            raise ValueError(f"two files are declared as /static/{file.name}: {known} and {file}")

    def add(self, panels: Iterable[Panel]) -> None:
        if self._index is not None:
            raise RuntimeError("panels are declared before the page is first served")
        for panel in panels:
            if any(p.name == panel.name for p in self.panels):
                raise ValueError(f"two panels are named {panel.name}")
            self._add_file(panel.module)
            self.panels.append(panel)

    def file(self, name: str) -> tuple[bytes, str]:
        """The file's bytes and its ETag (KeyError: not declared)."""
        if name not in self._cache:
            self._cache[name] = tagged(self.files[name].read_bytes())
        return self._cache[name]

    def index(self) -> tuple[bytes, str]:
        if self._index is None:
            template = STATIC.joinpath("index.html").read_text("utf-8")
            for mode in MODES:
                template = template.replace(f"<!-- panels:{mode} -->", self._cards(mode))
            self._index = tagged(template.replace("<!-- modules -->", self._preloads()).encode("utf-8"))
        return self._index

    def _in(self, mode: str) -> list[Panel]:
        return sorted((p for p in self.panels if mode in p.modes), key=lambda p: (p.order, p.name))

    def _cards(self, mode: str) -> str:
        # The shells only: each module fills its own card; the title is here so the page reads the
        # same before the modules run.
        return "\n".join(
            f'<section class="card" data-panel="{html.escape(p.name)}" data-mode="{mode}"'
            f' data-module="/static/{html.escape(p.module.name)}" data-kinds="{html.escape(" ".join(p.kinds))}">'
            f"\n  <h2>{html.escape(p.title)}</h2>\n</section>"
            for p in self._in(mode)
        )

    def _preloads(self) -> str:
        # Fetched alongside app.js rather than after it has run and found the cards.
        names = dict.fromkeys(p.module.name for p in self.panels)
        return "\n".join(f'<link rel="modulepreload" href="/static/{html.escape(n)}">' for n in names)


PAGE = web.AppKey("vidsentry_page", Page)


def tagged(data: bytes) -> tuple[bytes, str]:
    return data, '"' + hashlib.sha256(data).hexdigest()[:32] + '"'


def _serve(request: web.Request, name: str, data: bytes, etag: str) -> web.Response:
    # no-cache: revalidated on every load (a 304 when unchanged), so a restarted service never
    # runs an old script against a new API.
    headers = {"Cache-Control": "no-cache", "ETag": etag}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    content_type = CONTENT_TYPES[name[name.rfind(".") :]]
    return web.Response(body=data, content_type=content_type, charset="utf-8", headers=headers)


async def index(request: web.Request) -> web.Response:
    return _serve(request, "index.html", *request.app[PAGE].index())


async def static_route(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    page = request.app[PAGE]
    if name not in page.files:  # exact names only: nothing else in the folder, no paths
        raise web.HTTPNotFound()
    return _serve(request, name, *page.file(name))


def add_routes(app: web.Application) -> None:
    app[PAGE] = Page()
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static_route)


def add_panels(app: web.Application, panels: Iterable[Panel]) -> None:
    """A plugin's panels on the page (before the app serves it)."""
    app[PAGE].add(panels)
