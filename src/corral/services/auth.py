"""Authentication: API tokens (stored as sha256), argon2 passwords, portal sessions with CSRF,
the `Principal` every request acts as, and bootstrapping the first admin."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, event, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import ApiToken, Group, Membership, User, WebSession
from corral.services.errors import Forbidden, Invalid, NotFound, Unauthenticated

TOKEN_PREFIX = "crl_"
SESSION_TTL_S = 12 * 3600.0  # default portal session lifetime (setting: session_lifetime_s)
SESSION_ID_CHARS = 16  # a session's public id: the first characters of its stored hash
# Writing last_used_at on every request would turn every read into a write; once a minute is enough.
LAST_USED_RESOLUTION_S = 60.0
DEFAULT_GROUP = "default"
ADMIN_USER = "admin"

_hasher = PasswordHasher()


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    if not password_hash:
        return False
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


@dataclass(frozen=True)
class Principal:
    """Who a request acts as, with what rights. `group_roles`: group id -> "admin" | "member"."""

    user_id: int
    name: str
    is_admin: bool
    default_group_id: int | None
    group_roles: dict[int, str] = field(default_factory=dict)
    via: str = "token"  # "token" | "session"
    csrf_token: str | None = None  # set when via == "session"
    expires_at: float | None = None  # when the token or session expires, if ever
    # For the audit log: which credential ("token:<id>" | "session:<public id>") and from where
    # (the request's client address, set per request by corral.api.deps).
    credential: str | None = None
    source: str | None = None

    @property
    def admin_group_ids(self) -> frozenset[int]:
        return frozenset(g for g, role in self.group_roles.items() if role == "admin")

    def is_group_admin(self, group_id: int) -> bool:
        return self.is_admin or self.group_roles.get(group_id) == "admin"

    def is_member(self, group_id: int) -> bool:
        return group_id in self.group_roles

    def sees_job(self, user_id: int, group_id: int) -> bool:
        """A job of `user_id` in `group_id` is one this principal may see: services.jobs.visibility's
        rule (own jobs, a group admin's groups' jobs, all for an admin) for a row already read."""
        return self.is_admin or user_id == self.user_id or group_id in self.admin_group_ids


def load_principal(
    session: Session,
    user: User,
    *,
    via: str,
    csrf_token: str | None = None,
    expires_at: float | None = None,
    credential: str | None = None,
) -> Principal:
    rows = session.execute(
        select(Membership.group_id, Membership.role).where(Membership.user_id == user.id)
    ).all()
    return Principal(
        user_id=user.id,
        name=user.name,
        is_admin=user.is_admin,
        default_group_id=user.default_group_id,
        group_roles={int(gid): str(role) for gid, role in rows},
        via=via,
        csrf_token=csrf_token,
        expires_at=expires_at,
        credential=credential,
    )


# --- principal cache --------------------------------------------------------------------------
# Token -> Principal for a few seconds, so a request usually needs no auth queries and no worker
# thread to authenticate. Changes made through this process (revoke, membership, default group)
# clear it at once, and again when they commit; another server process sees them within
# PRINCIPAL_CACHE_S. Each clear starts a new generation: a lookup that began in an older one read
# rows from before the change and is not remembered.

PRINCIPAL_CACHE_S = 5.0
PRINCIPAL_CACHE_MAX = 10_000
_principals: dict[str, tuple[float, Principal]] = {}
_generation = 0
_cache_lock = threading.Lock()


def cached_principal(token_hash: str, now: float) -> Principal | None:
    hit = _principals.get(token_hash)
    if hit is None:
        return None
    cached_at, principal = hit
    if now - cached_at >= PRINCIPAL_CACHE_S or (
        principal.expires_at is not None and principal.expires_at <= now
    ):
        _principals.pop(token_hash, None)
        return None
    return principal


def principal_generation() -> int:
    """Taken before a lookup whose result is then remembered (remember_principal)."""
    return _generation


def remember_principal(token_hash: str, principal: Principal, now: float, generation: int) -> None:
    """Cache `principal`, unless the cache was cleared since `generation` was taken: the lookup
    may have read a token or membership that a change has replaced since."""
    with _cache_lock:
        if generation != _generation:
            return
        if len(_principals) >= PRINCIPAL_CACHE_MAX:
            _principals.clear()
        _principals[token_hash] = (now, principal)


def forget_principals(session: Session | None = None) -> None:
    """Drop every cached principal (after a change to tokens, users or memberships). With the
    `session` that makes the change: again when it commits. Until then other requests still read
    the old rows (the revoked token as valid), and one that did so between this call and the
    commit would otherwise cache them for PRINCIPAL_CACHE_S after the change."""
    global _generation
    with _cache_lock:
        _generation += 1
        _principals.clear()
    if session is not None:
        session.info[_FORGET_ON_COMMIT] = True


_FORGET_ON_COMMIT = "corral.forget_principals"
# Called after such a change commits: what else holds on to a credential checked earlier (the
# server's open sessions, corral.services.open_sessions; the workspace proxy's decisions).
_on_committed_change: list[Callable[[], None]] = []


def on_credentials_changed(callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` (quick, thread-safe) after each committed change that forgets principals.
    Returns what stops that (a server registers one per run; a process may run several)."""
    _on_committed_change.append(callback)

    def unregister() -> None:
        with contextlib.suppress(ValueError):  # already removed
            _on_committed_change.remove(callback)

    return unregister


@event.listens_for(Session, "after_commit")
def _forget_after_commit(session: Session) -> None:
    if session.info.pop(_FORGET_ON_COMMIT, False):
        forget_principals()
        for callback in list(_on_committed_change):
            callback()


# --- API tokens -------------------------------------------------------------------------------


def create_token(
    session: Session, user: User, name: str, *, expires_in_s: float | None = None, now: float | None = None
) -> tuple[ApiToken, str]:
    """Create an API token; returns the row and the plain secret (shown once, never stored)."""
    now = time.time() if now is None else now
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        user_id=user.id,
        name=name,
        token_hash=sha256_hex(secret),
        prefix=secret[:12],
        created_at=now,
        expires_at=None if expires_in_s is None else now + expires_in_s,
    )
    session.add(row)
    session.flush()
    return row, secret


def authenticate_token(session: Session, secret: str, *, now: float | None = None) -> Principal:
    now = time.time() if now is None else now
    found = session.execute(
        select(ApiToken, User)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == sha256_hex(secret))
    ).first()
    if found is None:
        raise Unauthenticated("the API token is not valid")
    token, user = found
    if token.revoked_at is not None:
        raise Unauthenticated("the API token was revoked")
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthenticated("the API token has expired")
    if not user.active:
        raise Unauthenticated(f"user {user.name!r} is deactivated")
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION_S:
        token.last_used_at = now
        session.commit()
    return load_principal(
        session, user, via="token", expires_at=token.expires_at, credential=f"token:{token.id}"
    )


def token_lifetime_s(settings: Settings, expires_in_days: float | None) -> float | None:
    """The lifetime a new token gets: the one asked for, else the configured default; longer
    than the configured maximum is refused (None: never expires, only without a maximum)."""
    days = settings.token_default_lifetime_days if expires_in_days is None else expires_in_days
    most = settings.token_max_lifetime_days
    if most is not None and (days is None or days > most):
        raise Invalid(
            f"a token may live at most {most:g} days (CORRAL_TOKEN_MAX_LIFETIME_DAYS); "
            f"asked for {'no expiry' if days is None else f'{days:g} days'}",
            ("body", "expires_in_days"),
        )
    return None if days is None else days * 86400.0


def capped_to_maker(
    principal: Principal, lifetime_s: float | None, now: float
) -> tuple[float | None, str | None]:
    """A new token's lifetime when `principal` makes it: a token made with an API token expires
    no later than that token, so a stolen short-lived token cannot mint a long-lived one. Returns
    the lifetime and, when it was cut, the note the answer carries saying why. A portal session
    (a password login) and a token that never expires make tokens of the normal lifetime
    (token_lifetime_s)."""
    if principal.via != "token" or principal.expires_at is None:
        return lifetime_s, None
    left = max(0.0, principal.expires_at - now)
    if lifetime_s is not None and lifetime_s <= left:
        return lifetime_s, None
    made_with = principal.credential or "token"
    return left, (
        f"expires with {made_with.replace(':', ' ')}, the token it was made with: a token made with "
        "a token may not outlive it (the portal's Profile page makes a longer one)"
    )


def owner_filter(session: Session, principal: Principal, user: str | None, *, all_users: bool) -> int | None:
    """Whose tokens or sessions a listing shows: None for the caller's own, 0 for everyone's,
    else that user's id. Only admins may ask for more than their own."""
    if (user is None or user == principal.name) and not all_users:
        return None
    if not principal.is_admin:
        raise Forbidden("only an administrator may list another user's sessions or tokens")
    if all_users:
        return 0
    found = session.scalar(select(User.id).where(User.name == user))
    if found is None:
        raise NotFound(f"no user named {user!r}")
    return int(found)


def list_tokens(
    session: Session, principal: Principal, *, user_id: int | None = None
) -> list[tuple[ApiToken, str]]:
    """The caller's tokens; an admin may name another user (`user_id`) or pass 0 for everyone's.
    Pairs of (token, owner's name)."""
    query = select(ApiToken, User.name).join(User, User.id == ApiToken.user_id).order_by(ApiToken.id)
    if user_id is None or not principal.is_admin:
        query = query.where(ApiToken.user_id == principal.user_id)
    elif user_id:
        query = query.where(ApiToken.user_id == user_id)
    return [(token, str(name)) for token, name in session.execute(query).all()]


def revoke_token(session: Session, principal: Principal, token_id: int, *, now: float | None = None) -> None:
    token = session.get(ApiToken, token_id)
    # Another user's token reads as "not found": its existence is none of the caller's business.
    if token is None or (token.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"no API token with id {token_id}")
    if token.revoked_at is None:
        token.revoked_at = time.time() if now is None else now
    forget_principals(session)


# --- portal sessions --------------------------------------------------------------------------


class WrongPassword(Unauthenticated):
    """A failed login (unknown user, deactivated, or wrong password: the answer does not say)."""


def login(
    session: Session,
    username: str,
    password: str,
    *,
    now: float | None = None,
    lifetime_s: float = SESSION_TTL_S,
) -> tuple[str, User, str]:
    """Check the password and open a session; returns (cookie secret, user, csrf token)."""
    now = time.time() if now is None else now
    user = session.scalar(select(User).where(User.name == username))
    stored = user.password_hash if user is not None and user.active else None
    # An unknown name (or an account without a password) is checked against a hash too: answered
    # at once, it told by its speed which names exist, which the answer itself does not say.
    matches = verify_password(stored or _stand_in_hash(), password)
    if user is None or stored is None or not matches:
        raise WrongPassword("wrong user name or password")
    secret = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    session.add(
        WebSession(
            id_hash=sha256_hex(secret),
            user_id=user.id,
            csrf_token=csrf,
            created_at=now,
            expires_at=now + lifetime_s,
        )
    )
    return secret, user, csrf


@functools.cache
def _stand_in_hash() -> str:
    """An argon2 hash of a random secret nobody knows, verified where there is no account's own."""
    return hash_password(secrets.token_urlsafe(32))


def authenticate_session(session: Session, secret: str, *, now: float | None = None) -> Principal:
    now = time.time() if now is None else now
    found = session.execute(
        select(WebSession, User)
        .join(User, User.id == WebSession.user_id)
        .where(WebSession.id_hash == sha256_hex(secret))
    ).first()
    if found is None:
        raise Unauthenticated("the session is not valid; log in again")
    web, user = found
    return web_session_principal(session, web, user, now, csrf_token=web.csrf_token)


def web_session_principal(
    session: Session, web: WebSession, user: User, now: float, *, csrf_token: str | None = None
) -> Principal:
    """Who a portal session acts for while it is valid and its user active; shared by the portal's
    cookie and the workspace origin's (which acts without the portal's CSRF token)."""
    if web.expires_at <= now or not user.active:
        raise Unauthenticated("the session has expired; log in again")
    return load_principal(
        session,
        user,
        via="session",
        csrf_token=csrf_token,
        expires_at=web.expires_at,
        credential=f"session:{session_id(web)}",
    )


def csrf_matches(principal: Principal, header_value: str | None) -> bool:
    if principal.via != "session":
        return True
    if not header_value or not principal.csrf_token:
        return False
    return hmac.compare_digest(principal.csrf_token, header_value)


def logout(session: Session, secret: str) -> None:
    web = session.get(WebSession, sha256_hex(secret))
    if web is not None:
        session.delete(web)
        forget_principals(session)  # its open sessions end (corral.services.open_sessions)


def delete_expired_sessions(session: Session, now: float) -> int:
    """Delete the web sessions past their expiry (refused already; a logout deletes the others),
    and with them what hangs off them: their workspace cookies (workspace_passes, ON DELETE
    CASCADE). The retention loop's; how many sessions went."""
    deleted = session.execute(
        delete(WebSession).where(WebSession.expires_at <= now).execution_options(synchronize_session=False)
    )
    session.commit()
    return int(deleted.rowcount)  # type: ignore[attr-defined]


def session_id(web: WebSession) -> str:
    return web.id_hash[:SESSION_ID_CHARS]


def list_sessions(
    session: Session, principal: Principal, *, user_id: int | None = None, now: float | None = None
) -> list[tuple[WebSession, str]]:
    """Unexpired portal sessions: the caller's; an admin may name a user (`user_id`) or pass 0 for
    everyone's. Pairs of (session, owner's name), newest first."""
    now = time.time() if now is None else now
    query = (
        select(WebSession, User.name)
        .join(User, User.id == WebSession.user_id)
        .where(WebSession.expires_at > now)
        .order_by(WebSession.created_at.desc())
    )
    if user_id is None or not principal.is_admin:
        query = query.where(WebSession.user_id == principal.user_id)
    elif user_id:
        query = query.where(WebSession.user_id == user_id)
    return [(web, str(name)) for web, name in session.execute(query).all()]


def revoke_session(session: Session, principal: Principal, public_id: str) -> WebSession:
    """End a session by its public id; the owner's or, for an admin, anyone's. Returns it (deleted)."""
    valid = len(public_id) == SESSION_ID_CHARS and all(c in "0123456789abcdef" for c in public_id)
    web = (
        session.scalar(select(WebSession).where(WebSession.id_hash.startswith(public_id, autoescape=True)))
        if valid
        else None
    )
    # Another user's session reads as "not found", like another user's token.
    if web is None or (web.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"no session with id {public_id!r}")
    session.delete(web)
    forget_principals(session)  # its open sessions end (corral.services.open_sessions)
    return web


# --- bootstrap --------------------------------------------------------------------------------


def bootstrap_admin(session: Session, settings: Settings, *, now: float | None = None) -> str | None:
    """On first start (no users at all): create the `default` group and the `admin` user (its
    group admin too) with an API token. Returns the plain token once, or None when users exist.
    Commits. Safe when two servers start at once: the loser of the race gets None."""
    created = _bootstrap(session, settings, password=None, now=now)
    return None if created is None else created[0]


BOOTSTRAP_PASSWORD_BYTES = 12


def bootstrap_admin_with_password(
    session: Session, settings: Settings, *, now: float | None = None
) -> tuple[str, str] | None:
    """As `bootstrap_admin`, and the admin also gets a generated password (for the portal, which
    logs in with a password, not a token). Returns (token, password) once, in the same commit as
    the user; the server prints both. (Tests use `bootstrap_admin`: argon2 is slow on purpose.)"""
    return _bootstrap(session, settings, password=secrets.token_urlsafe(BOOTSTRAP_PASSWORD_BYTES), now=now)


def _bootstrap(
    session: Session, settings: Settings, *, password: str | None, now: float | None
) -> tuple[str, str] | None:
    del settings  # reserved: e.g. an admin name or password from the environment later
    now = time.time() if now is None else now
    if session.scalar(select(func.count()).select_from(User)):
        return None
    try:
        group = session.scalar(select(Group).where(Group.name == DEFAULT_GROUP))
        if group is None:
            group = Group(name=DEFAULT_GROUP, created_at=now, weight=1.0, borrowing=True)
            session.add(group)
            session.flush()
        admin = User(
            name=ADMIN_USER,
            is_admin=True,
            default_group_id=group.id,
            created_at=now,
            active=True,
            password_hash=hash_password(password) if password is not None else None,
        )
        session.add(admin)
        session.flush()
        session.add(Membership(user_id=admin.id, group_id=group.id, role="admin"))
        _row, secret = create_token(session, admin, "bootstrap", now=now)
        session.commit()
    except IntegrityError:
        session.rollback()
        return None
    return secret, password or ""
