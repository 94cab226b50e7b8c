"""Secrets for jobs: per-user and per-group values, stored encrypted, handed to a job only when
its spec names them (docs/security.md, "Secrets for jobs").

- **At rest**: AES-256-GCM (`cryptography`), a fresh 12-byte nonce per write, the secret's scope,
  owner id and name as associated data (a ciphertext copied onto another row does not open). The
  key is `CORRAL_SECRETS_KEY` / `CORRAL_SECRETS_KEY_FILE` (base64 of 32 bytes), or generated once
  into `<home>/secrets.key` (0600). Each row keeps the key's fingerprint, so a wrong key is named
  as such instead of looking like corrupt data.
- **Who**: a user sets, lists and deletes their own secrets; a group's secrets are set and
  deleted by the group's admins and Corral admins, listed (names only) by its members. No call
  returns a value.
- **Use**: at submit (`check_job_secrets`) every secret the spec names must be usable by the
  submitter in the job's group, else 422 naming it (the same answer whether it exists for
  someone else or not at all). At dispatch (`grants_for_job`) the values are decrypted, in
  memory only, for the engine; a secret deleted (or a membership lost) since the submit fails
  the attempt with a message naming the secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import Group, Job, Membership, User
from corral.db.secrets_models import JobSecret
from corral.engine.base import SecretGrant
from corral.services import audit
from corral.services.accounts import visible_group_id
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.spec import SECRET_NAME_RE, SecretUseV1

KEY_FILE_NAME = "secrets.key"
KEY_BYTES = 32
NONCE_BYTES = 12
MAX_VALUE_BYTES = 64 * 1024
KEY_HINT = "make one with: head -c 32 /dev/urandom | base64"
Scope = Literal["user", "group"]


class SecretKeyError(ValueError):
    """The secrets key cannot be used; the message names the setting or file."""


class SecretUnavailable(Exception):
    """A job's secret cannot be given to it at dispatch (deleted, no longer usable, wrong key)."""


# --- the key and the cipher ---------------------------------------------------------------------


@dataclass(frozen=True)
class SecretBox:
    """AES-256-GCM with one key. `key_id`: a fingerprint of the key (not the key)."""

    key: bytes
    key_id: str

    @classmethod
    def from_key(cls, key: bytes) -> SecretBox:
        if len(key) != KEY_BYTES:
            raise SecretKeyError(f"the secrets key must be {KEY_BYTES} bytes, got {len(key)}; {KEY_HINT}")
        return cls(key, hashlib.sha256(b"corral-secrets-key:" + key).hexdigest()[:16])

    def seal(self, plaintext: bytes, context: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + AESGCM(self.key).encrypt(nonce, plaintext, context)

    def open(self, blob: bytes, context: bytes) -> bytes:
        """InvalidTag when the blob was not sealed with this key and context."""
        return AESGCM(self.key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], context)


def parse_key(text: str, where: str) -> bytes:
    try:
        key = base64.b64decode(text.strip().replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise SecretKeyError(f"{where}: not base64; {KEY_HINT}")
    if len(key) != KEY_BYTES:
        raise SecretKeyError(f"{where}: must hold {KEY_BYTES} bytes (base64), got {len(key)}; {KEY_HINT}")
    return key


def _home_key(home: Path) -> bytes:
    """<home>/secrets.key, made once (O_EXCL, 0600) when missing; two servers starting at once
    on one home both end up reading the one that won."""
    path = home / KEY_FILE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")
    for _ in range(50):  # the winner of a concurrent creation may not have written it yet
        try:
            text = path.read_text()
        except OSError as exc:
            raise SecretKeyError(f"{path}: cannot read the secrets key ({exc.strerror})") from exc
        if text.strip():
            break
        time.sleep(0.01)
    if path.stat().st_mode & 0o077:
        raise SecretKeyError(f"{path}: the secrets key is readable by others; chmod 600 {path}")
    return parse_key(text, str(path))


_boxes: dict[tuple[str | None, str], SecretBox] = {}
_boxes_lock = threading.Lock()


def box_for(settings: Settings) -> SecretBox:
    """The box of the configured key (cached per key and home). SecretKeyError naming what is
    wrong; the server calls it at start, so a bad key refuses start-up instead of a request."""
    cache_key = (settings.secrets_key, str(settings.home))
    with _boxes_lock:
        box = _boxes.get(cache_key)
        if box is None:
            if settings.secrets_key is not None:
                key = parse_key(settings.secrets_key, "CORRAL_SECRETS_KEY (or its _FILE)")
            else:
                settings.home.mkdir(parents=True, exist_ok=True)
                key = _home_key(settings.home)
            box = _boxes[cache_key] = SecretBox.from_key(key)
        return box


def _context(scope: Scope, owner_id: int, name: str) -> bytes:
    return f"corral-secret:v1:{scope}:{owner_id}:{name}".encode()


def _context_of(row: JobSecret) -> bytes:
    if row.user_id is not None:
        return _context("user", row.user_id, row.name)
    assert row.group_id is not None
    return _context("group", row.group_id, row.name)


# --- set, list, delete ------------------------------------------------------------------------


class SecretView(TypedDict):
    """What the API shows of a secret: never its value."""

    name: str
    scope: Scope
    group: str | None
    updated_at: float
    updated_by: str
    created_at: float


def check_name(name: str) -> str:
    if not re.match(SECRET_NAME_RE, name):
        raise Invalid(
            f"secret name {name!r} must be 1-64 letters, digits, '.', '_' or '-' (starting with a "
            "letter or digit)",
            ("path", "name"),
        )
    return name


def _admin_of(principal: Principal, group_id: int, group: str) -> None:
    if not principal.is_group_admin(group_id):
        raise Forbidden(f"only the admins of group {group!r} and Corral admins may change its secrets")


def _row(session: Session, name: str, user_id: int | None, group_id: int | None) -> JobSecret | None:
    scope = JobSecret.user_id == user_id if user_id is not None else JobSecret.group_id == group_id
    return session.scalars(select(JobSecret).where(scope, JobSecret.name == name)).one_or_none()


def set_secret(
    session: Session,
    principal: Principal,
    box: SecretBox,
    name: str,
    value: bytes,
    group: str | None = None,
    *,
    now: float | None = None,
) -> tuple[SecretView, bool]:
    """Create or replace a secret (the caller's own, or `group`'s); (its view, created?). Commits."""
    check_name(name)
    if not value:
        raise Invalid("the secret's value is empty", ("body", "value"))
    if len(value) > MAX_VALUE_BYTES:
        raise Invalid(
            f"the secret's value is {len(value)} bytes; at most {MAX_VALUE_BYTES}", ("body", "value")
        )
    now = time.time() if now is None else now
    user_id: int | None = principal.user_id
    group_id: int | None = None
    if group is not None:
        group_id, user_id = visible_group_id(session, principal, group), None
        _admin_of(principal, group_id, group)
    row = _row(session, name, user_id, group_id)
    created = row is None
    if row is None:
        row = JobSecret(name=name, user_id=user_id, group_id=group_id, created_at=now)
        session.add(row)
    row.ciphertext = box.seal(value, _context_of(row))
    row.key_id = box.key_id
    row.updated_at = now
    row.updated_by = principal.name
    audit.record(  # never the value: the name, scope and whether it was created or replaced
        session,
        actor=principal,
        action="secret.set",
        target_kind="secret",
        target_id=f"group:{group}/{name}" if group is not None else f"user:{principal.name}/{name}",
        after={"name": name, "scope": "group" if group is not None else "user", "created": created},
    )
    try:
        session.commit()
    except IntegrityError:  # the same name created at the same moment by another request
        session.rollback()
        raise Conflict(f"secret {name!r} was created by another request just now; set it again")
    return _view(row, group), created


def list_secrets(session: Session, principal: Principal, group: str | None = None) -> list[SecretView]:
    """The caller's own secrets and those of the groups they belong to (or only `group`'s: a
    member's, or any group's for an admin). Names and times only."""
    if group is not None:
        scope = JobSecret.group_id == visible_group_id(session, principal, group)
    else:
        groups = list(principal.group_roles)
        scope = or_(JobSecret.user_id == principal.user_id, JobSecret.group_id.in_(groups))
    rows = session.execute(
        select(JobSecret, Group.name)
        .outerjoin(Group, Group.id == JobSecret.group_id)
        .where(scope)
        .order_by(JobSecret.group_id.is_not(None), Group.name, JobSecret.name)
    ).all()
    return [_view(row, group_name) for row, group_name in rows]


def delete_secret(session: Session, principal: Principal, name: str, group: str | None = None) -> None:
    """Delete the caller's secret `name` (or `group`'s: its admins and Corral admins). Jobs that
    name it and have not started fail at dispatch, saying so. Commits."""
    check_name(name)
    if group is None:
        row = _row(session, name, principal.user_id, None)
        where = "you have no secret"
    else:
        gid = visible_group_id(session, principal, group)
        _admin_of(principal, gid, group)
        row = _row(session, name, None, gid)
        where = f"group {group!r} has no secret"
    if row is None:
        raise NotFound(f"{where} named {name!r}")
    session.delete(row)
    audit.record(
        session,
        actor=principal,
        action="secret.delete",
        target_kind="secret",
        target_id=f"group:{group}/{name}" if group is not None else f"user:{principal.name}/{name}",
        before={"name": name, "scope": "group" if group is not None else "user"},
    )
    session.commit()


def _view(row: JobSecret, group: str | None) -> SecretView:
    return {
        "name": row.name,
        "scope": "user" if row.user_id is not None else "group",
        "group": group if row.group_id is not None else None,
        "updated_at": row.updated_at,
        "updated_by": row.updated_by,
        "created_at": row.created_at,
    }


# --- use by jobs --------------------------------------------------------------------------------


def _resolve(
    session: Session, uses: Sequence[SecretUseV1], user_id: int, group_id: int
) -> list[JobSecret | None]:
    """Per use, the row it names: its scope's, or without one the user's before the group's."""
    names = {u.name for u in uses}
    rows = session.scalars(
        select(JobSecret).where(
            JobSecret.name.in_(names),
            or_(JobSecret.user_id == user_id, JobSecret.group_id == group_id),
        )
    ).all()
    mine = {r.name: r for r in rows if r.user_id is not None}
    groups = {r.name: r for r in rows if r.group_id is not None}
    found: list[JobSecret | None] = []
    for use in uses:
        if use.scope == "user":
            found.append(mine.get(use.name))
        elif use.scope == "group":
            found.append(groups.get(use.name))
        else:
            found.append(mine.get(use.name) or groups.get(use.name))
    return found


def _missing(use: SecretUseV1, group: str) -> str:
    whose = {"user": "you have none", "group": f"group {group!r} has none"}.get(
        use.scope or "", f"neither you nor group {group!r} has one"
    )
    return f"the job names secret {use.name!r}, but {whose} of that name (see `corral secret ls`)"


def check_job_secrets(
    session: Session, user_id: int, group_id: int, group: str, uses: Sequence[SecretUseV1]
) -> None:
    """At submit: 422 naming the first secret the job may not use. The same answer whether the
    name exists for someone else or not at all: it reveals nothing about others' secrets."""
    if not uses:
        return
    for i, (use, row) in enumerate(zip(uses, _resolve(session, uses, user_id, group_id), strict=True)):
        if row is None:
            raise Invalid(_missing(use, group), ("body", "secrets", i, "name"))


def grants_for_job(session: Session, box: SecretBox, job: Job) -> tuple[SecretGrant, ...]:
    """At dispatch: the values of the secrets `job` names, decrypted, for the engine.
    SecretUnavailable when one is gone, no longer the job's to use, or sealed with another key."""
    uses = job.spec.secrets
    if not uses:
        return ()
    # the dispatch loop loads each job with its group (joined): no query of its own for the name
    group = job.group.name if job.group is not None else "?"
    rows = _resolve(session, uses, job.user_id, job.group_id)
    if any(r is not None and r.group_id is not None for r in rows) and not _still_in_group(session, job):
        raise SecretUnavailable(
            f"the job's owner is no longer a member of group {group!r}, so its secrets are not given"
        )
    grants: list[SecretGrant] = []
    for use, row in zip(uses, rows, strict=True):
        if row is None:
            raise SecretUnavailable(_missing(use, group).replace("the job names", "the job needs") + " now")
        if row.key_id != box.key_id:
            raise SecretUnavailable(
                f"secret {use.name!r} was stored with another key (fingerprint {row.key_id}) than the "
                f"server's ({box.key_id}): check CORRAL_SECRETS_KEY"
            )
        try:
            value = box.open(row.ciphertext, _context_of(row))
        except InvalidTag:
            raise SecretUnavailable(f"secret {use.name!r} does not decrypt: its stored ciphertext is damaged")
        if use.env is not None and b"\0" in value:
            raise SecretUnavailable(
                f"secret {use.name!r} holds a NUL byte, which an environment variable cannot; give it "
                "as a file instead"
            )
        grants.append(SecretGrant(name=use.name, value=value, env=use.env, file=use.file))
    return tuple(grants)


def _still_in_group(session: Session, job: Job) -> bool:
    found = session.execute(
        select(User.is_admin, Membership.role)
        .outerjoin(Membership, and_(Membership.user_id == User.id, Membership.group_id == job.group_id))
        .where(User.id == job.user_id)
    ).one_or_none()
    return found is not None and (bool(found.is_admin) or found.role is not None)
