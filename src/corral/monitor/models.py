"""Monitoring's tables, on the one shared `Base` (migration 0002_monitor).

Times are unix seconds as floats, like the core tables.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class GpuReading(Base):
    """The latest sample of one GPU from its provider (NVML or virtual). /metrics renders these
    rows, so a scrape is one consistent read of the database, never a slow NVML call."""

    __tablename__ = "gpu_readings"

    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128), default="")
    present: Mapped[bool] = mapped_column(Boolean, default=True)  # False: fell off the bus
    utilization_percent: Mapped[float] = mapped_column(Float, default=0.0)
    memory_used_mib: Mapped[float] = mapped_column(Float, default=0.0)
    memory_total_mib: Mapped[float] = mapped_column(Float, default=0.0)
    temperature_c: Mapped[float] = mapped_column(Float, default=0.0)
    power_w: Mapped[float] = mapped_column(Float, default=0.0)
    ecc_volatile_corrected: Mapped[int] = mapped_column(Integer, default=0)
    ecc_volatile_uncorrected: Mapped[int] = mapped_column(Integer, default=0)
    ecc_aggregate_corrected: Mapped[int] = mapped_column(Integer, default=0)
    ecc_aggregate_uncorrected: Mapped[int] = mapped_column(Integer, default=0)
    xid_events_total: Mapped[int] = mapped_column(Integer, default=0)
    last_xid: Mapped[int | None] = mapped_column(Integer)
    sampled_at: Mapped[float] = mapped_column(Float)


class Alert(Base):
    """One alert, deduplicated by fingerprint: a repeat delivery updates the row, never adds one."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    source: Mapped[str] = mapped_column(String(32))  # "alertmanager" | "corral" (health checks)
    name: Mapped[str] = mapped_column(String(128), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)  # "firing" | "resolved"
    severity: Mapped[str] = mapped_column(String(16), default="warning")
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    starts_at: Mapped[float] = mapped_column(Float)
    ends_at: Mapped[float | None] = mapped_column(Float)
    first_received_at: Mapped[float] = mapped_column(Float)
    last_received_at: Mapped[float] = mapped_column(Float)
    receive_count: Mapped[int] = mapped_column(Integer, default=1)
    generator_url: Mapped[str] = mapped_column(Text, default="")


class AlertNotification(Base):
    """One message owed to one channel about one alert change. Intake only inserts these rows;
    the delivery loop sends them with retries and backoff, so a broken channel never blocks intake."""

    __tablename__ = "alert_notifications"

    id: Mapped[int] = mapped_column(primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    channel: Mapped[str] = mapped_column(String(64), index=True)
    alert_status: Mapped[str] = mapped_column(String(16))  # the status being announced
    state: Mapped[str] = mapped_column(String(16), index=True)  # pending | sent | failing | given_up
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float | None] = mapped_column(Float)


class IdleGpuWatch(Base):
    """Idle-GPU policy progress for one running job: since when it has been idle, when its owner
    was warned, and when Corral acted (stop or requeue)."""

    __tablename__ = "idle_gpu_watch"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    idle_since: Mapped[float | None] = mapped_column(Float)
    warned_at: Mapped[float | None] = mapped_column(Float)
    acted_at: Mapped[float | None] = mapped_column(Float)


class MonitorState(Base):
    """Small key/value marks the health loop keeps between ticks (e.g. the last attempt scanned)."""

    __tablename__ = "monitor_state"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
