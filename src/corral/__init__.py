"""Corral: a platform for shared GPU clusters."""

__version__ = "0.1.0"
