"""Metrics of one replay: JCT, queueing, makespan, allocation, fragmentation, fairness, ETA accuracy.

Definitions (also in docs/simulator.md):
- JCT = completion - submit; queueing delay = every wait in the queue (before the first start and
  after each stop); `first_queue` figures count only the wait before the first start. A job the
  replay never finished is censored at the replay's end (JCT and wait up to then) and counted in
  `jobs_censored`; rejected jobs (no node or no quota can ever hold them) are left out.
- GPU allocation rate = allocated GPU-seconds / (cluster GPUs x makespan); `gpu_alloc_arrivals`
  over the arrival window (first to last submit) only, where an overloaded cluster should be full.
- Fragmentation: at sampled instants with jobs waiting, free GPUs on ready nodes that no waiting
  job's instance can use (too few free on that node, or the wrong model).
- Jain's fairness across groups over x_g = mean over the group's jobs of duration / JCT (the
  share of its life a job spends running; 1 = never waited). 1.0 = every group is served alike.
  It hardly discriminates (every policy scores > 0.99 on real traces), so also: each group's
  slowdown = sum of its jobs' JCT / sum of their durations (1 = never waited), and the worst
  group's (`worst_group_slowdown`, the group named); and each guaranteed group's share held =
  GPU-seconds given within its guarantee / GPU-seconds owed (min(guarantee, what it asked for),
  over time); `worst_guarantee_held` (1.0 = every group got its share whenever it asked).
- ETA error: |first estimated_start shown for a waiting job (the roll's, calibrated by the replay's
  own past outcomes unless `SimConfig.eta_calibration` is off) - its actual first start|;
  `eta_rel_err_median`: the median of that / the actual wait over jobs that waited > 5 minutes
  and were shown an ETA; `eta_none_jobs`: jobs that waited that long but were shown none (held
  by their quota or user cap, which the diagnosis says instead of a time).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from corral.sim.replay import SimJob, SimResult

ETA_MIN_WAIT_S = 300.0  # the relative ETA error counts jobs that waited longer than this


def _stat(values: np.ndarray, what: str) -> float:
    if values.size == 0:
        return 0.0
    if what == "avg":
        return float(values.mean())
    return float(np.percentile(values, float(what[1:])))


def jain_index(values: list[float]) -> float:
    """(sum x)^2 / (n * sum x^2); 1.0 when all equal, 1/n when one gets everything."""
    if not values:
        return 1.0
    square_sum = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square_sum) if square_sum else 1.0


def allocation_rate(result: SimResult, start: float, end: float) -> float:
    if end <= start or not result.total_gpus:
        return 0.0
    t = np.frombuffer(result.alloc_t, dtype=np.float64)
    g = np.frombuffer(result.alloc_gpus, dtype=np.float64)
    if t.size == 0:
        return 0.0
    edges = np.clip(np.append(t, end), start, end)
    gpu_seconds = float(np.sum(g * np.diff(edges)))
    return gpu_seconds / (result.total_gpus * (end - start))


def _censored(job: SimJob, end: float) -> tuple[float, float, float]:
    """(end, every wait, wait before the first start) of a job; an unfinished one censored at
    `end` (still waiting: its wait runs to `end`)."""
    waited = job.waited_s
    if math.isnan(job.end) and not (job.queued_at < job.last_start):  # also never started (nan)
        waited += end - job.queued_at  # waiting when the replay ended
    first = (job.first_start if not math.isnan(job.first_start) else end) - job.trace.submit_time
    return (job.end if not math.isnan(job.end) else end), waited, first


def job_arrays(result: SimResult) -> dict[str, np.ndarray]:
    """Per job (unfinished ones censored at the replay's end): submit, end, duration, jct, queue
    (every wait), first_queue, gpus, finished; plus group labels."""
    jobs = result.jobs
    rows = [_censored(j, result.end_time) for j in jobs]
    submit = np.array([j.trace.submit_time for j in jobs], dtype=np.float64)
    end = np.array([r[0] for r in rows], dtype=np.float64)
    return {
        "submit": submit,
        "end": end,
        "duration": np.array([j.trace.duration for j in jobs], dtype=np.float64),
        "jct": end - submit,
        "queue": np.array([r[1] for r in rows], dtype=np.float64),
        "first_queue": np.array([r[2] for r in rows], dtype=np.float64),
        "gpus": np.array([j.trace.num_gpus for j in jobs], dtype=np.float64),
        "finished": np.array([not math.isnan(j.end) for j in jobs], dtype=bool),
        "group": np.array([j.trace.group for j in jobs], dtype=object),
    }


def per_group(result: SimResult) -> dict[str, dict[str, float]]:
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for j in result.jobs:
        end, waited, _ = _censored(j, result.end_time)
        rows[j.trace.group].append((waited, end - j.trace.submit_time, j.trace.duration))
    out = {}
    for group, items in sorted(rows.items()):
        ratios = [d / jct if jct > 0 else 1.0 for _, jct, d in items]
        work = sum(d for _, _, d in items)
        owed, given = result.guarantee_gpu_s.get(group, (0.0, 0.0))
        out[group] = {
            "jobs": float(len(items)),
            "avg_queue_s": sum(q for q, _, _ in items) / len(items),
            "avg_jct_s": sum(c for _, c, _ in items) / len(items),
            "run_share": sum(ratios) / len(ratios),
            "slowdown": sum(c for _, c, _ in items) / work if work > 0 else 1.0,
            "guarantee_held": given / owed if owed > 0 else 1.0,
        }
    return out


def eta_errors(result: SimResult) -> tuple[list[float], list[float], int]:
    """(|ETA - first start| of every job given an ETA, that / the wait for jobs that waited more
    than ETA_MIN_WAIT_S, how many jobs waited that long but were shown no ETA: held by a quota or
    cap, or past eta_limit; they are not in the relative error, so it is reported next to it)."""
    absolute, relative = [], []
    none = 0
    for j in result.jobs:
        if math.isnan(j.first_start):
            continue
        if math.isnan(j.eta):
            none += j.first_start - j.trace.submit_time > ETA_MIN_WAIT_S
            continue
        err = abs(j.eta - j.first_start)
        absolute.append(err)
        wait = j.first_start - j.trace.submit_time
        if wait > ETA_MIN_WAIT_S:
            relative.append(err / wait)
    return absolute, relative, none


def _group_extremes(groups: dict[str, dict[str, float]]) -> tuple[str | None, float, str | None, float]:
    """(group, slowdown) of the worst slowdown; (group, share) of the least guarantee held."""
    if not groups:
        return None, 1.0, None, 1.0
    slow = max(groups, key=lambda g: groups[g]["slowdown"])
    held = min(groups, key=lambda g: groups[g]["guarantee_held"])
    return slow, groups[slow]["slowdown"], held, groups[held]["guarantee_held"]


def summarize(result: SimResult) -> dict[str, Any]:
    """The run's figures as a flat JSON-able dict (the `-o json` object)."""
    a = job_arrays(result)
    first_submit = min((j.trace.submit_time for j in result.jobs), default=0.0)
    last_submit = max((j.trace.submit_time for j in result.jobs), default=0.0)
    last_end = float(a["end"].max()) if a["end"].size else first_submit
    makespan = last_end - first_submit
    groups = per_group(result)
    etas, relative, no_eta = eta_errors(result)
    waiting = [(free, unusable) for _, free, unusable in result.frag_samples]
    lost = sum(j.lost_work_s * j.trace.num_gpus for j in result.jobs)
    unfinished = [j.trace.job_id for j in result.jobs if math.isnan(j.end)]
    slow_group, slow, held_group, held = _group_extremes(groups)
    most_preempted = max((j.preemptions for j in result.jobs), default=0)
    return {
        "trace": result.trace_name,
        "cluster": result.cluster_name,
        "policy": result.policy,
        "cluster_gpus": result.total_gpus,
        "jobs": int(a["jct"].size),
        "jobs_finished": int(a["finished"].sum()),
        "jobs_rejected": len(result.rejected),
        "jobs_unfinished": len(unfinished),
        "jobs_censored": len(unfinished),
        "avg_jct_s": _stat(a["jct"], "avg"),
        "p50_jct_s": _stat(a["jct"], "p50"),
        "p99_jct_s": _stat(a["jct"], "p99"),
        "avg_queue_s": _stat(a["queue"], "avg"),
        "p50_queue_s": _stat(a["queue"], "p50"),
        "p99_queue_s": _stat(a["queue"], "p99"),
        "max_queue_s": _stat(a["queue"], "p100"),
        "avg_first_queue_s": _stat(a["first_queue"], "avg"),
        "p99_first_queue_s": _stat(a["first_queue"], "p99"),
        "makespan_s": makespan,
        "gpu_alloc_rate": allocation_rate(result, first_submit, last_end),
        "gpu_alloc_arrivals": allocation_rate(result, first_submit, last_submit),
        "frag_free_gpus_avg": float(np.mean([f for f, _ in waiting])) if waiting else 0.0,
        "frag_unusable_gpus_avg": float(np.mean([u for _, u in waiting])) if waiting else 0.0,
        "jain_fairness": jain_index([g["run_share"] for g in groups.values()]),
        "worst_group_slowdown": slow,
        "worst_slowdown_group": slow_group,
        "worst_guarantee_held": held,
        "worst_guarantee_group": held_group,
        "eta_median_abs_err_s": float(np.median(etas)) if etas else None,
        "eta_jobs": len(etas),
        "eta_rel_err_median": float(np.median(relative)) if relative else None,
        "eta_rel_jobs": len(relative),
        "eta_none_jobs": no_eta,  # waited > 5 min, shown no ETA at submit (held, or past eta_limit)
        "preemptions": result.preemptions,
        "max_preemptions_per_job": most_preempted,
        "lost_work_gpu_h": lost / 3600.0,
        "node_failures": result.node_failures,
        "cycles": result.cycles,
        "schedule_s": result.schedule_s,
        "diagnosis_s": result.diagnosis_s,
        "wall_s": result.wall_s,
        "per_group": groups,
        "rejected": [{"job_id": tj.job_id, "why": why} for tj, why in result.rejected[:20]],
        "unfinished": unfinished[:20],
        "notes": list(result.notes),
    }


def write_jobs_csv(result: SimResult, path: str | Path) -> int:
    """`--jobs-out`: one row per job event (submit, start, preempt, stop, finish, reject) with
    time, nodes:GPUs, GPU count and reason; needs SimConfig(record_events=True). Rows written."""
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("time", "job_id", "event", "nodes", "gpus", "reason"))
        for e in sorted(result.events, key=lambda e: e.time):
            writer.writerow((f"{e.time:.3f}", e.job_id, e.event, e.nodes, e.gpus, e.reason))
    return len(result.events)
