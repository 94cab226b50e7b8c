"""The caller's API tokens (admins may create one for another user)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status

from corral.api.deps import DB, CurrentUser
from corral.api.schemas import TokenIn, TokenOut
from corral.db.models import ApiToken, User
from corral.services import auth as svc
from corral.services.accounts import user_by_name
from corral.services.errors import Forbidden

router = APIRouter(tags=["tokens"])


def _view(token: ApiToken, user: str, secret: str | None = None) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "prefix": token.prefix,
        "user": user,
        "created_at": token.created_at,
        "last_used_at": token.last_used_at,
        "expires_at": token.expires_at,
        "revoked_at": token.revoked_at,
        "token": secret,
    }


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(db: DB, principal: CurrentUser) -> Any:
    return [_view(t, principal.name) for t in svc.list_tokens(db, principal)]


@router.post("/tokens", status_code=status.HTTP_201_CREATED, response_model=TokenOut)
def create_token(body: TokenIn, db: DB, principal: CurrentUser) -> Any:
    """The secret is in the answer once; only its hash is stored."""
    if body.user is not None and body.user != principal.name:
        if not principal.is_admin:
            raise Forbidden("only an administrator may create tokens for another user")
        user = user_by_name(db, body.user)
    else:
        found = db.get(User, principal.user_id)
        assert found is not None
        user = found
    expires = None if body.expires_in_days is None else body.expires_in_days * 86400.0
    token, secret = svc.create_token(db, user, body.name, expires_in_s=expires)
    db.commit()
    return _view(token, user.name, secret)


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(token_id: int, db: DB, principal: CurrentUser) -> Response:
    svc.revoke_token(db, principal, token_id)
    db.commit()
    return Response(status_code=204)
