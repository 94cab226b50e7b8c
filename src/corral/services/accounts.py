"""Users, groups, memberships, quotas and SSH keys.

Rights: admins do everything; a group admin (Membership.role == "admin") adds members to their
group; everyone reads themselves and the groups they belong to. Functions flush, callers commit.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from corral.db.base import lock_row
from corral.db.models import Group, GroupQuota, Membership, SshKey, User
from corral.services import notify
from corral.services.auth import Principal, forget_principals, hash_password, verify_password
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.views import UserView, user_view

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
ROLES = ("admin", "member")
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
)


def check_name(value: str, field: str) -> str:
    if not NAME_RE.match(value):
        raise Invalid(
            f"{field} {value!r} must be 1 to 64 lower-case letters, digits, '.', '_' or '-', starting with a "
            "letter or digit",
            ("body", field),
        )
    return value


def group_by_name(session: Session, name: str) -> Group:
    group = session.scalar(select(Group).where(Group.name == name).options(selectinload(Group.quotas)))
    if group is None:
        raise NotFound(f"no group named {name!r}")
    return group


def visible_group(session: Session, principal: Principal, name: str) -> Group:
    """The group `name` as the caller may know it: to anyone but an admin or a member, a group
    that exists reads as one that does not (404 either way), so an answer does not tell which
    group names exist."""
    group = group_by_name(session, name)
    _refuse_unless_visible(principal, group.id, name)
    return group


def visible_group_id(session: Session, principal: Principal, name: str) -> int:
    """`visible_group`'s id, for every parameter that names a group the caller must belong to
    (a job's, a workspace's, a secret's, a catalogue entry's, a dataset upload's): a non-member
    gets the 404 of a name no group has, never a 403 that confirms the group exists."""
    gid = session.scalar(select(Group.id).where(Group.name == name))
    if gid is None:
        raise NotFound(f"no group named {name!r}")
    _refuse_unless_visible(principal, gid, name)
    return int(gid)


def _refuse_unless_visible(principal: Principal, gid: int, name: str) -> None:
    if not (principal.is_admin or principal.is_member(gid)):
        raise NotFound(f"no group named {name!r}")  # as for a name no group has


def lock_group(session: Session, group: Group) -> None:
    """Lock `group` until the transaction ends and read it again with its quotas, as committed by
    then: two admins setting the group's quotas at once take turns, and the second sees the
    first's. Without it both read "no quota for this model yet" and both inserted one: the second
    insert broke the unique constraint (a 500)."""
    if not lock_row(session, group):
        raise NotFound(f"no group named {group.name!r}")
    session.refresh(group, ["quotas"])


def user_by_name(session: Session, name: str) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        raise NotFound(f"no user named {name!r}")
    return user


def memberships_of(session: Session, user_id: int) -> list[tuple[str, str]]:
    rows = session.execute(
        select(Group.name, Membership.role)
        .join(Group, Group.id == Membership.group_id)
        .where(Membership.user_id == user_id)
        .order_by(Group.name)
    ).all()
    return [(name, role) for name, role in rows]


def members_of(session: Session, group_id: int) -> list[tuple[str, str]]:
    rows = session.execute(
        select(User.name, Membership.role)
        .join(User, User.id == Membership.user_id)
        .where(Membership.group_id == group_id)
        .order_by(User.name)
    ).all()
    return [(name, role) for name, role in rows]


def group_name(session: Session, group_id: int | None) -> str | None:
    return None if group_id is None else session.scalar(select(Group.name).where(Group.id == group_id))


def user_out(session: Session, user: User) -> UserView:
    """The API's JSON shape of a user, with their groups and default group's name."""
    return user_view(user, memberships_of(session, user.id), group_name(session, user.default_group_id))


# --- groups -----------------------------------------------------------------------------------


def create_group(
    session: Session,
    name: str,
    *,
    weight: float = 1.0,
    borrowing: bool = True,
    user_max_gpus: int | None = None,
    now: float | None = None,
) -> Group:
    check_name(name, "name")
    if session.scalar(select(Group.id).where(Group.name == name)) is not None:
        raise Conflict(f"a group named {name!r} already exists")
    group = Group(
        name=name,
        weight=weight,
        borrowing=borrowing,
        user_max_gpus=user_max_gpus,
        cpus_guaranteed=0.0,
        memory_guaranteed_mib=0,
        created_at=time.time() if now is None else now,
    )
    session.add(group)
    session.flush()
    return group


def list_groups(session: Session, principal: Principal) -> list[Group]:
    stmt = select(Group).options(selectinload(Group.quotas)).order_by(Group.name)
    if not principal.is_admin:
        stmt = stmt.where(Group.id.in_(list(principal.group_roles)))
    return list(session.scalars(stmt))


def set_quota(
    session: Session, group: Group, *, gpu_model: str = "*", guaranteed: int = 0, max_gpus: int | None = None
) -> GroupQuota:
    """Insert or replace the group's quota for one GPU model ("*" = any model not listed)."""
    if max_gpus is not None and max_gpus < guaranteed:
        raise Invalid(f"max ({max_gpus}) must not be less than guaranteed ({guaranteed})", ("body", "max"))
    quota = next((q for q in group.quotas if q.gpu_model == gpu_model), None)
    if quota is None:
        quota = GroupQuota(group_id=group.id, gpu_model=gpu_model)
        group.quotas.append(quota)
    quota.guaranteed = guaranteed
    quota.max = max_gpus
    notify.changed(session, notify.Topic.QUOTAS)
    session.flush()
    return quota


def patch_quota(
    session: Session, group: Group, gpu_model: str, changes: Mapping[str, int | None]
) -> GroupQuota:
    """Change the fields named in `changes` ("guaranteed", "max") of the group's quota for one
    GPU model and keep the other; a model with no quota yet starts at 0 guaranteed, no max."""
    current = next((q for q in group.quotas if q.gpu_model == gpu_model), None)
    guaranteed = changes.get("guaranteed", current.guaranteed if current else 0)
    max_gpus = changes.get("max", current.max if current else None)
    return set_quota(session, group, gpu_model=gpu_model, guaranteed=guaranteed or 0, max_gpus=max_gpus)


def remove_quota(session: Session, group: Group, gpu_model: str) -> None:
    """Delete the group's quota row for one GPU model (a mistyped model's row warned forever);
    404 when it has none. Without a row of its own the model falls under the `*` quota, if any."""
    current = next((q for q in group.quotas if q.gpu_model == gpu_model), None)
    if current is None:
        raise NotFound(f"group {group.name!r} has no quota for GPU model {gpu_model!r}")
    group.quotas.remove(current)
    notify.changed(session, notify.Topic.QUOTAS)
    session.flush()


# Group-wide settings `update_group` changes; None clears the nullable ones (the limits) and
# leaves the others as they are.
NULLABLE_SETTINGS = ("user_max_gpus", "cpus_max", "memory_max_mib")
GROUP_SETTINGS = (*NULLABLE_SETTINGS, "weight", "borrowing", "cpus_guaranteed", "memory_guaranteed_mib")


def update_group(session: Session, group: Group, changes: Mapping[str, float | bool | None]) -> None:
    """Apply the group-wide settings named in `changes` (keys of GROUP_SETTINGS) and check that
    no CPU or memory max is below its guarantee."""
    unknown = set(changes) - set(GROUP_SETTINGS)
    if unknown:
        raise ValueError(f"not group settings: {sorted(unknown)}")
    for key, value in changes.items():
        if value is not None or key in NULLABLE_SETTINGS:
            setattr(group, key, value)
    for limit, floor in (("cpus_max", "cpus_guaranteed"), ("memory_max_mib", "memory_guaranteed_mib")):
        top, bottom = getattr(group, limit), getattr(group, floor)
        if top is not None and top < bottom:
            raise Invalid(f"{limit} ({top:g}) must not be less than {floor} ({bottom:g})", ("body", limit))
    session.flush()


def member_role(session: Session, group: Group, user: User) -> str | None:
    """`user`'s role in `group`, None when not a member (one row by its key, not the member list)."""
    membership = session.get(Membership, (user.id, group.id))
    return None if membership is None else membership.role


def add_member(session: Session, group: Group, user: User, role: str | None = "member") -> Membership:
    """Add (or change the role of) a member; a user with no default group gets this one. Role
    None: a new member joins as "member", an existing one keeps their role."""
    if role is not None and role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}", ("body", "role"))
    membership = session.get(Membership, (user.id, group.id))
    if membership is None:
        membership = Membership(user_id=user.id, group_id=group.id, role=role or "member")
        session.add(membership)
    elif role is not None:
        if role != "admin":  # as its removal is (services.offboard): never leave it without an admin
            what = f"user {user.name!r} cannot stop being an admin of group {group.name!r}"
            refuse_last_admin(session, group, membership, what)
        membership.role = role
    if user.default_group_id is None:
        user.default_group_id = group.id
    session.flush()
    forget_principals(session)
    return membership


def admin_count(session: Session, group_id: int) -> int:
    """How many admins `group` has (its last one is neither removed nor demoted)."""
    stmt = select(func.count()).where(Membership.group_id == group_id, Membership.role == "admin")
    return int(session.scalar(stmt) or 0)


def refuse_last_admin(session: Session, group: Group, membership: Membership, what: str) -> None:
    """409 `what` when `membership` is the group's last admin (before its removal or demotion).
    The group's row is locked first, to the commit: two admins stepping down at once both counted
    two and both went, leaving the group none; the second now counts after the first."""
    if membership.role != "admin":
        return
    lock_row(session, group)
    session.refresh(membership, ["role"])  # as committed by then
    if membership.role == "admin" and admin_count(session, group.id) <= 1:
        raise Conflict(f"{what}: they are its last admin; make another member its admin first")


def require_group_admin(principal: Principal, group: Group) -> None:
    if not principal.is_group_admin(group.id):
        raise Forbidden(f"only an administrator or an admin of group {group.name!r} may do this")


# --- users ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewUser:
    name: str
    password: str | None = None
    is_admin: bool = False
    groups: tuple[str, ...] = ()
    default_group: str | None = None


def create_user(session: Session, new: NewUser, *, now: float | None = None) -> User:
    check_name(new.name, "name")
    if session.scalar(select(User.id).where(User.name == new.name)) is not None:
        raise Conflict(f"a user named {new.name!r} already exists")
    if new.password is not None and len(new.password) < 8:
        raise Invalid("the password must have at least 8 characters", ("body", "password"))
    groups = [group_by_name(session, g) for g in new.groups]
    if new.default_group is not None and new.default_group not in new.groups:
        groups.append(group_by_name(session, new.default_group))
    user = User(
        name=new.name,
        password_hash=hash_password(new.password) if new.password else None,
        is_admin=new.is_admin,
        active=True,
        created_at=time.time() if now is None else now,
    )
    session.add(user)
    session.flush()
    for group in groups:
        add_member(session, group, user)
    if new.default_group is not None:
        user.default_group_id = group_by_name(session, new.default_group).id
    session.flush()
    return user


def list_user_views(session: Session) -> list[UserView]:
    """Every user's API view in three queries (users, memberships, group names), not two per user."""
    users = session.scalars(select(User).order_by(User.name)).all()
    group_names = dict(session.execute(select(Group.id, Group.name)).all())
    groups_of: dict[int, list[tuple[str, str]]] = defaultdict(list)
    memberships = session.execute(
        select(Membership.user_id, Group.name, Membership.role)
        .join(Group, Group.id == Membership.group_id)
        .order_by(Group.name)
    )
    for user_id, name, role in memberships:
        groups_of[user_id].append((name, role))
    return [
        user_view(u, groups_of[u.id], None if u.default_group_id is None else group_names[u.default_group_id])
        for u in users
    ]


def set_default_group(session: Session, principal: Principal, user: User, group: Group) -> None:
    if not principal.is_admin and principal.user_id != user.id:
        raise Forbidden("only an administrator may change another user's default group")
    if not principal.is_admin and not principal.is_member(group.id):
        raise NotFound(f"no group named {group.name!r}")  # as for a name no group has
    if session.get(Membership, (user.id, group.id)) is None:
        raise Conflict(f"user {user.name!r} is not a member of group {group.name!r}")
    user.default_group_id = group.id
    session.flush()
    forget_principals(session)


def set_password(session: Session, user: User, password: str) -> None:
    if len(password) < 8:
        raise Invalid("the password must have at least 8 characters", ("body", "password"))
    user.password_hash = hash_password(password)
    session.flush()


def change_password(
    session: Session, principal: Principal, user: User, password: str, current_password: str | None
) -> None:
    """Admins set anyone's password; a user sets their own, giving the current one when they
    have one (a stolen token alone must not be enough to take over the portal login)."""
    if not principal.is_admin:
        if principal.user_id != user.id:
            raise Forbidden("only an administrator may set another user's password")
        if user.password_hash is not None and not verify_password(user.password_hash, current_password or ""):
            raise Invalid("the current password is wrong or missing", ("body", "current_password"))
    set_password(session, user, password)


# --- SSH keys ---------------------------------------------------------------------------------


def ssh_fingerprint(public_key: str) -> str:
    """OpenSSH's SHA256 fingerprint of "type base64 [comment]", with a plain error if malformed."""
    parts = public_key.strip().split()
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        raise Invalid(
            f"not an SSH public key; it must start with one of {', '.join(SSH_KEY_TYPES)}",
            ("body", "public_key"),
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise Invalid("the SSH public key's base64 part is damaged", ("body", "public_key"))
    import asyncssh  # here: only a key being added needs it (the gateway reads keys with it)

    try:  # its bytes must be a key of the type it names, or the gateway never matches it
        asyncssh.import_public_key(f"{parts[0]} {parts[1]}")
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise Invalid(
            f"the SSH public key is damaged (its base64 part is not a whole {parts[0]} key: {exc});"
            " copy the whole line of the .pub file",
            ("body", "public_key"),
        ) from None
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def add_ssh_key(
    session: Session, principal: Principal, name: str, public_key: str, *, now: float | None = None
) -> SshKey:
    fingerprint = ssh_fingerprint(public_key)
    exists = session.scalar(
        select(SshKey.id).where(SshKey.user_id == principal.user_id, SshKey.fingerprint == fingerprint)
    )
    if exists is not None:
        raise Conflict(f"this SSH key ({fingerprint}) is already registered to your account")
    # Another user may hold the same public key (public keys are public): the gateway takes the
    # user from the login name (`alice+nb`) and checks only that user's keys, so a key opens only
    # the accounts that registered it. Refusing it here let anyone squat another's key first.
    key = SshKey(
        user_id=principal.user_id,
        name=name,
        public_key=public_key.strip(),
        fingerprint=fingerprint,
        created_at=time.time() if now is None else now,
    )
    session.add(key)
    session.flush()
    return key


def list_ssh_keys(session: Session, principal: Principal) -> list[SshKey]:
    return list(
        session.scalars(select(SshKey).where(SshKey.user_id == principal.user_id).order_by(SshKey.id))
    )


def delete_ssh_key(session: Session, principal: Principal, key_id: int) -> None:
    key = session.get(SshKey, key_id)
    if key is None or (key.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"no SSH key with id {key_id}")
    session.delete(key)
    session.flush()
    forget_principals(session)  # SSH connections it logged in end (corral.services.open_sessions)
