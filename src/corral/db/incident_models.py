"""Incidents and remediation rules (corral.services.incidents, corral.services.remediation),
on the one shared `Base` (migration 0015_incidents). Times are unix seconds as floats."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base

_FLAPPING = text("flapping_since IS NOT NULL")


class Incident(Base):
    """One fault, however many alerts and repeats it produced: alerts and events with the same
    `fingerprint` (the rule's grouping key) join the open incident instead of opening another."""

    __tablename__ = "incidents"
    __table_args__ = (
        # the incidents loop's flapping pass reads only these, every 5 s (migration 0031)
        Index("ix_incidents_flapping", "fingerprint", postgresql_where=_FLAPPING, sqlite_where=_FLAPPING),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(255), index=True)
    title: Mapped[str] = mapped_column(String(512))
    severity: Mapped[str] = mapped_column(String(8))  # SEV1 (worst) .. SEV4
    state: Mapped[str] = mapped_column(
        String(16), index=True
    )  # triggered|acknowledged|mitigated|resolved|closed
    source: Mapped[str] = mapped_column(String(64))  # "rule:<name>", "alertmanager", "manual", ...
    owner: Mapped[str] = mapped_column(String(64), default="")
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    links: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # nodes/gpus/jobs/groups: [..]
    firing: Mapped[list[str]] = mapped_column(JSON, default=list)  # fingerprints of its firing alerts
    fire_count: Mapped[int] = mapped_column(Integer, default=1)
    opened_at: Mapped[float] = mapped_column(Float, index=True)
    last_fired_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    acknowledged_at: Mapped[float | None] = mapped_column(Float)
    acknowledged_by: Mapped[str] = mapped_column(String(64), default="")
    mitigated_at: Mapped[float | None] = mapped_column(Float)
    resolved_at: Mapped[float | None] = mapped_column(Float)
    closed_at: Mapped[float | None] = mapped_column(Float)
    ack_breached: Mapped[bool] = mapped_column(Boolean, default=False)
    mitigate_breached: Mapped[bool] = mapped_column(Boolean, default=False)
    # When it began flapping (reopened too often, services.incident_flapping.FlapPolicy); None: it is not.
    flapping_since: Mapped[float | None] = mapped_column(Float)


class IncidentEvent(Base):
    """One line of an incident's timeline: alert fired/resolved, remedy run, acked, comment, ..."""

    __tablename__ = "incident_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(64), default="")
    text: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Postmortem(Base):
    """The write-up that closing a SEV1 or SEV2 incident requires."""

    __tablename__ = "incident_postmortems"

    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"), primary_key=True)
    summary: Mapped[str] = mapped_column(Text)
    impact: Mapped[str] = mapped_column(Text)
    root_cause: Mapped[str] = mapped_column(Text)
    action_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)  # what, owner, due
    author: Mapped[str] = mapped_column(String(64))
    written_at: Mapped[float] = mapped_column(Float)


class RuleSetVersion(Base):
    """One applied version of the remediation rules file; the highest version is the active one."""

    __tablename__ = "remediation_rule_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    text: Mapped[str] = mapped_column(Text)
    author: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class RemediationRun(Base):
    """One rule matching one alert or event, and what its actions did (or, dry-run, would have
    done). `removed`: nodes and GPUs it took out of service, for the blast-radius guard."""

    __tablename__ = "remediation_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    rule: Mapped[str] = mapped_column(String(64), index=True)
    rules_version: Mapped[int] = mapped_column(Integer)
    signal: Mapped[str] = mapped_column(String(128))
    at: Mapped[float] = mapped_column(Float, index=True)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    outcome: Mapped[str] = mapped_column(String(16))  # ran | dry_run | rate_limited | guarded
    actions: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    removed_nodes: Mapped[int] = mapped_column(Integer, default=0)
    removed_gpus: Mapped[int] = mapped_column(Integer, default=0)
    incident_id: Mapped[int | None] = mapped_column(Integer)
