"""Login protection: failed logins are counted per account (the user name tried, whether or not
it exists) and per source address. After `login_lockout_after` consecutive failures the key is
locked for `login_lockout_base_s`, doubling with each further failure up to
`login_lockout_max_s` (exponential backoff). While either key is locked every login for it is
refused with 429 and Retry-After, even with the right password: otherwise the lockout would not
slow guessing down. A successful login clears the account's counter; an address's counter is
forgotten `login_failure_window_s` after its last failure. Passwords never reach the log.

The counters live in the database (table login_failures) so that a restart forgets nothing and
several servers count together.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import LoginFailure
from corral.services.errors import NotFound, ServiceError

log = logging.getLogger(__name__)

ACCOUNT, ADDRESS = "account", "address"
KEY_MAX = 255


class TooManyAttempts(ServiceError):
    status_code = 429

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, math.ceil(retry_after_s))


@dataclass(frozen=True)
class Policy:
    after: int
    base_s: float
    max_s: float
    window_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls(
            after=settings.login_lockout_after,
            base_s=settings.login_lockout_base_s,
            max_s=settings.login_lockout_max_s,
            window_s=settings.login_failure_window_s,
        )

    def lock_for(self, failures: int) -> float:
        """Seconds a key with `failures` consecutive failures stays locked (0: not locked)."""
        if failures < self.after:
            return 0.0
        return min(self.max_s, self.base_s * 2.0 ** min(failures - self.after, 32))


def _keys(username: str, address: str) -> list[tuple[str, str]]:
    return [(ACCOUNT, username[:KEY_MAX]), (ADDRESS, address[:KEY_MAX])]


def check_allowed(session: Session, username: str, address: str, now: float) -> None:
    """Raise TooManyAttempts while the account or the address is locked."""
    for scope, key in _keys(username, address):
        row = session.scalar(select(LoginFailure).where(LoginFailure.scope == scope, LoginFailure.key == key))
        if row is not None and row.locked_until is not None and row.locked_until > now:
            what = f"account {username!r}" if scope == ACCOUNT else f"address {address}"
            wait_s = row.locked_until - now
            raise TooManyAttempts(
                f"too many failed logins for {what}: locked for {math.ceil(wait_s)} more s "
                "(an administrator can lift it: corral auth unlock)",
                wait_s,
            )


def record_failure(session: Session, username: str, address: str, policy: Policy, now: float) -> None:
    """Count one failed login against the account and the address, lock those past the
    threshold, log it, and commit (the caller's answer is a refusal: nothing else to keep)."""
    session.rollback()
    for scope, key in _keys(username, address):
        failures = _count(session, scope, key, policy, now)
        lock_s = policy.lock_for(failures)
        if lock_s > 0:
            session.execute(
                update(LoginFailure)
                .where(LoginFailure.scope == scope, LoginFailure.key == key)
                .values(locked_until=now + lock_s)
            )
        log.warning(
            "failed login for account %r from %s: %s %s has %d consecutive failures%s",
            username,
            address,
            scope,
            key,
            failures,
            f", locked for {lock_s:g} s" if lock_s else "",
        )
    session.commit()


def _count(session: Session, scope: str, key: str, policy: Policy, now: float) -> int:
    """Add one failure to (scope, key), starting afresh after the window; returns the count.
    An atomic UPDATE, so that two servers counting at once lose nothing."""
    where = (LoginFailure.scope == scope, LoginFailure.key == key)
    session.execute(
        delete(LoginFailure).where(
            *where,
            LoginFailure.last_failed_at < now - policy.window_s,
            (LoginFailure.locked_until.is_(None)) | (LoginFailure.locked_until <= now),
        )
    )
    bump = update(LoginFailure).where(*where).values(failures=LoginFailure.failures + 1, last_failed_at=now)
    if session.execute(bump).rowcount == 0:  # type: ignore[attr-defined]
        try:
            with session.begin_nested():
                session.add(
                    LoginFailure(scope=scope, key=key, failures=1, first_failed_at=now, last_failed_at=now)
                )
        except IntegrityError:  # another server inserted it first: count on its row
            session.execute(bump)
    return int(session.scalar(select(LoginFailure.failures).where(*where)) or 0)


def record_success(session: Session, username: str) -> None:
    """A right password clears the account's failures (not the address's: one valid account must
    not let an address go on guessing others)."""
    session.execute(
        delete(LoginFailure).where(LoginFailure.scope == ACCOUNT, LoginFailure.key == username[:KEY_MAX])
    )


def list_lockouts(session: Session, now: float, *, locked_only: bool = False) -> list[LoginFailure]:
    """Counters with failures (recent ones) or a lockout still running, newest failure first."""
    query = select(LoginFailure).order_by(LoginFailure.last_failed_at.desc(), LoginFailure.id)
    rows = list(session.scalars(query))
    if locked_only:
        return [r for r in rows if r.locked_until is not None and r.locked_until > now]
    return rows


def clear_lockout(session: Session, lockout_id: int) -> LoginFailure:
    row = session.get(LoginFailure, lockout_id)
    if row is None:
        raise NotFound(f"no login lockout with id {lockout_id}")
    session.delete(row)
    return row
