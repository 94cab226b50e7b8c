"""What the SDK raises: CorralError and its kinds, with messages fit for a person."""

from __future__ import annotations

import re
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
    """`{"detail": ...}` as one readable text (422 lists become "field.path: message" lines, each
    naming its field once: see `located`)."""
    if isinstance(detail, list):
        lines = []
        for item in detail:
            if isinstance(item, dict):
                loc = [str(p) for p in item.get("loc", []) if p not in ("body", "query", "path")]
                lines.append(located(loc, str(item.get("msg"))))
            else:
                lines.append(str(item))
        return "\n".join(lines)
    return str(detail)


def located(loc: list[str], msg: str) -> str:
    """One 422 error as "path: message" with its field named once. Many messages name their
    field already ("since 'x' is not a time", "field 'name' 'A B' must be ...", "the field
    'command' is required"): "name: field 'name' ..." said it twice. A message that starts with
    the field's name gets the whole path in its place; one that quotes it, the path above it."""
    if not loc:
        return msg
    path, field = ".".join(loc), loc[-1]
    if field.isidentifier() and re.match(rf"{re.escape(field)}\b", msg):
        return path + msg[len(field) :]
    if f"'{field}'" in msg:
        return f"{'.'.join(loc[:-1])}: {msg}" if len(loc) > 1 else msg
    return f"{path}: {msg}"
