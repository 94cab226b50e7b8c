"""The rules a delivery pass follows when it claims its messages one at a time by compare-and-set
(page notifications: corral.monitor.pager; job notifications: corral.monitor.job_notifier).

A claim is a lease: the message is `sending` until SENDING_RETRY_S after the claim, when another
server's pass may take it (its claimer is taken to have died). Two rules keep a live pass from
having its claims taken while it still sends them:

- **Each claim's time is read when it is made** (`ClaimingPass.claim_time`), not taken from the
  pass's start: a pass that has sent for minutes would otherwise make claims that expired
  before they were made, and another server would send those messages too.
- **No new claim after SEND_BUDGET_S of the pass**: each send has its own deadline (a webhook's
  30 s, an email's SMTP_SEND_OPERATIONS times its SMTP timeout, at most SMTP_TIMEOUT_MAX_S in
  monitor.yml: corral.monitor.channels.SmtpDeadline), so a claim made
  within the budget is settled long before it expires. What is left waits for the next pass;
  messages never tried are claimed before retries (`due_messages`).

A message reclaimed from `sending` (its sender died each time, maybe killed by the message
itself) counts those tries against the retry limit and is then given up (`give_up_reclaimed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import case, select, update
from sqlalchemy.orm import Session

from corral.db.notify_models import JobNotifyDelivery
from corral.db.oncall_models import PageNotification

SENDING_RETRY_S = 300.0  # a message claimed by a process that died is sent again after this
SEND_BUDGET_S = 60.0  # a pass claims no more messages after this long (each send has its own timeout)


class ClaimingPass:
    """The clock of one delivery pass. `now`: the pass's start on the caller's clock (the loop's
    time, or a test's simulated one); each claim's time is that plus the time the pass has taken
    so far, read from `clock` (monotonic) when the claim is made; `budget_s`: SEND_BUDGET_S, the
    caller's own constant."""

    def __init__(self, now: float, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.budget_s = budget_s
        self.clock = clock
        self.started = clock()

    def claim_time(self) -> float | None:
        """The time of a claim made now, or None once the pass is past its budget: claim no more."""
        elapsed = max(0.0, self.clock() - self.started)
        return None if elapsed > self.budget_s else self.now + elapsed

    def at(self) -> float:
        """The time now on the caller's clock, whatever the budget: when a send ended, for its
        outcome's time (sent_at, the failure's backoff), not the claim's (review110 #11)."""
        return self.now + max(0.0, self.clock() - self.started)


def reclaimed_too_often(
    seen_state: str, row: JobNotifyDelivery | PageNotification, max_attempts: int
) -> bool:
    """Whether a row just claimed from `seen_state` was taken from a dead sender once too often."""
    return seen_state == "sending" and row.attempts > max_attempts


# The two kinds of message, named (not a Protocol): the static check of state writes
# (tests/server/test_lifecycle_owner.py) then sees these are not a job's or a node's state
def give_up_reclaimed(row: JobNotifyDelivery | PageNotification, now: float) -> None:
    """A message left in `sending` by a process that died each time it sent it: the retry limit
    holds for these tries too, or a message that kills its sender is tried for ever (not
    committed)."""
    row.state, row.next_attempt_at = "given_up", now
    row.last_error = f"the server stopped while sending it, {row.attempts - 1} times"


def due_messages(
    session: Session, model: type[JobNotifyDelivery] | type[PageNotification], now: float, limit: int
) -> list[tuple[int, str, float]]:
    """(id, state, next_attempt_at) of the due messages: pending, failing past their backoff, or
    `sending` under a claim that expired (its process died). Messages never tried come first, then
    the retries, each oldest due first: a pass stops claiming after SEND_BUDGET_S, and retries to
    dead endpoints (each send up to its timeout) would otherwise use it up before a fresh page is
    sent (review110 #5). Each is then claimed by compare-and-set on the state and due time read;
    the read's transaction ends here."""
    retry = case((model.attempts == 0, 0), else_=1)
    rows = session.execute(
        select(model.id, model.state, model.next_attempt_at)
        .where(model.state.in_(("pending", "failing", "sending")), model.next_attempt_at <= now)
        .order_by(retry, model.next_attempt_at, model.id)
        .limit(limit)
    ).all()
    session.commit()
    return [(int(i), str(state), float(at)) for i, state, at in rows]


Message = TypeVar("Message", JobNotifyDelivery, PageNotification)


def claim_message(
    session: Session, model: type[Message], seen: tuple[int, str, float], now: float, **also: object
) -> Message | None:
    """Claim one message read by `due_messages` by compare-and-set on the state and due time read:
    the pass whose UPDATE matches sends it; another server's overlapping pass matches no row and
    skips it. The claim is a lease: `sending` until now + SENDING_RETRY_S, when another pass may
    take it if this one died; `also`: more columns the claim sets (a page's `claimed_by`).
    Committed; None: lost."""
    # the two kinds named: the static check of state writes (test_lifecycle_owner) sees that
    # this `state` is a message's, not a job's or a node's
    table: type[JobNotifyDelivery] | type[PageNotification] = model
    message_id, state, due_at = seen
    claimed = session.execute(
        update(table)
        .where(table.id == message_id, table.state == state, table.next_attempt_at == due_at)
        .values(state="sending", next_attempt_at=now + SENDING_RETRY_S, attempts=table.attempts + 1, **also)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        return None
    return session.get(model, message_id, populate_existing=True)  # as the UPDATE left it
