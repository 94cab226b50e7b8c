"""How a browser gets from the portal onto the workspace origin (docs/security.md, "Workspaces on
their own origin"; corral.workspaces.proxy serves both ends).

The portal, asked by the workspace's owner with the portal's session cookie, issues a ticket: a
random secret, single use, valid TICKET_TTL_S, bound to that workspace, to the path asked for, to
the portal session it was issued under (so to its user) and to the browser that will redeem it:
the hash of a state secret the workspace origin has put in that browser's cookie just before (as
OAuth's `state`), so a ticket one user mints cannot be redeemed in another user's browser (a
login CSRF into the minter's workspace). The browser is redirected with it to the workspace
listener, which redeems it by compare-and-set (a second redeem, or one after the expiry, finds
nothing) for a cookie of its own origin: another random secret, valid for that one workspace
while the portal session is (a logout or a revoke of the session ends it; the row is deleted
with the session). Only sha256 hashes are stored, so a database dump opens nothing. The portal's
own cookie is never accepted on the workspace origin, nor the workspace cookie on the portal.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.db.models import User, WebSession
from corral.db.workspace_models import WorkspacePass
from corral.services.auth import Principal, sha256_hex, web_session_principal
from corral.services.errors import Unauthenticated

TICKET_TTL_S = 30.0  # a redirect's round trip, with room for a slow machine
TICKET = "ticket"
COOKIE = "cookie"
MAX_PATH_CHARS = 2048
STATE_HASH = re.compile(r"[0-9a-f]{64}")  # a state secret's sha256, as the portal is given it
MAX_WORKSPACE_ID = 2**31 - 1  # as corral.api.deps.MAX_ROW_ID: ids are 32-bit in PostgreSQL
MAX_ESCAPES = 4  # a destination's path escaped more times over than this is refused, not decoded
_UNDER_A_WORKSPACE = re.compile(r"/ws/([1-9][0-9]{0,18})/")
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x21-\x7e]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class TicketRefused(Unauthenticated):
    """A ticket that is unknown, used already, expired, redeemed by another browser than the one
    it was issued for, or whose portal session has ended."""


class BadTarget(ValueError):
    """A handoff's destination that is not a plain path under `/ws/<id>/` (handoff_target); the
    message names what is wrong with it."""


def handoff_target(to: str) -> tuple[int, str]:
    """A handoff's destination, as its every step reads it (the portal's `/ws/<id>/`, the begin's
    and the ticket's `to`, a ticket's path at the redeem): the workspace's id and `to` itself,
    unchanged, when it is a path (and query) under `/ws/<id>/` that stays there however it is
    read; else BadTarget naming what is wrong.

    The redeem redirects the browser to it, and a browser resolves dot segments (`..`, and
    `%2e%2e` too), takes `\\` for `/` and keeps the origin (`//host` would leave it); a server
    on the way may decode `%2f` or a second level of escapes (`%252e`). So the path is decoded as
    far as any of them would (escapes again and again, up to MAX_ESCAPES levels; `\\` as `/`),
    and a dot segment or a control character in that reading is refused: a browser resolves its
    own dots before it asks the portal, so an honest link has none, and it is returned unchanged
    (`/ws/3/lab/tree/a%20b.ipynb`). Its query is the lab's and is not looked into."""
    shown = repr(to if len(to) <= 80 else to[:80] + "...")
    if len(to) > MAX_PATH_CHARS:
        raise BadTarget(f"{shown} is longer than the {MAX_PATH_CHARS} characters a workspace link may have")
    if to.startswith(("//", "/\\")) or _SCHEME.match(to):
        raise BadTarget(
            f"{shown} names a scheme or a host: the destination is a path on the workspace origin"
        )
    if _NOT_PRINTABLE_ASCII.search(to):
        raise BadTarget(
            f"{shown} holds a space, a control character or a non-ASCII one: a link comes escaped"
        )
    found = _UNDER_A_WORKSPACE.match(to)
    if found is None or int(found[1]) > MAX_WORKSPACE_ID:
        raise BadTarget(f"{shown} is not a path under /ws/<id>/ (a workspace's id: 1, 2, ...)")
    if "#" in to:
        raise BadTarget(f"{shown} holds a fragment ('#'), which a browser never sends")
    path = to.partition("?")[0]
    for _ in range(MAX_ESCAPES):
        decoded = unquote(path, encoding="latin-1")
        if decoded == path:
            break
        path = decoded
    if _ESCAPE.search(path):
        raise BadTarget(f"{shown} is escaped more than {MAX_ESCAPES} times over")
    path = path.replace("\\", "/")
    if _CONTROL.search(path):
        raise BadTarget(f"{shown} holds a control character (escaped: %00 to %1F or %7F)")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise BadTarget(
            f"{shown} has a dot segment ('.' or '..', escaped or not, or after an escaped '/' or a "
            f"backslash), which a browser resolves, out of /ws/{found[1]}/ perhaps"
        )
    return int(found[1]), to


@dataclass(frozen=True, slots=True)
class Redeemed:
    workspace_id: int
    path: str  # where the ticket was for: under `/ws/<workspace_id>/`
    cookie: str  # the workspace origin's cookie (the secret; only its hash is stored)
    expires_at: float  # its portal session's expiry


def issue_ticket(
    session: Session,
    session_secret: str,
    workspace_id: int,
    path: str,
    state_hash: str,
    *,
    now: float | None = None,
) -> str:
    """A ticket for the owner of the portal session `session_secret` (already authorised for
    `workspace_id` by the proxy) to open `path` (under `/ws/<workspace_id>/`) on the workspace
    origin, in the browser holding the state secret whose sha256 is `state_hash`. Expired tickets
    are deleted here: no loop is needed to keep the table small."""
    now = time.time() if now is None else now
    if handoff_target(path)[0] != workspace_id:
        raise BadTarget(f"a ticket's path must be under /ws/{workspace_id}/, the workspace it is for")
    if STATE_HASH.fullmatch(state_hash) is None:
        raise ValueError("a ticket's state hash must be 64 lowercase hexadecimal digits (a sha256)")
    # The session may have ended since the proxy's decision (cached briefly; a logout through
    # another server): "log in again", not the foreign key's IntegrityError.
    ended = Unauthenticated("the portal session has ended; log in again")
    web = session.get(WebSession, sha256_hex(session_secret))
    if web is None or web.expires_at <= now:
        raise ended
    session.execute(
        delete(WorkspacePass).where(WorkspacePass.kind == TICKET, WorkspacePass.expires_at <= now)
    )
    ticket = secrets.token_urlsafe(32)
    session.add(
        WorkspacePass(
            id_hash=sha256_hex(ticket),
            kind=TICKET,
            workspace_id=workspace_id,
            session_hash=sha256_hex(session_secret),
            state_hash=state_hash,
            path=path,
            created_at=now,
            expires_at=now + TICKET_TTL_S,
        )
    )
    try:
        session.commit()
    except IntegrityError:  # deleted between the look and the insert
        session.rollback()
        raise ended from None
    return ticket


def redeem_ticket(
    session: Session, ticket: str, state_of: Callable[[str], str | None], *, now: float | None = None
) -> Redeemed:
    """The ticket turned into the workspace origin's cookie, once, in the browser it was issued
    for: `state_of(state_hash)` is that browser's state secret for the ticket's state hash (None
    if it holds none); one that does not match spends the ticket and is refused. The row changes
    from ticket to cookie by compare-and-set on its hash, kind and expiry, so of two redeems only
    one wins."""
    now = time.time() if now is None else now
    refused = TicketRefused(
        "this link to a workspace has expired or was used already; open the workspace from the portal again"
    )
    if not ticket or len(ticket) > 100:
        raise refused
    found = session.execute(
        select(WorkspacePass, WebSession.expires_at, User.active)
        .join(WebSession, WebSession.id_hash == WorkspacePass.session_hash)
        .join(User, User.id == WebSession.user_id)
        .where(WorkspacePass.id_hash == sha256_hex(ticket), WorkspacePass.kind == TICKET)
    ).first()
    if found is None:
        raise refused
    row, session_expires_at, active = found
    # read first: whatever is refused below, the caller drops the state cookie it names (spent)
    state = state_of(row.state_hash) if row.state_hash else None
    try:  # (issued before its destination was checked as closely: by an older version)
        if handoff_target(row.path)[0] != row.workspace_id:
            raise BadTarget(f"{row.path!r} is not under /ws/{row.workspace_id}/, the workspace it is for")
    except BadTarget:
        session.execute(delete(WorkspacePass).where(WorkspacePass.id_hash == row.id_hash))
        session.commit()
        raise
    if state is None or sha256_hex(state) != row.state_hash:
        # Not the browser the ticket was issued to: someone else's ticket (a login CSRF), or one
        # read off a log. Spent, so it cannot be tried again.
        session.execute(delete(WorkspacePass).where(WorkspacePass.id_hash == row.id_hash))
        session.commit()
        raise TicketRefused(
            "this link to a workspace was not issued to this browser; open the workspace from the portal"
        )
    if row.expires_at <= now or session_expires_at <= now or not active:
        raise refused
    cookie = secrets.token_urlsafe(32)
    won = session.execute(
        update(WorkspacePass)
        .where(
            WorkspacePass.id_hash == row.id_hash,
            WorkspacePass.kind == TICKET,
            WorkspacePass.expires_at > now,
        )
        .values(
            id_hash=sha256_hex(cookie), kind=COOKIE, path="", state_hash=None, expires_at=session_expires_at
        )
        .execution_options(synchronize_session=False)
    )
    if won.rowcount != 1:  # type: ignore[attr-defined]  # redeemed by another request meanwhile
        session.rollback()
        raise refused
    # The browser's earlier cookie for this workspace (same name and path: this one replaces it
    # in its jar) is of no more use: one row per session and workspace, not one per handoff.
    session.execute(
        delete(WorkspacePass).where(
            WorkspacePass.session_hash == row.session_hash,
            WorkspacePass.workspace_id == row.workspace_id,
            WorkspacePass.kind == COOKIE,
            WorkspacePass.id_hash != sha256_hex(cookie),
        )
    )
    redeemed = Redeemed(row.workspace_id, row.path, cookie, session_expires_at)
    session.commit()
    return redeemed


def authenticate_pass(
    session: Session, cookie: str, workspace_id: int, *, now: float | None = None
) -> Principal:
    """Who the workspace origin's `cookie` acts for, on `workspace_id` only: the user of the
    portal session it came from, while that session is valid and the user active."""
    now = time.time() if now is None else now
    found = session.execute(
        select(WebSession, User)
        .join(WorkspacePass, WorkspacePass.session_hash == WebSession.id_hash)
        .join(User, User.id == WebSession.user_id)
        .where(
            WorkspacePass.id_hash == sha256_hex(cookie),
            WorkspacePass.kind == COOKIE,
            WorkspacePass.workspace_id == workspace_id,
        )
    ).first()
    if found is None:
        raise Unauthenticated("the workspace's cookie is not valid; open the workspace from the portal again")
    web, user = found
    return web_session_principal(session, web, user, now)
