"""The live edges: ingest, NATS bus, HTTP, CLI."""
