"""Monitoring's background loops, collected by the server runner (corral.server.runner):
GPU sampling + GPU health, node/OOM health, notification delivery, idle-GPU policy, incidents
(SLA breaches, the end of flapping after its quiet period, and stops the remediation rules
asked for that were not delivered yet).
Intervals come from CORRAL_MONITOR_* (MonitorSettings), read when this module is imported."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from sqlalchemy.orm import Session

from corral.engine.base import EngineUnavailable
from corral.monitor.anomaly import AnomalyDetector
from corral.monitor.channels import deliver_due
from corral.monitor.config import MonitorConfig, MonitorConfigSource, MonitorSettings, config_path
from corral.monitor.gpu import GpuSample, GpuSampler
from corral.monitor.health import check_nodes, check_ooms, sample_and_check_gpus
from corral.monitor.idle import enforce_idle_policy
from corral.monitor.risk import detector_config, update_risk
from corral.server.context import BackgroundLoop, ServerContext
from corral.services import incidents, remediation
from corral.services.open_sessions import CHECK_INTERVAL_S as OPEN_SESSIONS_INTERVAL_S
from corral.services.session_use import persisted_use
from corral.workspaces.activity import last_activity

log = logging.getLogger("corral.monitor.loops")


def config_source(ctx: ServerContext) -> MonitorConfigSource:
    """The server's one monitor config source, shared by the loops and the HTTP routes
    (corral.monitor.api) so that both see an edit of monitor.yml at the same time."""
    source = ctx.memory.monitor_config
    if source is None:
        source = ctx.memory.monitor_config = MonitorConfigSource(config_path(ctx.settings))
    return source


def monitor_config(ctx: ServerContext) -> MonitorConfig:
    """The monitor config, reloaded when its file changes; a bad edit keeps the last good one
    (start-up refuses a bad file outright, see corral.server.run and corral.monitor.api)."""
    return config_source(ctx).current()


def channel_names(ctx: ServerContext) -> list[str]:
    """Channels that hear about Corral's own health alerts (none when `health.notify` is false)."""
    config = monitor_config(ctx)
    return [c.name for c in config.channels] if config.health.notify else []


def gpu_tick(ctx: ServerContext, now: float) -> None:
    sampler = ctx.memory.gpu_sampler
    if sampler is None:
        sampler = ctx.memory.gpu_sampler = GpuSampler(ctx.settings.home, ctx.settings.node_name)
    with ctx.session_factory() as session:
        samples = sample_and_check_gpus(session, sampler, now, channel_names(ctx), monitor_config(ctx).health)
        send_stops(ctx, remediation.take_stops(session))  # committed by the check
        _score_risk(ctx, session, samples, now)
    ctx.wake("monitor-delivery")


def _score_risk(ctx: ServerContext, session: Session, samples: list[GpuSample], now: float) -> None:
    """The anomaly detector sees every sampling pass; a failure here never stops the sampling."""
    wanted = detector_config(monitor_config(ctx).anomaly)
    detector = ctx.memory.anomaly_detector
    if detector is None or detector.config != wanted:  # first pass, or monitor.yml changed
        detector = ctx.memory.anomaly_detector = AnomalyDetector(wanted)
    try:
        update_risk(session, detector, samples, now)
        session.commit()
    except Exception:
        session.rollback()
        log.exception("anomaly scoring failed; GPU readings and health checks are unaffected")


def health_tick(ctx: ServerContext, now: float) -> None:
    rules = monitor_config(ctx).health
    with ctx.session_factory() as session:
        check_nodes(session, now, channel_names(ctx), rules)
        check_ooms(session, now, channel_names(ctx), rules)
        send_stops(ctx, remediation.take_stops(session))
    ctx.wake("monitor-delivery")


def delivery_tick(ctx: ServerContext, now: float) -> None:
    deliver_due(ctx.session_factory, monitor_config(ctx), now)


def workspace_use(ctx: ServerContext, job_ids: Sequence[int], now: float) -> Mapping[int, float]:
    """{workspace job id: when last used}, the latest of: its sessions (SSH gateway, exec,
    port-forward) through this server (now while one is open, else the last close) and through
    any server (as persisted, corral.services.session_use), and its JupyterLab's last activity
    (asked only of those with no session open here)."""
    wanted = set(job_ids)
    here = ctx.memory.session_use.last_use(now) if ctx.memory.session_use is not None else {}
    with ctx.session_factory() as session:
        used = dict(persisted_use(session, job_ids))
    for job_id, at in here.items():
        if job_id in wanted:
            used[job_id] = max(at, used.get(job_id, at))
    rest = [job_id for job_id in job_ids if used.get(job_id) != now]
    jupyter = last_activity(ctx.session_factory, ctx.engine, rest, now) if rest else {}
    for job_id, at in jupyter.items():
        used[job_id] = max(at, used.get(job_id, at))
    return used


def session_use_tick(ctx: ServerContext, now: float) -> None:
    """Every server writes the last uses of its sessions to their workspaces (not a singleton)."""
    if ctx.memory.session_use is not None:
        with ctx.session_factory() as session:
            ctx.memory.session_use.persist(session, now)


def open_sessions_tick(ctx: ServerContext, now: float) -> None:
    """Every server ends the sessions it holds whose credential or user lost access (not a
    singleton: each checks its own; woken at once by a change committed in this process)."""
    if ctx.memory.open_sessions:  # None or no session open: nothing to read
        with ctx.session_factory() as session:
            ctx.memory.open_sessions.check(session, now)


def idle_tick(ctx: ServerContext, now: float) -> None:
    def activity(job_ids: Sequence[int]) -> Mapping[int, float]:
        return workspace_use(ctx, job_ids, now)

    with ctx.session_factory() as session:
        rule = monitor_config(ctx).idle_gpu
        done = enforce_idle_policy(
            session, now, rule, channel_names(ctx), activity, local_node=ctx.settings.node_name
        )
    for job_id, what in done:
        log.info("idle GPU policy: job %s %s", job_id, what)
    if done:
        ctx.wake("reconcile", "monitor-delivery")


def send_stops(ctx: ServerContext, stops: list[tuple[str, float]]) -> None:
    """Stop the attempts remediation rules requeued (after the commit that records why)."""
    for attempt_id, grace in stops:
        try:
            ctx.engine.stop(attempt_id, grace)
        except EngineUnavailable as exc:
            log.warning("could not stop %s: %s", attempt_id, exc)
    if stops:
        ctx.wake("reconcile")


# Stops the rules asked for in another process (e.g. the API's webhook) or that failed: re-sent
# when the attempt still runs this long after its fault was recorded.
STOP_RETRY_AFTER_S = 5.0
STOP_RESEND_EVERY_S = 60.0
_RESENT: dict[str, float] = {}  # attempt id -> when this process last re-sent its stop


def incident_tick(ctx: ServerContext, now: float) -> None:
    with ctx.session_factory() as session:
        breaches = incidents.check_slas(session, now)
        flap = remediation.active_rules(session)[1].incidents.flap_policy()
        calmed = incidents.end_quiet_flapping(session, now, flap)
        session.commit()
        pending = remediation.faulted_live_attempts(session, now - 3600.0, now - STOP_RETRY_AFTER_S)
        session.rollback()
    for incident_id, which in breaches:
        log.warning("incident %s: %s SLA breached", incident_id, which)
    for incident_id in calmed:
        log.info("incident %s stopped flapping", incident_id)
    kept = {a: t for a, t in _RESENT.items() if a in pending}  # only those still pending
    due = [a for a in pending if now - kept.get(a, 0.0) >= STOP_RESEND_EVERY_S]
    kept.update(dict.fromkeys(due, now))
    _RESENT.clear()
    _RESENT.update(kept)
    send_stops(ctx, [(attempt_id, 0.0) for attempt_id in due])


INCIDENT_INTERVAL_S = 5.0
SESSION_USE_INTERVAL_S = 30.0  # how stale another server's view of this one's sessions may be


def _loops() -> list[BackgroundLoop]:
    settings = MonitorSettings()
    return [
        BackgroundLoop("monitor-gpus", settings.sample_interval_s, gpu_tick),
        BackgroundLoop("monitor-health", settings.health_interval_s, health_tick),
        BackgroundLoop("monitor-delivery", settings.delivery_interval_s, delivery_tick),
        BackgroundLoop("monitor-idle", settings.idle_interval_s, idle_tick),
        BackgroundLoop("incidents", INCIDENT_INTERVAL_S, incident_tick),
        BackgroundLoop("session-use", SESSION_USE_INTERVAL_S, session_use_tick, singleton=False),
        BackgroundLoop("open-sessions", OPEN_SESSIONS_INTERVAL_S, open_sessions_tick, singleton=False),
    ]


LOOPS: list[BackgroundLoop] = _loops()
