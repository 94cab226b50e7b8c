"""Telling whoever acts on the data that a change was committed: `changed(session, Topic.JOBS)`.

A service that changes what the control loops act on (a job submitted or cancelled, a node
cordoned, a quota changed) calls `changed(session, topic)` where it makes the change. The topic is
delivered to the session's `Notifier` only once the session's transaction commits, whoever
commits it (the service, or the router after several service calls); a rollback drops it. So a
loop is never woken to look for a change that is not visible yet, or that never happened.

The notifier is injected: a session factory carries it (`bind(factory, notifier)`, stored in the
sessions' `info`); a session without one notifies nobody (`NO_NOTIFIER`). The server binds the
API's session factory to its loop waker (`corral.server.context.ServerContext.changed`), which
maps topics to the loops to wake; nothing here knows about loops or URLs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

NOTIFIER_KEY = "corral.notifier"
PENDING_KEY = "corral.changed_topics"


class Topic(StrEnum):
    JOBS = "jobs"  # a job was submitted (or requeued by a person): the queue changed
    CANCEL = "cancel"  # a cancel was requested: a running job must be stopped
    NODES = "nodes"  # a node was cordoned, drained or uncordoned
    QUOTAS = "quotas"  # a group's quotas, weight or borrowing changed
    PAGES = "pages"  # a page was started: its first step should go out now (services/paging.py)


class Notifier(Protocol):
    def changed(self, topic: Topic) -> None:
        """Called after the commit of a change of `topic`; must be quick and must not raise."""


class NullNotifier:
    """Notifies nobody: for sessions of tools, tests and loops that need no waking."""

    def changed(self, topic: Topic) -> None:
        return None


NO_NOTIFIER = NullNotifier()


def bind(factory: sessionmaker[Session], notifier: Notifier) -> None:
    """Sessions made by `factory` from now on deliver their committed topics to `notifier`."""
    info = dict(factory.kw.get("info") or {})
    info[NOTIFIER_KEY] = notifier
    factory.configure(info=info)


def notifier_of(session: Session) -> Notifier:
    found: Notifier | None = session.info.get(NOTIFIER_KEY)
    return NO_NOTIFIER if found is None else found


def changed(session: Session, topic: Topic) -> None:
    """Note that this session's transaction changes `topic`; told to the notifier at commit."""
    pending: set[Topic] = session.info.setdefault(PENDING_KEY, set())
    pending.add(topic)


@event.listens_for(Session, "after_commit")
def _deliver(session: Session) -> None:
    pending: set[Topic] | None = session.info.pop(PENDING_KEY, None)
    if not pending:
        return
    notifier = notifier_of(session)
    for topic in sorted(pending):  # a stable order, for whoever records them
        notifier.changed(topic)


@event.listens_for(Session, "after_transaction_end")
def _forget(session: Session, transaction: SessionTransaction) -> None:
    """The outermost transaction ended without a commit (rolled back, or closed): nothing changed."""
    if transaction.parent is None:
        session.info.pop(PENDING_KEY, None)
