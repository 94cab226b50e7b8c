"""Placeholder: commands of this area are registered here."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the root `corral` app."""
