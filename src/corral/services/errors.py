"""Errors services raise; the API maps each to one HTTP status (see corral.api.app)."""

from __future__ import annotations

from collections.abc import Sequence


class ServiceError(Exception):
    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ServiceError):
    status_code = 404


class Forbidden(ServiceError):
    status_code = 403


class Conflict(ServiceError):
    status_code = 409


class Unauthenticated(ServiceError):
    status_code = 401


class Invalid(ServiceError):
    """Bad input found by a service (not by the Pydantic models): 422 with a field path."""

    status_code = 422

    def __init__(self, message: str, loc: tuple[str | int, ...] = ("body",)) -> None:
        super().__init__(message)
        self.loc = loc
        # each wrong field with its own message (the 422's detail lists them all): `each`
        self.items: tuple[tuple[tuple[str | int, ...], str], ...] = ((loc, message),)

    @classmethod
    def each(cls, items: Sequence[tuple[tuple[str | int, ...], str]]) -> Invalid:
        """One refusal for several wrong fields at once, each at its own place (a client that
        marks fields marks them all); its message names them all."""
        made = cls("; ".join(message for _, message in items), items[0][0])
        made.items = tuple(items)
        return made
