"""Groups, quotas and memberships."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status
from sqlalchemy.orm import Session

from corral.api.deps import DB, Admin, CurrentUser, NameInPath
from corral.api.schemas import GroupIn, GroupOut, MemberAddedOut, MemberIn, QuotaIn
from corral.db.models import Group
from corral.services import accounts as svc
from corral.services import audit, offboard, quota
from corral.services.audit_state import group_state
from corral.services.auth import Principal
from corral.services.views import GroupView, group_view

router = APIRouter(tags=["groups"])


def _views(db: Session, principal: Principal, groups: Sequence[Group]) -> list[GroupView]:
    """Groups with their usage and quota warnings: guarantees over the cluster, and a `*` max that
    does not cap the models with a quota of their own (members where the caller administers it)."""
    cluster = quota.read_cluster(db)
    usage = quota.group_usage(db, groups, cluster)
    warnings = quota.overcommit_warnings(db, cluster)
    return [
        group_view(
            g,
            svc.members_of(db, g.id) if principal.is_group_admin(g.id) else None,
            usage=quota.usage_view(g, usage[g.id]),
            warnings=[*warnings.get(g.name, ()), *quota.any_model_max_warnings(g)],
        )
        for g in groups
    ]


@router.get("/groups", response_model=list[GroupOut])
def list_groups(db: DB, principal: CurrentUser) -> Any:
    """Admins see every group; others the groups they belong to (members listed where they
    administer the group)."""
    return _views(db, principal, svc.list_groups(db, principal))


@router.post("/groups", status_code=status.HTTP_201_CREATED, response_model=GroupOut)
def create_group(body: GroupIn, db: DB, admin: Admin) -> Any:
    group = svc.create_group(
        db, body.name, weight=body.weight, borrowing=body.borrowing, user_max_gpus=body.user_max_gpus
    )
    limits = ("cpus_guaranteed", "cpus_max", "memory_guaranteed_mib", "memory_max_mib")
    svc.update_group(db, group, body.model_dump(include=set(limits)))
    for q in body.quotas:
        svc.set_quota(db, group, gpu_model=q.gpu_model, guaranteed=q.guaranteed, max_gpus=q.max)
    audit.record(
        db,
        actor=admin,
        action="group.create",
        target_kind="group",
        target_id=group.name,
        after=group_state(group),
    )
    db.commit()
    return _views(db, admin, [group])[0]


@router.get("/groups/{name}", response_model=GroupOut)
def show_group(name: NameInPath, db: DB, principal: CurrentUser) -> Any:
    group = svc.visible_group(db, principal, name)
    return _views(db, principal, [group])[0]


@router.put("/groups/{name}/quota", response_model=GroupOut)
def set_quota(name: NameInPath, body: QuotaIn, db: DB, admin: Admin) -> Any:
    """Change only what the body names: the GPU quota of one model (when `gpu_model`, `guaranteed`
    or `max` is given; a field left out keeps its value) and group-wide settings; `null` clears a
    limit (e.g. the per-user cap)."""
    group = svc.group_by_name(db, name)
    svc.lock_group(db, group)  # before reading what it changes: one quota change at a time
    before = group_state(group)
    given = body.model_fields_set
    if body.sets_gpu_quota:
        svc.patch_quota(db, group, body.gpu_model, body.model_dump(include={"guaranteed", "max"} & given))
    svc.update_group(db, group, body.model_dump(include=set(svc.GROUP_SETTINGS) & given))
    return _audited_quota_change(db, admin, group, "group.quota.set", before)


GpuModelQuery = Annotated[str, Query(min_length=1, max_length=64, description="GPU model; '*' = any model")]


@router.delete("/groups/{name}/quota", response_model=GroupOut)
def remove_quota(name: NameInPath, gpu_model: GpuModelQuery, db: DB, admin: Admin) -> Any:
    """Remove the group's GPU quota row of `gpu_model` (`*` included): 404 when it has none. The
    model then falls under the group's `*` quota, if any."""
    group = svc.group_by_name(db, name)
    svc.lock_group(db, group)
    before = group_state(group)
    svc.remove_quota(db, group, gpu_model)
    return _audited_quota_change(db, admin, group, "group.quota.remove", before)


def _audited_quota_change(
    db: Session, admin: Principal, group: Group, action: str, before: dict[str, Any]
) -> Any:
    """Audit a quota change (before and after), commit it, and answer the group as changed."""
    audit.record(
        db,
        actor=admin,
        action=action,
        target_kind="group",
        target_id=group.name,
        before=before,
        after=group_state(group),
    )
    db.commit()
    return _views(db, admin, [group])[0]


@router.post(
    "/groups/{name}/members",
    status_code=status.HTTP_201_CREATED,
    response_model=MemberAddedOut,
    responses={200: {"model": MemberAddedOut, "description": "already a member: role set or kept"}},
)
def add_member(name: NameInPath, body: MemberIn, db: DB, principal: CurrentUser, response: Response) -> Any:
    """Admins, and admins of this group, add members (201) or change a member's role (200);
    without `role` a new member joins as `member` and an existing one keeps their role. `changed`
    is false when the user was already a member with that role (or kept theirs)."""
    group = svc.visible_group(db, principal, name)
    svc.require_group_admin(principal, group)
    user = svc.user_by_name(db, body.user)
    old_role = svc.member_role(db, group, user)
    membership = svc.add_member(db, group, user, body.role)
    audit.record(
        db,
        actor=principal,
        action="group.member.add" if old_role is None else "group.member.role.set",
        target_kind="group",
        target_id=group.name,
        before=None if old_role is None else {"member": user.name, "role": old_role},
        after={"member": user.name, "role": membership.role},
    )
    db.commit()
    if old_role is not None:
        response.status_code = status.HTTP_200_OK
    return {"user": user.name, "role": membership.role, "changed": old_role != membership.role}


@router.delete("/groups/{name}/members/{user}", status_code=204)
def remove_member(
    name: NameInPath, user: NameInPath, db: DB, principal: CurrentUser, cancel_jobs: bool = False
) -> Response:
    """Admins, and admins of this group, remove a member: 404 when not a member, 409 for the
    group's last admin, and 409 naming the member's live jobs in the group unless `cancel_jobs`
    (then they are cancelled first, each audited as job.cancel)."""
    group = svc.visible_group(db, principal, name)
    svc.require_group_admin(principal, group)
    member = svc.user_by_name(db, user)
    role = offboard.remove_member(db, principal, group, member, cancel_jobs=cancel_jobs)
    audit.record(
        db,
        actor=principal,
        action="group.member.remove",
        target_kind="group",
        target_id=group.name,
        before={"member": member.name, "role": role},
        detail="cancel_jobs=true" if cancel_jobs else None,
    )
    db.commit()
    return Response(status_code=204)
