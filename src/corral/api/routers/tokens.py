"""The caller's API tokens (admins may create one for another user)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request, Response, status

from corral.api.deps import DB, NAME_MAX, CurrentUser, RowId
from corral.api.schemas import TokenIn, TokenOut
from corral.db.models import ApiToken, User
from corral.services import audit
from corral.services import auth as svc
from corral.services.accounts import user_by_name
from corral.services.audit_state import token_state
from corral.services.errors import Forbidden

router = APIRouter(tags=["tokens"])


def _view(token: ApiToken, user: str, secret: str | None = None, note: str | None = None) -> dict[str, Any]:
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
        "note": note,
    }


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(
    db: DB,
    principal: CurrentUser,
    user: str | None = Query(
        None, min_length=1, max_length=NAME_MAX, description="admins: this user's tokens"
    ),
    all_users: bool = Query(False, alias="all", description="admins: everyone's tokens"),
) -> Any:
    user_id = svc.owner_filter(db, principal, user, all_users=all_users)
    return [_view(t, owner) for t, owner in svc.list_tokens(db, principal, user_id=user_id)]


@router.post("/tokens", status_code=status.HTTP_201_CREATED, response_model=TokenOut)
def create_token(body: TokenIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """The secret is in the answer once; only its hash is stored. Without `expires_in_days` the
    token gets the configured default lifetime; more than the configured maximum is refused.
    Made with an API token, it expires no later than that token (`note` says so when cut)."""
    if body.user is not None and body.user != principal.name:
        if not principal.is_admin:
            raise Forbidden("only an administrator may create tokens for another user")
        user = user_by_name(db, body.user)
    else:
        found = db.get(User, principal.user_id)
        assert found is not None
        user = found
    now = time.time()
    asked = svc.token_lifetime_s(request.app.state.settings, body.expires_in_days)
    expires, note = svc.capped_to_maker(principal, asked, now)
    token, secret = svc.create_token(db, user, body.name, expires_in_s=expires, now=now)
    audit.record(
        db,
        actor=principal,
        action="token.create",
        target_kind="token",
        target_id=token.id,
        after=token_state(token, user.name),
    )
    db.commit()
    return _view(token, user.name, secret, note)


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(token_id: RowId, db: DB, principal: CurrentUser) -> Response:
    token = db.get(ApiToken, token_id)
    before = None if token is None else {"revoked_at": token.revoked_at}
    svc.revoke_token(db, principal, token_id)  # another user's token (unless admin): 404
    assert token is not None
    owner = db.get(User, token.user_id)
    audit.record(
        db,
        actor=principal,
        action="token.revoke",
        target_kind="token",
        target_id=token_id,
        before=before,
        after=token_state(token, owner.name if owner else f"#{token.user_id}"),
    )
    db.commit()
    return Response(status_code=204)
