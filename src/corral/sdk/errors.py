"""What the SDK raises: CorralError and its kinds, with messages fit for a person."""

from __future__ import annotations

from typing import Any


class CorralError(Exception):
    """Anything that went wrong talking to Corral, with a message fit for a person."""

    def __init__(self, message: str, status_code: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.detail = detail


class ServerUnreachable(CorralError):
    pass


class AuthenticationFailed(CorralError):
    pass


class ApiError(CorralError):
    pass


def describe_detail(detail: Any) -> str:
    """`{"detail": ...}` as one readable text (422 lists become "field.path: message" lines)."""
    if isinstance(detail, list):
        lines = []
        for item in detail:
            if isinstance(item, dict):
                loc = [str(p) for p in item.get("loc", []) if p not in ("body", "query", "path")]
                where = ".".join(loc)
                lines.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
            else:
                lines.append(str(item))
        return "\n".join(lines)
    return str(detail)
