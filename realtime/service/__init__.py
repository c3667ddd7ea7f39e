"""The long-running service: its composition root (service.py) and the desired-state registry."""
