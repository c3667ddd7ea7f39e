"""Vision-language model client for vLLM's OpenAI-compatible API.

`types` and `errors` are plain data; `client.create_vlm_client` builds the aiohttp client (imported
only when a client is made, so the CLI starts fast without it)."""
