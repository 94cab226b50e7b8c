"""Slurm execution engine (see docs/slurm.md)."""

from corral.engine.slurm.engine import SlurmEngine

__all__ = ["SlurmEngine"]
