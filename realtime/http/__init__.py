"""The HTTP side of `vidsentry serve`: stream API, server-sent events, metrics, probes, web page."""

from realtime.http.app import HttpServer, ListenError, create_app
from realtime.http.context import HttpContext

__all__ = ["HttpContext", "HttpServer", "ListenError", "create_app"]
