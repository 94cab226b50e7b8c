"""Portal login/logout (session cookie + CSRF token) and `GET /me`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from corral.api.deps import DB, SESSION_COOKIE, CurrentUser
from corral.api.schemas import LoginIn, LoginOut, MeOut
from corral.db.models import User
from corral.services import auth as svc
from corral.services.accounts import user_out
from corral.services.views import UserView

router = APIRouter(tags=["auth"])


def me_view(db: Any, user_id: int) -> UserView:
    return user_out(db, db.get(User, user_id))


@router.post("/auth/login", response_model=LoginOut)
def login(body: LoginIn, request: Request, response: Response, db: DB) -> Any:
    secret, user, csrf = svc.login(db, body.username, body.password)
    db.commit()
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=int(svc.SESSION_TTL_S),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return {"user": me_view(db, user.id), "csrf_token": csrf}


@router.post("/auth/logout", status_code=204)
def logout(request: Request, response: Response, db: DB, principal: CurrentUser) -> Response:
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and principal.via == "session":
        svc.logout(db, cookie)
        db.commit()
    out = Response(status_code=204)
    out.delete_cookie(SESSION_COOKIE, path="/")
    return out


@router.get("/me", response_model=MeOut)
def me(db: DB, principal: CurrentUser) -> Any:
    return me_view(db, principal.user_id)
