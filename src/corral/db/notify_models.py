"""Job notification tables (corral.services.job_notify, corral.monitor.job_notifier).

- `job_notifications`: the outbox. One row per job event its owner asked to hear of (the spec's
  `notify`), inserted by corral.services.lifecycle in the transaction of the compare-and-set that
  moves the job, so a crash loses none and a lost race writes none. The notification loop groups
  a user's pending rows into one message (`digest_id`: the smallest row id of the group).
- `job_notify_deliveries`: one message of a group to one of the owner's contacts, sent, retried
  with backoff and given up like a page's notifications.
- `job_notify_defaults`: a user's own `notify` for the jobs they submit without one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class JobNotification(Base):
    __tablename__ = "job_notifications"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(16))  # started | succeeded | failed | cancelled | requeued
    attempt: Mapped[int] = mapped_column(Integer)  # the job's attempt count when it happened
    at: Mapped[float] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")  # the transition's words (the reason)
    # pending (not yet in a message) | grouped (in the message digest_id) | no_contact (the owner
    # has no contact of the kinds asked for, or is deactivated) | failed (could not be grouped:
    # an unexpected error, set aside so that it holds back nothing; its job's events say so)
    state: Mapped[str] = mapped_column(String(16), index=True)
    digest_id: Mapped[int | None] = mapped_column(Integer, index=True)


class JobNotifyDelivery(Base):
    __tablename__ = "job_notify_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True)
    digest_id: Mapped[int] = mapped_column(Integer, index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # email | webhook | slack
    address: Mapped[str] = mapped_column(String(1024))
    subject: Mapped[str] = mapped_column(String(300))
    body: Mapped[str] = mapped_column(Text)  # the message's text, built once when it was grouped
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)  # a webhook's JSON body
    events: Mapped[int] = mapped_column(Integer)  # how many job events the message tells of
    state: Mapped[str] = mapped_column(String(16), index=True)  # pending|sending|failing|sent|given_up
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float | None] = mapped_column(Float)


class JobNotifyDefault(Base):
    __tablename__ = "job_notify_defaults"

    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    on: Mapped[list[str]] = mapped_column(JSON)  # corral.spec.NotifyV1's, as stored
    to: Mapped[list[str]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Float)
