"""From an SSH login name to the running job it enters.

Login names: `<user>+job-<id>` (a running job of that user) and `<user>+<workspace>` (the running
job of the user's workspace). The user part names whose registered public keys may log in; the
job must be that user's own (an admin's key opens only the admin's own jobs here: an admin enters
another user's job with `corral exec`, which is audited under the admin's name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.models import SshKey, User
from corral.services import workspaces
from corral.services.auth import Principal, load_principal
from corral.services.errors import Forbidden, Invalid, NotFound, Unauthenticated
from corral.services.sandbox_exec import ExecTarget, find_job, running_target

_LOGIN = re.compile(r"^(?P<user>[^+\s]{1,64})\+(?P<target>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")
_JOB = workspaces.JOB_LOGIN_RE  # which no workspace may be named


@dataclass(frozen=True, slots=True)
class Login:
    user: str
    target: str  # "job-<id>" or a workspace name

    @property
    def job_id(self) -> int | None:
        m = _JOB.match(self.target)
        return int(m.group("id")) if m else None


def parse_login(username: str) -> Login:
    m = _LOGIN.match(username)
    if m is None:
        raise Invalid(
            f"SSH login {username!r} is not <user>+<workspace> or <user>+job-<id> (e.g. alice+job-42)",
            ("ssh", "username"),
        )
    return Login(m.group("user"), m.group("target"))


def authorized_keys(session: Session, user_name: str) -> list[str]:
    """The public keys `user_name` registered (none for an unknown or disabled user)."""
    rows = session.scalars(
        select(SshKey.public_key)
        .join(User, User.id == SshKey.user_id)
        .where(User.name == user_name, User.active.is_(True))
    )
    return list(rows)


def principal_for(session: Session, user_name: str, source: str) -> Principal:
    user = session.scalar(select(User).where(User.name == user_name))
    if user is None:
        raise NotFound(f"no user {user_name!r}")
    if not user.active:  # deactivated after this connection logged in: no more channels
        raise Unauthenticated(f"user {user_name!r} is deactivated")
    return replace(load_principal(session, user, via="ssh", credential="ssh-key"), source=source)


def resolve(session: Session, principal: Principal, login: Login, rank: int = 0) -> ExecTarget:
    """The running job instance `login` names, for `principal` (its user part)."""
    job_id = login.job_id
    if job_id is None:
        job_id = _workspace_job(session, principal.name, login.target)
    job = find_job(session, principal, job_id)
    if job.user_id != principal.user_id:
        raise Forbidden(f"job {job_id} is not {principal.name}'s: the gateway opens only your own jobs")
    return running_target(job, rank)


def _workspace_job(session: Session, owner: str, name: str) -> int:
    """The running job of `owner`'s workspace `name`; NotFound saying why there is none: no
    such workspace, one still starting (`corral ws start` would be refused: it is), or stopped."""
    job_id = workspaces.current_job_id(session, owner, name)
    if job_id is not None:
        return job_id
    exists, starting = workspaces.not_running(session, owner, name)
    if not exists:
        raise NotFound(f"unknown workspace {name!r} of {owner}: `corral ws ls` lists yours")
    if starting is not None:
        raise NotFound(
            f"workspace {name!r} is starting (job {starting}), not running yet: try again once "
            f"`corral ws show {name}` says running"
        )
    raise NotFound(f"workspace {name!r} is stopped: start it with `corral ws start {name}`")
