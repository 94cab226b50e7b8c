"""On-call, escalation and paging tables (corral.services.oncall, corral.services.paging).

- `contact_methods`: how a person is reached besides `users.email` (an email address, a generic
  JSON webhook, a Slack/Mattermost incoming webhook).
- `oncall_schedules` / `oncall_layers` / `oncall_overrides`: who is on call when. Layers rotate
  their ordered members daily or weekly at a wall-clock handoff in the schedule's IANA time zone;
  a later layer wins over an earlier one where it covers; an override wins over every layer.
- `escalation_policies`: ordered steps (notify the on-call of a schedule, or a user; wait), the
  whole list repeated `repeat` more times while nobody acknowledges.
- `pages` / `page_notifications`: one page per caller's key (idempotent), walked through its
  policy by the paging loop; each notification is a queued send to one person's one address.
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from corral.db.base import Base


class ContactMethod(Base):
    __tablename__ = "contact_methods"
    __table_args__ = (UniqueConstraint("user_id", "kind", "address"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # email | webhook | slack
    address: Mapped[str] = mapped_column(String(1024))  # an email address or an http(s) URL
    created_at: Mapped[float] = mapped_column(Float)


def new_feed_nonce() -> str:
    """A schedule's calendar-URL nonce (corral.services.oncall_feed): new at creation and at each
    rotation, so a URL signed with an earlier one is refused."""
    return secrets.token_hex(16)


class OncallSchedule(Base):
    __tablename__ = "oncall_schedules"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    time_zone: Mapped[str] = mapped_column(String(64))  # IANA name (zoneinfo)
    description: Mapped[str] = mapped_column(Text, default="")
    # Who is paged while no layer or override covers the time; None: the step finds nobody and
    # the escalation goes on to its next step at once (docs/operations.md, "Gaps").
    fallback_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    # In the HMAC of the calendar subscription URL: deleting the schedule (a new row, a new
    # nonce) or rotating it revokes every URL given out. Migration 0035_security_fixes.
    feed_nonce: Mapped[str] = mapped_column(String(32), default=new_feed_nonce)

    layers: Mapped[list[OncallLayer]] = relationship(
        back_populates="schedule", cascade="all, delete-orphan", order_by="OncallLayer.position"
    )
    overrides: Mapped[list[OncallOverride]] = relationship(
        back_populates="schedule", cascade="all, delete-orphan", order_by="OncallOverride.start"
    )


class OncallLayer(Base):
    __tablename__ = "oncall_layers"
    __table_args__ = (UniqueConstraint("schedule_id", "position"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("oncall_schedules.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)  # 0 = bottom; a higher layer wins where it covers
    name: Mapped[str] = mapped_column(String(64))
    rotation: Mapped[str] = mapped_column(String(8))  # daily | weekly
    start_date: Mapped[str] = mapped_column(String(10))  # YYYY-MM-DD: the first member's shift starts
    handoff: Mapped[str] = mapped_column(String(5))  # HH:MM local wall-clock time of each handoff
    members: Mapped[list[int]] = mapped_column(JSON)  # user ids, in rotation order
    # Optional daily window (local HH:MM, may wrap midnight) outside which the layer covers nothing.
    restrict_from: Mapped[str | None] = mapped_column(String(5))
    restrict_to: Mapped[str | None] = mapped_column(String(5))

    schedule: Mapped[OncallSchedule] = relationship(back_populates="layers")


class OncallOverride(Base):
    __tablename__ = "oncall_overrides"
    # SQLite: AUTOINCREMENT, so a removed override's id is never given again: overrides are
    # removed by id (`corral oncall schedule rm-override NAME ID`), and a retried removal must not
    # find another override under it. Migration 0025_row_ids. PostgreSQL never reuses ids.
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("oncall_schedules.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    start: Mapped[float] = mapped_column(Float)  # unix seconds
    end: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)

    schedule: Mapped[OncallSchedule] = relationship(back_populates="overrides")


class EscalationPolicy(Base):
    __tablename__ = "escalation_policies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    # [{"schedule_id": int} | {"user_id": int}, plus "wait_s": float]: notify, then wait.
    steps: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    repeat: Mapped[int] = mapped_column(Integer, default=0)  # extra rounds after the first
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class Page(Base):
    __tablename__ = "pages"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)  # the caller's idempotency key
    policy_name: Mapped[str] = mapped_column(String(64))
    # The policy's steps and repeat as they were at start: editing a policy never changes the
    # path of a page already under way.
    steps: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    repeat: Mapped[int] = mapped_column(Integer)
    subject: Mapped[str] = mapped_column(String(300))
    body: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), index=True)  # triggered|acknowledged|cancelled|exhausted
    step: Mapped[int] = mapped_column(Integer, default=0)  # the next step to run
    round: Mapped[int] = mapped_column(Integer, default=0)  # 0 = first pass through the steps
    next_at: Mapped[float | None] = mapped_column(Float, index=True)  # when the loop acts next
    created_at: Mapped[float] = mapped_column(Float)
    acked_at: Mapped[float | None] = mapped_column(Float)
    acked_by: Mapped[str | None] = mapped_column(String(64))
    ended_at: Mapped[float | None] = mapped_column(Float)
    log: Mapped[list[str]] = mapped_column(JSON, default=list)  # what each step did, in order


class PageNotification(Base):
    __tablename__ = "page_notifications"
    __table_args__ = (UniqueConstraint("page_id", "round", "step", "user_id", "kind", "address"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("pages.id", ondelete="CASCADE"), index=True)
    round: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # email | webhook | slack
    address: Mapped[str] = mapped_column(String(1024))
    state: Mapped[str] = mapped_column(String(16), index=True)  # pending|failing|sent|given_up|skipped
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float | None] = mapped_column(Float)
    # The server process (lease owner id) whose claim it is while `sending` (corral.monitor.pager);
    # its claim expires at next_attempt_at. Migration 0038.
    claimed_by: Mapped[str | None] = mapped_column(String(64))
