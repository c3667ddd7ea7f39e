"""Per-stream orchestration in asyncio, model-agnostic. Never opens a socket itself."""
