"""Groups, quotas and memberships."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, status

from corral.api.deps import DB, Admin, CurrentUser
from corral.api.schemas import GroupIn, GroupOut, MemberIn, MemberOut, QuotaIn
from corral.services import accounts as svc
from corral.services.errors import NotFound
from corral.services.views import group_view

router = APIRouter(tags=["groups"])


@router.get("/groups", response_model=list[GroupOut])
def list_groups(db: DB, principal: CurrentUser) -> Any:
    """Admins see every group; others the groups they belong to (members listed where they
    administer the group)."""
    return [
        group_view(g, svc.members_of(db, g.id) if principal.is_group_admin(g.id) else None)
        for g in svc.list_groups(db, principal)
    ]


@router.post("/groups", status_code=status.HTTP_201_CREATED, response_model=GroupOut)
def create_group(body: GroupIn, db: DB, _admin: Admin) -> Any:
    group = svc.create_group(
        db, body.name, weight=body.weight, borrowing=body.borrowing, user_max_gpus=body.user_max_gpus
    )
    for quota in body.quotas:
        svc.set_quota(db, group, gpu_model=quota.gpu_model, guaranteed=quota.guaranteed, max_gpus=quota.max)
    db.commit()
    return group_view(group, [])


@router.get("/groups/{name}", response_model=GroupOut)
def show_group(name: str, db: DB, principal: CurrentUser) -> Any:
    group = svc.group_by_name(db, name)
    if not principal.is_admin and not principal.is_member(group.id):
        raise NotFound(f"no group named {name!r}")
    return group_view(group, svc.members_of(db, group.id) if principal.is_group_admin(group.id) else None)


@router.put("/groups/{name}/quota", response_model=GroupOut)
def set_quota(name: str, body: QuotaIn, db: DB, _admin: Admin) -> Any:
    group = svc.group_by_name(db, name)
    svc.set_quota(db, group, gpu_model=body.gpu_model, guaranteed=body.guaranteed, max_gpus=body.max)
    if body.user_max_gpus is not None:
        group.user_max_gpus = body.user_max_gpus
    if body.weight is not None:
        group.weight = body.weight
    if body.borrowing is not None:
        group.borrowing = body.borrowing
    db.commit()
    return group_view(group, svc.members_of(db, group.id))


@router.post("/groups/{name}/members", status_code=status.HTTP_201_CREATED, response_model=MemberOut)
def add_member(name: str, body: MemberIn, db: DB, principal: CurrentUser) -> Any:
    """Admins, and admins of this group, add members (or change a member's role)."""
    group = svc.group_by_name(db, name)
    svc.require_group_admin(principal, group)
    user = svc.user_by_name(db, body.user)
    membership = svc.add_member(db, group, user, body.role)
    db.commit()
    return {"user": user.name, "role": membership.role}
