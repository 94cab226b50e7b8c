"""Request dependencies: a DB session per request and the authenticated Principal."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from corral.api.pattern_words import worded
from corral.config import PUBLIC_URL_ENV
from corral.services.auth import (
    Principal,
    authenticate_session,
    authenticate_token,
    cached_principal,
    csrf_matches,
    principal_generation,
    remember_principal,
    sha256_hex,
)
from corral.services.errors import Forbidden, Unauthenticated

SESSION_COOKIE = "corral_session"  # the portal's session cookie over plain http (the demo)
# Over https a `__Host-` one (Secure, Path=/, no Domain): a sibling host (`Domain=`) or a
# plain-http answer for the host (anyone on the network path) cannot plant or overwrite it.
SECURE_SESSION_COOKIE = "__Host-corral_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def get_db(request: Request) -> AsyncIterator[Session]:
    """A session per request. Async on purpose: its teardown (returning the connection to the
    pool) then runs on the event loop. A sync teardown needs a worker thread, and when every worker
    thread is waiting for a pooled connection, nothing can give one back: a deadlock under load."""
    factory: sessionmaker[Session] = request.app.state.session_factory
    with factory() as session:
        yield session


DB = Annotated[Session, Depends(get_db)]


def portal_https(scope: Mapping[str, Any]) -> bool:
    """Whether browsers reach the portal over https: this request came so (Corral's own TLS, or a
    proxy trusted for X-Forwarded-Proto, CORRAL_FORWARDED_ALLOW_IPS), or CORRAL_PUBLIC_URL says so
    (a TLS proxy not trusted for that header makes the request look plain)."""
    if scope.get("scheme") in ("https", "wss"):
        return True
    return os.environ.get(PUBLIC_URL_ENV, "").strip().lower().startswith("https://")


def session_cookie_name(scope: Mapping[str, Any]) -> str:
    """The portal's session cookie for this request: SECURE_SESSION_COOKIE over https, where a
    plain-named one is never accepted (anyone able to set a cookie for the host could have
    planted it), else SESSION_COOKIE."""
    return SECURE_SESSION_COOKIE if portal_https(scope) else SESSION_COOKIE


def session_secret(connection: HTTPConnection) -> str | None:
    """The portal session's secret this request (or WebSocket) carries under the cookie name that
    fits it (session_cookie_name), or None."""
    return connection.cookies.get(session_cookie_name(connection.scope)) or None


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` value as authentication reads it (the
    scheme in any case, blanks around the token dropped), or None when it is not one. The rate
    limits key on the same reading (corral.api.limits.caller_key): `bearer X ` is `Bearer X`."""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    token = bearer_token(header)
    if token is None:
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token


async def get_principal(request: Request, db: DB) -> Principal:
    """Bearer token first (CLI, SDK); otherwise the portal's session cookie, whose state-changing
    requests must carry the CSRF token the login returned. A recently seen token is answered from
    the principal cache on the event loop; anything else is looked up in a worker thread."""
    token = _bearer(request)
    if token is not None:
        key, now = sha256_hex(token), time.time()
        principal = cached_principal(key, now)
        if principal is None:
            generation = principal_generation()
            principal = await run_in_threadpool(_authenticate_released, request, db)
            remember_principal(key, principal, now, generation)
    else:
        principal = await run_in_threadpool(_authenticate_released, request, db)
    # Where this request came from, for the audit log (the cached principal may be another's).
    return replace(principal, source=client_address(request))


def client_address(request: Request) -> str:
    """The request's TCP peer address; behind a reverse proxy named in CORRAL_FORWARDED_ALLOW_IPS,
    the client address it sends in X-Forwarded-For (uvicorn's proxy headers, off unless that is
    set; docs/security.md)."""
    return request.client.host if request.client else "unknown"


def same_origin(headers: Any) -> bool:
    """Whether a browser's `Origin` is the host this request was sent to (`Host`, port included;
    a reverse proxy passes it on as sent): the portal's own pages, not another site's, nor a
    sibling host of the same site (SameSite=Lax lets those send the cookie). False without one."""
    origin = headers.get("origin")
    if origin is None:
        return False
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:  # a malformed `[...]` host (`https://[::1`): no origin, not a 500
        return False
    return netloc == headers.get("host", "")


def _authenticate_released(request: Request, db: Session) -> Principal:
    try:
        return _authenticate(request, db)
    finally:
        # Give the connection back before the endpoint waits for a worker thread: a request must
        # not hold a pooled connection while queued, or a burst exhausts the pool (deadlock).
        db.rollback()


def _authenticate(request: Request, db: Session) -> Principal:
    token = _bearer(request)
    if token is not None:
        return authenticate_token(db, token)
    cookie = session_secret(request)
    if cookie:
        principal = authenticate_session(db, cookie)
        if request.method not in SAFE_METHODS and not csrf_matches(
            principal, request.headers.get(CSRF_HEADER)
        ):
            raise Forbidden(f"missing or wrong {CSRF_HEADER} header for a cookie-authenticated request")
        return principal
    raise Unauthenticated("not authenticated: send 'Authorization: Bearer <token>' or log in")


def principal_or_none(request: Request, db: Session) -> Principal | None:
    """The caller if the request carries a valid credential, else None: for a route open to
    everyone that shows more to some (`/readyz`). A malformed Authorization header is no
    credential here either."""
    try:
        return _authenticate(request, db)
    except (Unauthenticated, Forbidden):
        return None


def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("only an administrator may do this")
    return principal


CurrentUser = Annotated[Principal, Depends(get_principal)]
Admin = Annotated[Principal, Depends(require_admin)]

# Bounded parameters, so that the schema says what the API accepts (tests/api/test_fuzz.py): ids
# are positive and fit PostgreSQL's 32-bit integer columns (a larger one would be a database
# error, a 500), names are as long as the name columns, offsets fit a 64-bit SQL OFFSET.
MAX_ROW_ID = 2**31 - 1
MAX_OFFSET = 2**31 - 1
NAME_MAX = 64
RowId = Annotated[int, Path(ge=1, le=MAX_ROW_ID)]
# One path segment that can be a name: no '/' (an encoded one is refused before routing,
# corral.api.conformance.PathSegments, as are the dot segments '.' and '..'), said in the schema.
SEGMENT_NAME = r"^([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)$"
NameInPath = Annotated[str, Path(min_length=1, max_length=NAME_MAX, pattern=SEGMENT_NAME)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
# A user or group filter holds no NUL, said in the schema: PostgreSQL's text cannot hold one, and
# the database's refusal (corral.api.app's DataError handler) could name only the column, 'name'.
NO_NUL_TEXT = worded(
    r"^[^\x00]*$", "holds a NUL character (\\x00), which the database cannot store or search for"
)
UserFilter = Annotated[str | None, Query(min_length=1, max_length=NAME_MAX, pattern=NO_NUL_TEXT)]


def fast_json(data: Any, status_code: int = 200) -> JSONResponse:
    """Answer with `data` as it is. The dicts come from corral.services.views, which define the
    shapes the routes' response models document; returning a Response skips FastAPI's second
    validation pass, which for a sync endpoint also costs one more hop through a worker thread."""
    return JSONResponse(data, status_code=status_code)
