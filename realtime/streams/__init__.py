"""One stream as the service sees it: its runner (the graph's owner), its view, and the SSE fan-out."""
