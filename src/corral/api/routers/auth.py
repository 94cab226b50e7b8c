"""Portal login/logout (session cookie + CSRF token), `GET /me`, the caller's portal sessions
(an admin's: anyone's), and the login lockouts admins can see and lift (docs/security.md)."""

from __future__ import annotations

import logging
import os
import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel

from corral.api.deps import (
    DB,
    NAME_MAX,
    SEGMENT_NAME,
    Admin,
    CurrentUser,
    RowId,
    client_address,
    portal_https,
    same_origin,
    session_cookie_name,
    session_secret,
)
from corral.api.schemas import LoginIn, LoginOut, MeOut
from corral.config import PUBLIC_URL_ENV, Settings, origin_of
from corral.db.models import LoginFailure, User, WebSession
from corral.services import audit, login_guard
from corral.services import auth as svc
from corral.services.accounts import user_out
from corral.services.audit_state import lockout_state
from corral.services.errors import Conflict, Forbidden
from corral.services.views import UserView

SessionId = Annotated[str, Path(min_length=1, max_length=128, pattern=SEGMENT_NAME)]
log = logging.getLogger(__name__)
router = APIRouter(tags=["auth"])


class SessionOut(BaseModel):
    id: str  # the public id (not the cookie): `DELETE /sessions/{id}` ends it
    user: str
    created_at: float
    expires_at: float
    current: bool  # the session this request came with


class LockoutOut(BaseModel):
    id: int
    scope: str  # "account" | "address"
    key: str  # the user name tried or the source address
    failures: int
    first_failed_at: float
    last_failed_at: float
    locked_until: float | None
    locked: bool


def me_view(db: Any, user_id: int) -> UserView:
    return user_out(db, db.get(User, user_id))


def _from_the_portal(headers: Any) -> bool:
    """Whether a browser's `Origin` is the portal's: the `Host` the request was sent to (a proxy
    passing it as sent), or the portal's address as people reach it (CORRAL_PUBLIC_URL), for a
    proxy that rewrites `Host` (review118 #2)."""
    public = origin_of(os.environ.get(PUBLIC_URL_ENV))
    return same_origin(headers) or (public is not None and origin_of(headers.get("origin")) == public)


@router.post(
    "/auth/login",
    response_model=LoginOut,
    responses={
        401: {"description": "wrong user name or password"},
        403: {
            "description": "sent by a browser from another origin than the portal's, or over "
            "plain http to a portal whose CORRAL_PUBLIC_URL is https"
        },
        429: {"description": "too many failed logins: the account or address is locked"},
    },
)
def login(body: LoginIn, request: Request, response: Response, db: DB) -> Any:
    settings: Settings = request.app.state.settings
    if "origin" in request.headers and not _from_the_portal(request.headers):
        # Login CSRF: another site's page (a sibling host of the same site gets past SameSite=Lax)
        # would log this browser into its author's account, whose workspace the browser would then
        # be handed over to, next to the victim's workspace cookies. Clients without `Origin` (the
        # CLI, the SDK) are not browsers, and a browser always sends it on a POST.
        log.warning(
            "login refused: Origin %r is neither the Host the request was sent to (%r) nor "
            "CORRAL_PUBLIC_URL's origin; a reverse proxy must pass Host as the browser sent it",
            request.headers["origin"],
            request.headers.get("host", ""),
        )
        raise Forbidden(
            f"login refused: sent from {request.headers['origin']!r}, not from the portal's own "
            "origin; log in on the portal's page"
        )
    if portal_https(request.scope) and request.headers.get("origin", "").lower().startswith("http://"):
        # CORRAL_PUBLIC_URL says https but this browser is on plain http: it would drop the
        # Secure `__Host-` cookie set below, so the login would "work" and the next request be a
        # 401, over and over, with no word of why (review120 #3).
        public = os.environ.get(PUBLIC_URL_ENV, "").strip()
        https_url = public.lower().startswith("https://")  # (else https is this request's own TLS)
        where = (
            f" (CORRAL_PUBLIC_URL is {public}); log in there"
            if https_url
            else "; log in at its https address"
        )
        raise Forbidden(
            f"login refused: this portal's sessions are for https only{where}, not over plain http"
        )
    address, now = client_address(request), time.time()
    login_guard.check_allowed(db, body.username, address, now)
    try:
        secret, user, csrf = svc.login(
            db, body.username, body.password, lifetime_s=settings.session_lifetime_s
        )
    except svc.WrongPassword:
        login_guard.record_failure(
            db, body.username, address, login_guard.Policy.from_settings(settings), now
        )
        raise
    login_guard.record_success(db, body.username)
    web_id = svc.sha256_hex(secret)[: svc.SESSION_ID_CHARS]
    audit.record(
        db,
        actor=svc.load_principal(db, user, via="session", credential=f"session:{web_id}"),
        action="session.create",
        target_kind="session",
        target_id=web_id,
        source=address,
        after={"user": user.name, "expires_at": now + settings.session_lifetime_s},
    )
    db.commit()
    # Over https `__Host-corral_session`: Secure, Path=/ and no Domain, as that prefix requires.
    response.set_cookie(
        session_cookie_name(request.scope),
        secret,
        max_age=int(settings.session_lifetime_s),
        httponly=True,
        samesite="lax",
        secure=portal_https(request.scope),
        path="/",
    )
    return {"user": me_view(db, user.id), "csrf_token": csrf}


@router.post("/auth/logout", status_code=204)
def logout(request: Request, response: Response, db: DB, principal: CurrentUser) -> Response:
    cookie = session_secret(request)
    if cookie and principal.via == "session":
        svc.logout(db, cookie)
        web_id = svc.sha256_hex(cookie)[: svc.SESSION_ID_CHARS]
        audit.record(
            db,
            actor=principal,
            action="session.end",
            target_kind="session",
            target_id=web_id,
            detail="logout",
        )
        db.commit()
    out = Response(status_code=204)
    # Secure over https: a browser ignores a `__Host-` cookie's deletion without it.
    secure = portal_https(request.scope)
    out.delete_cookie(
        session_cookie_name(request.scope), path="/", secure=secure, httponly=True, samesite="lax"
    )
    return out


class CsrfOut(BaseModel):
    csrf_token: str


@router.get(
    "/auth/csrf",
    response_model=CsrfOut,
    responses={409: {"description": "the caller is not a portal session (an API token needs none)"}},
)
def session_csrf(principal: CurrentUser) -> Any:
    """The portal session's CSRF token again, for a page that was reloaded: the portal keeps the
    token in memory only, never in localStorage, where any script of the origin (a workspace's
    JupyterLab is served on it, docs/security.md) could read it at any later time."""
    if principal.via != "session" or not principal.csrf_token:
        raise Conflict("only a portal session (the session cookie) has a CSRF token; an API token needs none")
    return {"csrf_token": principal.csrf_token}


@router.get("/me", response_model=MeOut)
def me(db: DB, principal: CurrentUser) -> Any:
    return me_view(db, principal.user_id)


def _session_view(web: WebSession, user: str, current_hash: str | None) -> dict[str, Any]:
    return {
        "id": svc.session_id(web),
        "user": user,
        "created_at": web.created_at,
        "expires_at": web.expires_at,
        "current": web.id_hash == current_hash,
    }


@router.get("/sessions", response_model=list[SessionOut])
def list_sessions(
    request: Request,
    db: DB,
    principal: CurrentUser,
    user: str | None = Query(
        None, min_length=1, max_length=NAME_MAX, description="admins: this user's sessions"
    ),
    all_users: bool = Query(False, alias="all", description="admins: everyone's sessions"),
) -> Any:
    """Unexpired portal sessions: the caller's own, or (admins) a user's or everyone's."""
    user_id = svc.owner_filter(db, principal, user, all_users=all_users)
    cookie = session_secret(request)
    current = svc.sha256_hex(cookie) if cookie else None
    return [
        _session_view(web, name, current) for web, name in svc.list_sessions(db, principal, user_id=user_id)
    ]


@router.delete("/sessions/{session_id}", status_code=204)
def revoke_session(
    session_id: SessionId,
    db: DB,
    principal: CurrentUser,
) -> Response:
    web = svc.revoke_session(db, principal, session_id)
    owner = db.get(User, web.user_id)
    audit.record(
        db,
        actor=principal,
        action="session.end",
        target_kind="session",
        target_id=session_id,
        before={"user": owner.name if owner else f"#{web.user_id}", "expires_at": web.expires_at},
    )
    db.commit()
    return Response(status_code=204)


def _lockout_view(row: LoginFailure, now: float) -> dict[str, Any]:
    return {
        "id": row.id,
        "scope": row.scope,
        "key": row.key,
        "failures": row.failures,
        "first_failed_at": row.first_failed_at,
        "last_failed_at": row.last_failed_at,
        "locked_until": row.locked_until,
        "locked": row.locked_until is not None and row.locked_until > now,
    }


@router.get("/auth/lockouts", response_model=list[LockoutOut])
def list_lockouts(
    db: DB, _admin: Admin, locked: bool = Query(False, description="only running lockouts")
) -> Any:
    """Failed-login counters per account and per source address, with their lockouts (admins)."""
    now = time.time()
    return [_lockout_view(r, now) for r in login_guard.list_lockouts(db, now, locked_only=locked)]


@router.delete("/auth/lockouts/{lockout_id}", status_code=204)
def clear_lockout(lockout_id: RowId, db: DB, admin: Admin) -> Response:
    """Lift a lockout and forget its failures (admins)."""
    row = login_guard.clear_lockout(db, lockout_id)
    audit.record(
        db,
        actor=admin,
        action="auth.unlock",
        target_kind="lockout",
        target_id=f"{row.scope}:{row.key}",
        before=lockout_state(row),
    )
    db.commit()
    return Response(status_code=204)
