"""What-if on the live cluster: the export of `GET /admin/sim-export` as a Trace and a ClusterSpec,
quota changes applied to that cluster, and the per-group comparison of two replays (current
settings vs changed), which `corral sim --from-cluster` prints.

A quota change is `GROUP=GUARANTEED[:MAX]` or `GROUP@MODEL=GUARANTEED[:MAX]`, like
`corral group quota GROUP --gpus GUARANTEED --max MAX --model MODEL` on the live platform: it sets
the group's quota of that model (`*`, any model, by default) and leaves its other models alone;
MAX is the most GPUs of that model the group may hold, borrowing included (`none`: no limit;
left out: the current limit stays).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corral.scheduler.types import ANY_MODEL, Group
from corral.sim.cluster import ClusterError, ClusterSpec, parse_cluster
from corral.sim.metrics import job_arrays
from corral.sim.replay import SimResult
from corral.sim.trace import Trace, TraceError, trace_from_rows

QUOTA_RE = re.compile(
    r"^(?P<group>[^=@\s]+)(?:@(?P<model>[^=\s]+))?=(?P<guaranteed>\d+)(?::(?P<max>\d+|none))?$"
)
KEEP = "keep"  # MAX left out: the group's current limit of that model stays


class WhatIfError(ValueError):
    """A bad export, quota change or request; the message says what and how to fix it."""


@dataclass(frozen=True, slots=True)
class QuotaChange:
    group: str
    model: str  # ANY_MODEL or a GPU model
    guaranteed: int
    max: int | str | None  # a number, None (no limit) or KEEP

    def describe(self) -> str:
        limit = "" if self.max == KEEP else f" max {'none' if self.max is None else self.max}"
        model = "" if self.model == ANY_MODEL else f" of {self.model}"
        return f"{self.group}: guaranteed {self.guaranteed}{model}{limit}"


def parse_quota_change(text: str) -> QuotaChange:
    match = QUOTA_RE.match(text.strip())
    if not match:
        raise WhatIfError(
            f"--quota {text!r}: expected GROUP=GUARANTEED[:MAX] or GROUP@MODEL=GUARANTEED[:MAX] "
            "(whole GPUs; MAX 'none' = no limit), e.g. vision=16:32"
        )
    guaranteed = int(match["guaranteed"])
    raw_max = match["max"]
    limit: int | str | None = KEEP if raw_max is None else (None if raw_max == "none" else int(raw_max))
    if isinstance(limit, int) and limit < guaranteed:
        raise WhatIfError(f"--quota {text!r}: MAX {limit} is below the guarantee {guaranteed}")
    return QuotaChange(match["group"], match["model"] or ANY_MODEL, guaranteed, limit)


def _changed(group: Group, change: QuotaChange) -> Group:
    guaranteed = {**group.guaranteed, change.model: change.guaranteed}
    limits = dict(group.max or {})
    if change.max is None:
        limits.pop(change.model, None)
    elif isinstance(change.max, int):
        limits[change.model] = change.max
    return dataclasses.replace(group, guaranteed=guaranteed, max=limits or None)


def resolve_quota_changes(cluster: ClusterSpec, changes: Sequence[QuotaChange]) -> list[QuotaChange]:
    """The changes with GPU models spelled as the cluster spells them; an unknown group or GPU
    model is an error naming the ones there are."""
    groups = {g.name for g in cluster.groups}
    models = {p.gpu_model.lower(): p.gpu_model for p in cluster.pools if p.gpus_per_node}
    resolved = []
    for change in changes:
        if change.group not in groups:
            raise WhatIfError(
                f"--quota: unknown group {change.group!r}; the cluster's groups: {', '.join(sorted(groups))}"
            )
        if change.model != ANY_MODEL:
            if change.model.lower() not in models:
                raise WhatIfError(
                    f"--quota {change.group}@{change.model}: the cluster has no {change.model!r} GPUs; "
                    f"its models: {', '.join(sorted(models.values())) or 'none'}"
                )
            change = dataclasses.replace(change, model=models[change.model.lower()])
        resolved.append(change)
    return resolved


def apply_quota_changes(cluster: ClusterSpec, changes: Sequence[QuotaChange]) -> ClusterSpec:
    """The cluster with the groups' quotas changed (`resolve_quota_changes` checks them first)."""
    groups = {g.name: g for g in cluster.groups}
    for change in resolve_quota_changes(cluster, changes):
        groups[change.group] = _changed(groups[change.group], change)
    return dataclasses.replace(cluster, groups=tuple(groups.values()), name=f"{cluster.name}-changed")


def from_export(export: Mapping[str, Any]) -> tuple[Trace, ClusterSpec]:
    """The export's jobs as a Trace and its cluster as a ClusterSpec (the checks of files)."""
    jobs = export.get("jobs") or []
    if not jobs:
        raise WhatIfError(
            f"no finished jobs since {utc_time(export.get('since'))}: nothing to replay "
            "(try a longer --since, or --unfinished to include running and waiting jobs)"
        )
    cluster_data = export.get("cluster") or {}
    if not cluster_data.get("pools"):
        raise WhatIfError("the cluster has no nodes registered: nothing to replay the jobs on")
    try:
        return trace_from_rows("live", jobs), parse_cluster(cluster_data, "live")
    except (TraceError, ClusterError) as exc:
        raise WhatIfError(f"the export cannot be replayed: {exc}")


def utc_time(stamp: Any) -> str:
    """A unix time as UTC text (the window's start in messages)."""
    import time

    if not isinstance(stamp, int | float):
        return "the start of the window"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def _group_figures(result: SimResult) -> dict[str, dict[str, float]]:
    arrays = job_arrays(result)
    out: dict[str, dict[str, float]] = {}
    for group in sorted(set(arrays["group"].tolist())):
        mask = arrays["group"] == group
        queue, jct = arrays["queue"][mask], arrays["jct"][mask]
        out[group] = {
            "jobs": float(mask.sum()),
            "avg_queue_s": float(queue.mean()),
            "p99_queue_s": float(np.percentile(queue, 99)),
            "avg_jct_s": float(jct.mean()),
        }
    rejected: dict[str, int] = {}
    for job, _why in result.rejected:
        rejected[job.group] = rejected.get(job.group, 0) + 1
    for group, count in rejected.items():
        out.setdefault(group, {"jobs": 0.0})  # every job of it rejected: no figures
        out[group]["rejected"] = float(count)
    return out


def _observed(export: Mapping[str, Any]) -> dict[str, float]:
    """Average wait per group as it happened live (every wait; from the export)."""
    waits: dict[str, list[float]] = {}
    for job in export.get("jobs") or []:
        waits.setdefault(str(job["group"]), []).append(float(job.get("wait_s") or 0.0))
    return {g: sum(w) / len(w) for g, w in waits.items()}


def compare_groups(
    current: SimResult, changed: SimResult, export: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per group: jobs, avg and p99 queueing and avg JCT under the current settings and
    the changed ones, with the change (changed - current); `live_avg_queue_s` what was observed.
    A group whose quotas reject a different number of its jobs in the two replays has no change
    (None): its figures cover different jobs (4 of 5 rejected showed as a shorter, green wait)."""
    now, then = _group_figures(current), _group_figures(changed)
    observed = _observed(export or {})
    rows = []
    for group in sorted(set(now) | set(then)):
        a = now.get(group, {})
        b = then.get(group, {})
        # the group's jobs in the trace: those replayed and those its quotas refused (the same in
        # both replays; taking the replayed ones alone said 0 for a group the current quota refused)
        replayed = a if a else b
        jobs = int(replayed.get("jobs", 0) + replayed.get("rejected", 0))
        row: dict[str, Any] = {"group": group, "jobs": jobs}
        same_jobs = a.get("rejected", 0) == b.get("rejected", 0)
        for key in ("avg_queue_s", "p99_queue_s", "avg_jct_s"):
            row[f"{key}_current"] = a.get(key)
            row[f"{key}_changed"] = b.get(key)
            row[f"{key}_delta"] = b[key] - a[key] if key in a and key in b and same_jobs else None
        row["rejected_current"] = int(a.get("rejected", 0))
        row["rejected_changed"] = int(b.get("rejected", 0))
        row["live_avg_queue_s"] = observed.get(group)
        rows.append(row)
    return rows


def rejection_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line per group whose quotas reject a different number of its jobs under the changed
    settings than under the current ones: why its row shows no change."""
    return [
        f"{r['group']}: {r['rejected_changed']} of {r['jobs']} job{'' if r['jobs'] == 1 else 's'} "
        "rejected by the changed settings, "
        f"{r['rejected_current']} by the current ones: its figures cover different jobs, so no "
        "change is shown"
        for r in rows
        if r["rejected_current"] != r["rejected_changed"]
    ]
