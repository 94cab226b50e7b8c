"""Execution engines: see base.py for the interface every engine implements."""
