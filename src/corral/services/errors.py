"""Errors services raise; the API maps each to one HTTP status (see corral.api.app)."""

from __future__ import annotations


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
