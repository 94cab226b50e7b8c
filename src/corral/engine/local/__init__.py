"""The local engine: supervised, sandboxed processes on this machine.

`LocalEngine` is imported lazily: the per-job supervisor lives in this package too, and its
start-up must not pay for importing the engine (psutil, pydantic settings, ...).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.engine.local.engine import LocalEngine

__all__ = ["LocalEngine"]


def __getattr__(name: str) -> object:
    if name == "LocalEngine":
        from corral.engine.local.engine import LocalEngine

        return LocalEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
