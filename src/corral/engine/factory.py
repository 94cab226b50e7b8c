"""Builds the engine the server config names. Imports lazily so that a deployment without Slurm
never imports the Slurm engine and vice versa."""

from __future__ import annotations

from corral.config import Settings
from corral.engine.base import Engine


def make_engine(settings: Settings) -> Engine:
    if settings.engine == "slurm":
        from corral.engine.slurm import SlurmEngine

        return SlurmEngine.from_settings(settings)
    from corral.engine.local import LocalEngine

    return LocalEngine.from_settings(settings)
