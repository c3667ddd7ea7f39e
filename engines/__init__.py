"""Model runtimes behind small protocols. Never imports `pipelines` or `realtime`."""
