"""The long-running service: its composition root (service.py), which wires every floor below it."""
