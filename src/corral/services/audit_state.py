"""The before/after state the audit log keeps for each kind of target: what a security review
needs to see changed, never a secret (no password or token hash; corral.services.audit redacts
anything that slips through)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from corral.db.models import ApiToken, Group, Job, LoginFailure, Node, SshKey, User
from corral.services.accounts import group_name, memberships_of


def group_state(group: Group) -> dict[str, Any]:
    return {
        "weight": group.weight,
        "borrowing": group.borrowing,
        "user_max_gpus": group.user_max_gpus,
        "cpus_guaranteed": group.cpus_guaranteed,
        "cpus_max": group.cpus_max,
        "memory_guaranteed_mib": group.memory_guaranteed_mib,
        "memory_max_mib": group.memory_max_mib,
        "quotas": {q.gpu_model: {"guaranteed": q.guaranteed, "max": q.max} for q in group.quotas},
    }


def user_state(session: Session, user: User) -> dict[str, Any]:
    return {
        "is_admin": user.is_admin,
        "active": user.active,
        "has_password": user.password_hash is not None,
        "default_group": group_name(session, user.default_group_id),
        "groups": dict(memberships_of(session, user.id)),
    }


def token_state(token: ApiToken, owner: str) -> dict[str, Any]:
    return {
        "user": owner,
        "token_name": token.name,
        "token_prefix": token.prefix,
        "expires_at": token.expires_at,
        "revoked_at": token.revoked_at,
    }


def node_state(node: Node) -> dict[str, Any]:
    return {"state": node.state, "admin_state": node.admin_state}


def job_state(job: Job) -> dict[str, Any]:
    return {
        "state": job.state,
        "user_id": job.user_id,
        "group_id": job.group_id,
        "name": job.name,
        "cancel_requested": job.cancel_requested,
    }


def ssh_key_state(key: SshKey, owner: str) -> dict[str, Any]:
    return {"user": owner, "name": key.name, "fingerprint": key.fingerprint}


def lockout_state(row: LoginFailure) -> dict[str, Any]:
    return {
        "scope": row.scope,
        "key": row.key,
        "failures": row.failures,
        "locked_until": row.locked_until,
    }
