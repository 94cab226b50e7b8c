"""Metrics derived from the database, rendered at scrape time from one read of the state.

`read_families(session, now)` reads nodes, GPUs (+ latest readings and who holds them), jobs,
queues and quotas and returns `Family` objects. Two renderers share them:
- `render_text(families)`: a fast Prometheus text writer (label sets built once per GPU and
  reused by every GPU family), used by `/metrics`; 8,000 GPUs stay well under 200 ms;
- `DbStateCollector`: a regular prometheus-client Collector over the same families, for anyone
  who wants them in a `CollectorRegistry`.
Names and labels are documented in docs/metrics.md and are a stable interface (rules, dashboards).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from corral.datasets.quotas import metric_samples
from corral.db.models import Attempt, GpuClaim, Group, GroupQuota, Job, Node
from corral.db.models import Gpu as GpuRow
from corral.db.workspace_models import Workspace
from corral.monitor.channels import failing_channels
from corral.monitor.models import Alert, AlertNotification
from corral.services.incidents import open_counts
from corral.services.lifecycle import GpuHealth

MIB = 1 << 20
NODE_STATES = ("ready", "cordoned", "draining", "down", "unknown")
JOB_STATES = ("queued", "scheduled", "starting", "running", "preempted", "succeeded", "failed", "cancelled")
ACTIVE_ATTEMPT_STATES = ("scheduled", "starting", "running")
GPU_LABELS = ("node", "gpu", "model", "job_id", "user", "group")


@dataclass
class Family:
    """One metric family with its samples already rendered as exposition lines."""

    name: str  # full sample name (counters include _total)
    kind: str  # "gauge" | "counter"
    help: str
    lines: list[str] = field(default_factory=list)

    def add(self, labels: str, value: float) -> None:
        """`labels` is the rendered label set (see `label_text`), without braces."""
        self.lines.append(f"{self.name}{{{labels}}} {format_value(value)}\n")


@dataclass
class GpuCounts:
    total: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    allocated: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unusable: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # free but unhealthy
    oldest_sample: dict[str, float] = field(default_factory=dict)


def read_families(session: Session, now: float, state_dir: Path | None = None) -> list[Family]:
    """Everything in one transaction so the numbers agree with each other."""
    counts = GpuCounts()
    families = _gpu_families(session, now, counts)
    families += _node_families(session, now, _allocated_by_node(session), counts)
    families += _job_families(session, now)
    families += _quota_families(session)
    families += _alert_families(session)
    families += _incident_families(session, now)
    families += _storage_families(session)
    families += _risk_families(session)
    families += _workspace_families(session)
    if state_dir is not None:
        families += _disk_families(state_dir)
    return families


_GPU_QUERY = text(
    """
    SELECT g.node_name, g."index", g.uuid, g.model, g.memory_mib, g.healthy, g.health,
           r.present, r.utilization_percent, r.memory_used_mib, r.memory_total_mib, r.temperature_c,
           r.power_w,
           r.ecc_volatile_corrected, r.ecc_volatile_uncorrected, r.ecc_aggregate_corrected,
           r.ecc_aggregate_uncorrected, r.xid_events_total, r.last_xid, r.sampled_at,
           c.job_id, u.name, gr.name
    FROM gpus g
    LEFT JOIN gpu_readings r ON r.node = g.node_name AND r.gpu_index = g."index"
    LEFT JOIN gpu_claims c ON c.node = g.node_name AND c.gpu_index = g."index"
    LEFT JOIN jobs j ON j.id = c.job_id
    LEFT JOIN users u ON u.id = j.user_id
    LEFT JOIN groups gr ON gr.id = j.group_id
    ORDER BY g.node_name, g."index"
    """
)


def _gpu_families(session: Session, now: float, counts: GpuCounts) -> list[Family]:
    """The hot path (one row per GPU, a dozen samples each): plain SQL rows, each GPU's label set
    rendered once and reused by every family."""
    f = _gpu_family_set()
    info, alloc, healthy_, present_, util_, used_, total_, temp_, power_, ecc_, xid_, last_xid_ = (
        fam.lines.append for fam in f
    )
    for row in session.execute(_GPU_QUERY):
        (node, index, uuid, model, mem_mib, reported_healthy, health, present, util, used, total, temp,
         power, vc, vu, ac, au, xids, last_xid, sampled_at, job_id, user, group) = row  # fmt: skip
        # What the scheduler may place on: the engine's flag and Corral's own verdict (a GPU
        # quarantined or lost stays out of placement until an admin returns it).
        healthy = reported_healthy and health == GpuHealth.HEALTHY.value
        base = f'node="{_esc(node)}",gpu="{index}",model="{_esc(model)}"'
        job = "" if job_id is None else job_id
        labels = f'{base},job_id="{job}",user="{_esc(user or "")}",group="{_esc(group or "")}"'
        info(f'corral_gpu_info{{{base},uuid="{_esc(uuid)}"}} 1\n')
        alloc(f"corral_gpu_allocated{{{labels}}} {0 if job_id is None else 1}\n")
        healthy_(f"corral_gpu_healthy{{{labels}}} {1 if healthy else 0}\n")
        counts.total[node] += 1
        if job_id is not None:
            counts.allocated[node] += 1
        elif not healthy:
            counts.unusable[node] += 1
        if sampled_at is None:
            continue  # never sampled yet: no readings rather than made-up zeros
        if sampled_at < counts.oldest_sample.get(node, now):
            counts.oldest_sample[node] = sampled_at
        present_(f"corral_gpu_present{{{labels}}} {1 if present else 0}\n")
        xid_(f"corral_gpu_xid_events_total{{{labels}}} {xids}\n")
        if last_xid is not None:
            last_xid_(f"corral_gpu_last_xid{{{labels}}} {last_xid}\n")
        ecc_(f'corral_gpu_ecc_errors{{{labels},counter="volatile",type="corrected"}} {vc}\n')
        ecc_(f'corral_gpu_ecc_errors{{{labels},counter="volatile",type="uncorrected"}} {vu}\n')
        ecc_(f'corral_gpu_ecc_errors{{{labels},counter="aggregate",type="corrected"}} {ac}\n')
        ecc_(f'corral_gpu_ecc_errors{{{labels},counter="aggregate",type="uncorrected"}} {au}\n')
        if not present:
            continue  # a lost GPU has no readings
        util_(f"corral_gpu_utilization_percent{{{labels}}} {float(util)!r}\n")
        used_(f"corral_gpu_memory_used_bytes{{{labels}}} {int(used * MIB)}\n")
        total_(f"corral_gpu_memory_total_bytes{{{labels}}} {int((total or mem_mib) * MIB)}\n")
        temp_(f"corral_gpu_temperature_celsius{{{labels}}} {float(temp)!r}\n")
        power_(f"corral_gpu_power_watts{{{labels}}} {float(power)!r}\n")
    return f


def _gpu_family_set() -> list[Family]:
    """In the order `_gpu_families` unpacks them."""
    return [
        Family("corral_gpu_info", "gauge", "One per GPU: its UUID and model."),
        Family("corral_gpu_allocated", "gauge", "1 when a job holds the GPU (job_id/user/group say who)."),
        Family("corral_gpu_healthy", "gauge", "1 when the scheduler may place work on the GPU."),
        Family("corral_gpu_present", "gauge", "1 when the GPU answers its provider; 0: it fell off the bus."),
        Family("corral_gpu_utilization_percent", "gauge", "GPU compute utilization, 0-100."),
        Family("corral_gpu_memory_used_bytes", "gauge", "GPU memory in use."),
        Family("corral_gpu_memory_total_bytes", "gauge", "GPU memory in total."),
        Family("corral_gpu_temperature_celsius", "gauge", "GPU core temperature."),
        Family("corral_gpu_power_watts", "gauge", "GPU power draw."),
        Family(
            "corral_gpu_ecc_errors",
            "gauge",
            "ECC error counts; counter=volatile resets with the GPU, counter=aggregate is lifetime.",
        ),
        Family("corral_gpu_xid_events_total", "counter", "Xid events seen on the GPU."),
        Family("corral_gpu_last_xid", "gauge", "Code of the most recent Xid event."),
    ]


def _allocated_by_node(session: Session) -> dict[str, tuple[float, float]]:
    """(cpus, memory MiB) placed on each node by attempts that hold resources."""
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    rows = session.execute(select(Attempt.placement).where(Attempt.state.in_(ACTIVE_ATTEMPT_STATES)))
    for (placement,) in rows:
        for inst in placement or ():
            acc = used[inst.node]
            acc[0] += inst.cpus
            acc[1] += inst.memory_mib
    return {k: (v[0], v[1]) for k, v in used.items()}


def _node_families(
    session: Session, now: float, alloc: dict[str, tuple[float, float]], gpus: GpuCounts
) -> list[Family]:
    fams = {
        "gpus": Family("corral_node_gpus", "gauge", "GPUs on the node."),
        "gpus_alloc": Family("corral_node_gpus_allocated", "gauge", "GPUs held by jobs."),
        "gpus_free": Family("corral_node_gpus_free", "gauge", "Healthy GPUs no job holds."),
        "cpus": Family("corral_node_cpus", "gauge", "CPUs on the node."),
        "cpus_alloc": Family("corral_node_cpus_allocated", "gauge", "CPUs placed on the node."),
        "cpus_free": Family("corral_node_cpus_free", "gauge", "CPUs not placed (never below 0)."),
        "mem": Family("corral_node_memory_bytes", "gauge", "Memory on the node."),
        "mem_alloc": Family("corral_node_memory_allocated_bytes", "gauge", "Memory placed on the node."),
        "mem_free": Family("corral_node_memory_free_bytes", "gauge", "Memory not placed (never below 0)."),
        "state": Family("corral_node_state", "gauge", "1 for the node's current state, 0 for the others."),
        "hb": Family(
            "corral_node_heartbeat_age_seconds", "gauge", "Seconds since the node's last heartbeat."
        ),
        "sample": Family(
            "corral_node_gpu_sample_age_seconds", "gauge", "Age of the oldest GPU reading on the node."
        ),
        "count": Family("corral_nodes", "gauge", "Nodes by state."),
    }
    by_state: dict[str, int] = dict.fromkeys(NODE_STATES, 0)
    for name, cpus, mem_mib, state, last_hb in session.execute(
        select(Node.name, Node.cpus, Node.memory_mib, Node.state, Node.last_heartbeat)
    ):
        key = f'node="{_esc(name)}"'
        cpu_used, mem_used = alloc.get(name, (0.0, 0.0))
        fams["gpus"].add(key, gpus.total[name])
        fams["gpus_alloc"].add(key, gpus.allocated[name])
        fams["gpus_free"].add(key, gpus.total[name] - gpus.allocated[name] - gpus.unusable[name])
        fams["cpus"].add(key, cpus)
        fams["cpus_alloc"].add(key, cpu_used)
        fams["cpus_free"].add(key, max(0.0, cpus - cpu_used))
        fams["mem"].add(key, mem_mib * MIB)
        fams["mem_alloc"].add(key, mem_used * MIB)
        fams["mem_free"].add(key, max(0.0, mem_mib - mem_used) * MIB)
        for s in NODE_STATES:
            fams["state"].add(f'{key},state="{s}"', 1 if s == state else 0)
        by_state[state] = by_state.get(state, 0) + 1
        if last_hb is not None:
            fams["hb"].add(key, max(0.0, now - last_hb))
        if name in gpus.oldest_sample:
            fams["sample"].add(key, max(0.0, now - gpus.oldest_sample[name]))
    for s, n in by_state.items():
        fams["count"].add(f'state="{_esc(s)}"', n)
    return list(fams.values())


def _job_families(session: Session, now: float) -> list[Family]:
    jobs = Family("corral_jobs", "gauge", "Jobs by state and group.")
    queue = Family("corral_queue_length", "gauge", "Jobs waiting (queued) per group.")
    oldest = Family(
        "corral_queue_oldest_wait_seconds", "gauge", "How long the group's oldest queued job has waited."
    )
    counts: dict[str, dict[str, int]] = {}
    for (gname,) in session.execute(select(Group.name)):
        counts[gname] = dict.fromkeys(JOB_STATES, 0)  # every group shows up, with zeros
    for gname, state, n in session.execute(
        select(Group.name, Job.state, func.count())
        .join(Group, Group.id == Job.group_id)
        .group_by(Group.name, Job.state)
    ):
        counts.setdefault(gname, dict.fromkeys(JOB_STATES, 0))[state] = n
    waiting = {
        gname: (n, first)
        for gname, n, first in session.execute(
            select(Group.name, func.count(), func.min(Job.submitted_at))
            .join(Group, Group.id == Job.group_id)
            .where(Job.state == "queued")
            .group_by(Group.name)
        )
    }
    for gname in sorted(counts):
        group = f'group="{_esc(gname)}"'
        for state, n in counts[gname].items():
            jobs.add(f'state="{_esc(state)}",{group}', n)
        n_waiting, first = waiting.get(gname, (0, None))
        queue.add(group, n_waiting)
        oldest.add(group, max(0.0, now - first) if first is not None else 0.0)
    return [jobs, queue, oldest]


def _quota_families(session: Session) -> list[Family]:
    used = Family("corral_group_gpus_used", "gauge", "GPUs the group's jobs hold, by GPU model.")
    guaranteed = Family(
        "corral_group_gpus_guaranteed", "gauge", "Guaranteed GPUs by model ('*': other models)."
    )
    limit = Family("corral_group_gpus_max", "gauge", "The group's GPU ceiling by model, where one is set.")
    quota_models: dict[str, set[str]] = defaultdict(set)
    for gname, model, guar, mx in session.execute(
        select(Group.name, GroupQuota.gpu_model, GroupQuota.guaranteed, GroupQuota.max)
        .join(Group, Group.id == GroupQuota.group_id)
        .order_by(Group.name, GroupQuota.gpu_model)
    ):
        quota_models[gname].add(model)
        guaranteed.add(_group_model(gname, model), guar)
        if mx is not None:
            limit.add(_group_model(gname, model), mx)
    used_by: dict[tuple[str, str], int] = defaultdict(int)
    for gname, models in quota_models.items():
        for model in models:
            used_by[(gname, model)] = 0  # a quota line with nothing used shows 0, not nothing
    for gname, model, n in session.execute(
        select(Group.name, GpuRow.model, func.count())
        .select_from(GpuClaim)
        .join(Job, Job.id == GpuClaim.job_id)
        .join(Group, Group.id == Job.group_id)
        .join(GpuRow, (GpuRow.node_name == GpuClaim.node) & (GpuRow.index == GpuClaim.gpu_index))
        .group_by(Group.name, GpuRow.model)
    ):
        # Models without their own quota line count against the group's "*" line, if it has one.
        models = quota_models.get(gname, set())
        used_by[(gname, model if model in models or "*" not in models else "*")] += n
    for (gname, model), n in sorted(used_by.items()):
        used.add(_group_model(gname, model), n)
    return [used, guaranteed, limit]


STORAGE_HELP = {
    "corral_storage_used_bytes": "Storage used: datasets, plus the last scan of home or group directories.",
    "corral_storage_used_files": "Files stored: datasets, plus the last scan of home or group directories.",
    "corral_storage_quota_bytes": "Storage quota in bytes, where one is set.",
    "corral_storage_quota_files": "Storage quota in files, where one is set.",
}


def _storage_families(session: Session) -> list[Family]:
    """Storage usage and quotas per user and group (corral.datasets.quotas)."""
    families = {name: Family(name, "gauge", text) for name, text in STORAGE_HELP.items()}
    for metric, scope, name, value in metric_samples(session):
        families[metric].add(f'scope="{_esc(scope)}",name="{_esc(name)}"', value)
    return list(families.values())


def _group_model(group: str, model: str) -> str:
    return f'group="{_esc(group)}",model="{_esc(model)}"'


def _incident_families(session: Session, now: float) -> list[Family]:
    by_state, breached = open_counts(session, now)
    open_ = Family("corral_incidents_open", "gauge", "Open incidents, by severity and state.")
    for (severity, state), n in sorted(by_state.items()):
        open_.add(f'severity="{severity}",state="{state}"', n)
    help_text = "Open incidents past their time-to-ack or time-to-mitigate SLA."
    past = Family("corral_incident_sla_breached", "gauge", help_text)
    for (severity, sla), n in sorted(breached.items()):
        past.add(f'severity="{severity}",sla="{sla}"', n)
    return [open_, past]


def _alert_families(session: Session) -> list[Family]:
    firing = Family("corral_alerts_firing", "gauge", "Alerts Corral holds as firing, by source and severity.")
    for source, severity, n in session.execute(
        select(Alert.source, Alert.severity, func.count())
        .where(Alert.status == "firing")
        .group_by(Alert.source, Alert.severity)
    ):
        firing.add(f'source="{_esc(source)}",severity="{_esc(severity)}"', n)
    backlog = Family(
        "corral_notifications_backlog", "gauge", "Notifications not delivered yet, by channel and state."
    )
    for channel, state, n in session.execute(
        select(AlertNotification.channel, AlertNotification.state, func.count())
        .where(AlertNotification.state.in_(("pending", "failing", "given_up")))
        .group_by(AlertNotification.channel, AlertNotification.state)
    ):
        backlog.add(f'channel="{_esc(channel)}",state="{_esc(state)}"', n)
    failing = Family(
        "corral_notification_channel_failing",
        "gauge",
        "1 while a channel's notifications are being retried or its last one was given up, else 0.",
    )
    failing_now = failing_channels(session)
    for (channel,) in session.execute(select(AlertNotification.channel).distinct()):
        failing.add(f'channel="{_esc(channel)}"', 1 if channel in failing_now else 0)
    return [firing, backlog, failing]


def _risk_families(session: Session) -> list[Family]:
    from corral.monitor.risk import risk_families  # it builds on this module's Family

    return risk_families(session)


def _disk_families(state_dir: Path) -> list[Family]:
    size = Family(
        "corral_state_dir_size_bytes", "gauge", "Size of the filesystem holding Corral's state directory."
    )
    free = Family(
        "corral_state_dir_free_bytes", "gauge", "Free bytes on the filesystem of Corral's state directory."
    )
    try:
        usage = psutil.disk_usage(str(state_dir))
    except OSError:
        return [size, free]
    path = f'path="{_esc(str(state_dir))}"'
    size.add(path, usage.total)
    free.add(path, usage.free)
    return [size, free]


# ---------------------------------------------------------------- rendering


def _esc(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def render_text(families: Iterable[Family]) -> str:
    """Prometheus text exposition format 0.0.4."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {fam.help}\n# TYPE {fam.name} {fam.kind}\n")
        out.extend(fam.lines)
    return "".join(out)


class DbStateCollector(Collector):
    """A prometheus-client Collector over the database state, for use in a `CollectorRegistry`.
    It parses the same exposition /metrics serves, so both always agree (slower; /metrics does not
    go through it)."""

    def __init__(self, session_factory: Callable[[], Session], state_dir: Path | None = None) -> None:
        self._session_factory = session_factory
        self._state_dir = state_dir

    def collect(self) -> Iterator[Metric]:
        with self._session_factory() as session:
            families = read_families(session, time.time(), self._state_dir)
        yield from text_string_to_metric_families(render_text(families))


def _workspace_families(session: Session) -> list[Family]:
    """GPU-hours that idle workspaces had held unused when the idle policy stopped them
    (corral.monitor.idle), per group; a removed workspace takes its share with it."""
    reclaimed = Family(
        "corral_workspace_gpu_hours_reclaimed_total",
        "counter",
        "GPU-hours idle workspaces had held unused when the idle policy stopped them",
    )
    # Every group, 0 when it has no workspace: a counter is exported from zero (the dashboard's
    # line and rate() need a series before the first reclaim, not only after it).
    rows = session.execute(
        select(Group.name, func.sum(Workspace.reclaimed_gpu_hours))
        .outerjoin(Workspace, Workspace.group_id == Group.id)
        .group_by(Group.name)
    )
    for group, hours in rows:
        reclaimed.add(f'group="{_esc(group)}"', float(hours or 0.0))
    return [reclaimed]
