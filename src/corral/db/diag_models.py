"""Failure diagnosis's tables, on the one shared `Base` (migration 0006_diag).

- `attempt_diagnoses`: the exit-spec's verdict on each ended attempt (reason, category, message,
  fix), shown by `corral show`, the API and the portal;
- `attempt_faults`: what Corral itself saw happen to a running attempt before it ended (a GPU
  fault, a suspected hang that the policy acted on): an input of the exit-spec (`events`);
- `job_avoid`: per job, the nodes and GPUs its retries must avoid and when the next try may start
  (backoff); read into the scheduler's `Job.avoid`;
- `node_flags`: nodes flagged for failing jobs of many users (`corral node ls`, an alert);
- `hang_watches`: per running attempt, each rank's log progress and the hang/straggler verdict.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class AttemptDiagnosis(Base):
    __tablename__ = "attempt_diagnoses"

    attempt_pk: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    reason: Mapped[str] = mapped_column(String(32))
    category: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    fix: Mapped[str] = mapped_column(Text)
    evidence: Mapped[str] = mapped_column(Text, default="")  # the log line that decided
    node: Mapped[str] = mapped_column(String(128), default="")  # the failing rank's node
    user_name: Mapped[str] = mapped_column(String(64), default="")
    at: Mapped[float] = mapped_column(Float, index=True)


class AttemptFault(Base):
    __tablename__ = "attempt_faults"

    attempt_pk: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    event: Mapped[str] = mapped_column(String(32))  # an exit-spec event: gpu_error, gpu_lost, hang
    node: Mapped[str] = mapped_column(String(128), default="")
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[float] = mapped_column(Float)


class JobAvoid(Base):
    __tablename__ = "job_avoid"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    nodes: Mapped[list[str]] = mapped_column(JSON, default=list)
    gpus: Mapped[list[list[Any]]] = mapped_column(JSON, default=list)  # [[node, index], ...]
    not_before: Mapped[float | None] = mapped_column(Float)  # retry backoff: not placed earlier


class NodeFlag(Base):
    __tablename__ = "node_flags"

    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    flag: Mapped[str] = mapped_column(String(32))  # "failing_jobs"
    detail: Mapped[str] = mapped_column(Text, default="")
    since: Mapped[float] = mapped_column(Float)
    active: Mapped[bool] = mapped_column(Boolean, default=True)


class HangWatch(Base):
    __tablename__ = "hang_watches"

    attempt_pk: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    # rank -> [log bytes, unix time the log last grew]
    ranks: Mapped[dict[str, list[float]]] = mapped_column(JSON, default=dict)
    idle_since: Mapped[float | None] = mapped_column(Float)  # GPUs near 0 % since
    suspected_at: Mapped[float | None] = mapped_column(Float)
    suspect: Mapped[str] = mapped_column(Text, default="")  # "rank 1 on node-a: ..."
    stragglers: Mapped[str] = mapped_column(Text, default="")  # the straggler report, one line
    acted: Mapped[str] = mapped_column(String(16), default="")  # notify | kill | requeue, once done
