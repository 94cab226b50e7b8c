"""Long-lived sessions held open by this server process, by whose credential holds them: `corral
exec` and `corral port-forward` WebSockets, SSH gateway connections, the workspace proxy's
WebSockets (JupyterLab kernels). A request is authenticated once; these outlive that check, so
revoking the token, ending the portal session, removing the SSH key or deactivating the user
must end them too.

`OpenSessions.check` reads, for every credential still held, whether it is still good (the user
active; the token not revoked nor expired; the portal session not ended nor expired; the SSH key
still the user's) and ends the sessions of those that are not. The server runs it in its
`open-sessions` loop: every CHECK_INTERVAL_S (what a change made through another server process
sharing the database waits at most), and at once when a change commits in this process
(corral.services.auth.forget_principals wakes it). No sessions open: no query.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from corral.db.models import ApiToken, SshKey, User, WebSession

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 2.0
ENDED_MESSAGE = (
    "access ended: the credential of this session was revoked or has expired, or its user deactivated"
)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a session open: the user's name and the credential it was opened with,
    "token:<id>", "session:<public id>" or "ssh-key:<SHA256 fingerprint>" (None: only the user)."""

    user: str
    credential: str | None


class OpenSessions:
    """Thread-safe: the API's handlers, the SSH gateway's event loop and the check share it.
    `close` callables are called from the checking thread: they must be thread-safe (hand the
    work to their event loop with call_soon_threadsafe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._open: dict[int, tuple[Holder, Callable[[], object]]] = {}

    def add(self, holder: Holder, close: Callable[[], object]) -> int:
        with self._lock:
            handle = next(self._ids)
            self._open[handle] = (holder, close)
            return handle

    def discard(self, handle: int) -> None:
        with self._lock:
            self._open.pop(handle, None)

    def __len__(self) -> int:
        """How many sessions are open (a cheap "any?" for the loop: no set built)."""
        with self._lock:
            return len(self._open)

    def holders(self) -> set[Holder]:
        with self._lock:
            return {holder for holder, _close in self._open.values()}

    def end(self, holders: Iterable[Holder]) -> int:
        """Close every session held by one of `holders`; returns how many."""
        gone = set(holders)
        with self._lock:
            handles = [handle for handle, (holder, _close) in self._open.items() if holder in gone]
            ending = [self._open.pop(handle)[1] for handle in handles]
        for close in ending:
            try:
                close()
            except Exception:  # one session's failure to close must not keep the others open
                log.exception("could not end an open session")
        return len(ending)

    def check(self, session: Session, now: float) -> int:
        """End the sessions whose holder is no longer good (read from the database); returns how many."""
        holders = self.holders()
        if not holders:
            return 0
        bad = holders - good_holders(session, holders, now)
        session.rollback()  # a read: nothing to keep
        if bad:
            log.info("ending sessions of %s: access revoked", ", ".join(sorted({h.user for h in bad})))
        return self.end(bad)


@contextlib.contextmanager
def held_open(state: object, holder: Holder | None) -> Iterator[asyncio.Event]:
    """Hold a session open in the server's OpenSessions (`state.open_sessions`, if any) for the
    `with` block, by `holder`: the event it yields is set, on the running event loop, when the
    holder's credential loses access. No OpenSessions or no holder: an event never set."""
    ended = asyncio.Event()
    sessions: OpenSessions | None = getattr(state, "open_sessions", None)
    if sessions is None or holder is None:
        yield ended
        return
    loop = asyncio.get_running_loop()
    handle = sessions.add(holder, lambda: loop.call_soon_threadsafe(ended.set))
    try:
        yield ended
    finally:
        sessions.discard(handle)


def good_holders(session: Session, holders: set[Holder], now: float) -> set[Holder]:
    """Those of `holders` still allowed: at most four queries, whatever their number."""
    names = {h.user for h in holders}
    active = set(session.scalars(select(User.name).where(User.name.in_(names), User.active.is_(True))))
    kinds: dict[str, set[str]] = {"token": set(), "session": set(), "ssh-key": set()}
    for h in holders:
        kind, _, value = (h.credential or "").partition(":")
        if kind in kinds:
            kinds[kind].add(value)
    # No credential, or one of no kind checked here: the user's being active is what counts.
    good = {h.credential for h in holders if (h.credential or "").partition(":")[0] not in kinds}
    token_ids = [int(t) for t in kinds["token"] if t.isdigit()]
    if token_ids:
        rows = session.scalars(
            select(ApiToken.id).where(
                ApiToken.id.in_(token_ids),
                ApiToken.revoked_at.is_(None),
                or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now),
            )
        )
        good |= {f"token:{i}" for i in rows}
    if kinds["session"]:
        prefixes = [WebSession.id_hash.startswith(p, autoescape=True) for p in kinds["session"]]
        live = select(WebSession.id_hash).where(WebSession.expires_at > now, or_(*prefixes))
        hashes = session.scalars(live)
        good |= {f"session:{p}" for h in hashes for p in kinds["session"] if h.startswith(p)}
    keys: set[tuple[str, str]] = set()  # (user, credential): a key is good for its own user only
    if kinds["ssh-key"]:
        rows2 = session.execute(
            select(User.name, SshKey.fingerprint)
            .join(User, User.id == SshKey.user_id)
            .where(SshKey.fingerprint.in_(kinds["ssh-key"]))
        )
        keys = {(name, f"ssh-key:{fp}") for name, fp in rows2}
    return {
        h for h in holders if h.user in active and (h.credential in good or (h.user, h.credential) in keys)
    }
