"""Users (admin), a user's default group, and the caller's SSH keys."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status

from corral.api.deps import DB, Admin, CurrentUser, NameInPath, RowId
from corral.api.schemas import DefaultGroupIn, PasswordIn, SshKeyIn, SshKeyOut, UserActiveOut, UserIn, UserOut
from corral.db.models import SshKey, User
from corral.services import accounts as svc
from corral.services import audit, offboard
from corral.services.audit_state import ssh_key_state, user_state
from corral.services.auth import Principal
from corral.services.errors import Forbidden

router = APIRouter(tags=["users"])


@router.get("/users", response_model=list[UserOut])
def list_users(db: DB, _admin: Admin) -> Any:
    return svc.list_user_views(db)


@router.post("/users", status_code=status.HTTP_201_CREATED, response_model=UserOut)
def create_user(body: UserIn, db: DB, admin: Admin) -> Any:
    user = svc.create_user(
        db,
        svc.NewUser(
            name=body.name,
            password=body.password,
            is_admin=body.is_admin,
            groups=tuple(body.groups),
            default_group=body.default_group,
        ),
    )
    audit.record(
        db,
        actor=admin,
        action="user.create",
        target_kind="user",
        target_id=user.name,
        after=user_state(db, user),
    )
    db.commit()
    return svc.user_out(db, user)


@router.put("/users/{name}/default-group", response_model=UserOut)
def set_default_group(name: NameInPath, body: DefaultGroupIn, db: DB, principal: CurrentUser) -> Any:
    """Admins for anyone; a user for themself (to a group they belong to)."""
    if not principal.is_admin and name != principal.name:
        raise Forbidden("only an administrator may change another user's default group")
    user = svc.user_by_name(db, name)
    before = {"default_group": svc.group_name(db, user.default_group_id)}
    svc.set_default_group(db, principal, user, svc.group_by_name(db, body.group))
    audit.record(
        db,
        actor=principal,
        action="user.default_group.set",
        target_kind="user",
        target_id=user.name,
        before=before,
        after={"default_group": body.group},
    )
    db.commit()
    return svc.user_out(db, user)


@router.put("/users/{name}/password", status_code=204)
def set_password(name: NameInPath, body: PasswordIn, db: DB, principal: CurrentUser) -> Response:
    """Admins for anyone; a user for themself (with `current_password` when they have one)."""
    if not principal.is_admin and name != principal.name:
        raise Forbidden("only an administrator may set another user's password")
    user = svc.user_by_name(db, name)
    had_password = user.password_hash is not None
    svc.change_password(db, principal, user, body.password, body.current_password)
    audit.record(
        db,
        actor=principal,
        action="user.passwd",
        target_kind="user",
        target_id=user.name,
        before={"has_password": had_password},
        after={"has_password": True},
    )
    db.commit()
    return Response(status_code=204)


@router.post("/users/{name}/deactivate", response_model=UserActiveOut)
def deactivate_user(name: NameInPath, db: DB, admin: Admin, cancel_jobs: bool = False) -> Any:
    """At once: no login, no API token, no SSH key, and the user's open sessions end. 409 for
    oneself, the last active administrator, or while the user has live jobs (named) unless
    `cancel_jobs` (then they are cancelled first, each audited as job.cancel). `changed` is false
    when the user was deactivated already."""
    return _set_active(db, admin, name, False, cancel_jobs)


@router.post("/users/{name}/activate", response_model=UserActiveOut)
def activate_user(name: NameInPath, db: DB, admin: Admin) -> Any:
    """Undo a deactivation: the user's tokens and SSH keys work again (portal sessions do not).
    `changed` is false when the user was active already."""
    return _set_active(db, admin, name, True, False)


def _set_active(db: DB, admin: Principal, name: str, active: bool, cancel_jobs: bool) -> Any:
    user = svc.user_by_name(db, name)
    before = {"active": user.active}
    offboard.set_active(db, admin, user, active, cancel_jobs=cancel_jobs)
    changed = before["active"] != user.active
    if changed:  # already active (or deactivated): nothing changed, nothing to record
        audit.record(
            db,
            actor=admin,
            action="user.activate" if active else "user.deactivate",
            target_kind="user",
            target_id=user.name,
            before=before,
            after={"active": user.active},
            detail="cancel_jobs=true" if cancel_jobs else None,
        )
    db.commit()
    return {**svc.user_out(db, user), "changed": changed}


def _name_of(db: DB, user_id: int) -> str:
    user = db.get(User, user_id)
    return user.name if user is not None else f"#{user_id}"


def _key_view(key: Any) -> dict[str, Any]:
    return {
        "id": key.id,
        "name": key.name,
        "fingerprint": key.fingerprint,
        "public_key": key.public_key,
        "created_at": key.created_at,
    }


@router.get("/ssh-keys", response_model=list[SshKeyOut])
def list_ssh_keys(db: DB, principal: CurrentUser) -> Any:
    return [_key_view(k) for k in svc.list_ssh_keys(db, principal)]


@router.post("/ssh-keys", status_code=status.HTTP_201_CREATED, response_model=SshKeyOut)
def add_ssh_key(body: SshKeyIn, db: DB, principal: CurrentUser) -> Any:
    key = svc.add_ssh_key(db, principal, body.name, body.public_key)
    audit.record(
        db,
        actor=principal,
        action="ssh_key.add",
        target_kind="ssh_key",
        target_id=key.id,
        after=ssh_key_state(key, principal.name),
    )
    db.commit()
    return _key_view(key)


@router.delete("/ssh-keys/{key_id}", status_code=204)
def delete_ssh_key(key_id: RowId, db: DB, principal: CurrentUser) -> Response:
    key = db.get(SshKey, key_id)
    before = None if key is None else ssh_key_state(key, _name_of(db, key.user_id))
    svc.delete_ssh_key(db, principal, key_id)  # refuses another user's key (unless admin)
    audit.record(
        db, actor=principal, action="ssh_key.delete", target_kind="ssh_key", target_id=key_id, before=before
    )
    db.commit()
    return Response(status_code=204)
