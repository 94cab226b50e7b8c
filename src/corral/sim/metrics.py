"""Metrics of one replay: JCT, queueing, makespan, allocation, fragmentation, fairness, ETA accuracy.

Definitions (also in docs/simulator.md):
- JCT = completion - submit; queueing delay = first start - submit (re-queueing after a preemption
  shows in JCT and in `lost_work_gpu_h`, not in queueing delay).
- GPU allocation rate = allocated GPU-seconds / (cluster GPUs x makespan).
- Fragmentation: at sampled instants with jobs waiting, free GPUs on ready nodes that no waiting
  job's instance can use (too few free on that node, or the wrong model).
- Jain's fairness across groups over x_g = mean over the group's jobs of duration / JCT (the
  share of its life a job spends running; 1 = never waited). 1.0 = every group is served alike.
- ETA error: |first estimated_start the scheduler gave a waiting job - its actual first start|.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from corral.sim.replay import SimResult


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


def job_arrays(result: SimResult) -> dict[str, np.ndarray]:
    """Per finished job: submit, start, end, duration, jct, queue, gpus; plus group labels."""
    done = [j for j in result.jobs if not math.isnan(j.end)]
    submit = np.array([j.trace.submit_time for j in done], dtype=np.float64)
    start = np.array([j.first_start for j in done], dtype=np.float64)
    end = np.array([j.end for j in done], dtype=np.float64)
    return {
        "submit": submit,
        "start": start,
        "end": end,
        "duration": np.array([j.trace.duration for j in done], dtype=np.float64),
        "jct": end - submit,
        "queue": start - submit,
        "gpus": np.array([j.trace.num_gpus for j in done], dtype=np.float64),
        "group": np.array([j.trace.group for j in done], dtype=object),
    }


def per_group(result: SimResult) -> dict[str, dict[str, float]]:
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for j in result.jobs:
        if not math.isnan(j.end):
            rows[j.trace.group].append(
                (j.first_start - j.trace.submit_time, j.end - j.trace.submit_time, j.trace.duration)
            )
    out = {}
    for group, items in sorted(rows.items()):
        ratios = [d / jct if jct > 0 else 1.0 for _, jct, d in items]
        out[group] = {
            "jobs": float(len(items)),
            "avg_queue_s": sum(q for q, _, _ in items) / len(items),
            "avg_jct_s": sum(c for _, c, _ in items) / len(items),
            "run_share": sum(ratios) / len(ratios),
        }
    return out


def summarize(result: SimResult) -> dict[str, Any]:
    """The run's figures as a flat JSON-able dict (the `-o json` object)."""
    a = job_arrays(result)
    first_submit = min((j.trace.submit_time for j in result.jobs), default=0.0)
    last_end = float(a["end"].max()) if a["end"].size else first_submit
    makespan = last_end - first_submit
    groups = per_group(result)
    etas = [
        abs(j.eta - j.first_start)
        for j in result.jobs
        if not (math.isnan(j.eta) or math.isnan(j.first_start))
    ]
    waiting = [(free, unusable) for _, free, unusable in result.frag_samples]
    lost = sum(j.lost_work_s * j.trace.num_gpus for j in result.jobs)
    unfinished = [j.trace.job_id for j in result.jobs if math.isnan(j.end)]
    return {
        "trace": result.trace_name,
        "cluster": result.cluster_name,
        "policy": result.policy,
        "cluster_gpus": result.total_gpus,
        "jobs": int(a["jct"].size),
        "jobs_rejected": len(result.rejected),
        "jobs_unfinished": len(unfinished),
        "avg_jct_s": _stat(a["jct"], "avg"),
        "p50_jct_s": _stat(a["jct"], "p50"),
        "p99_jct_s": _stat(a["jct"], "p99"),
        "avg_queue_s": _stat(a["queue"], "avg"),
        "p50_queue_s": _stat(a["queue"], "p50"),
        "p99_queue_s": _stat(a["queue"], "p99"),
        "makespan_s": makespan,
        "gpu_alloc_rate": allocation_rate(result, first_submit, last_end),
        "frag_free_gpus_avg": float(np.mean([f for f, _ in waiting])) if waiting else 0.0,
        "frag_unusable_gpus_avg": float(np.mean([u for _, u in waiting])) if waiting else 0.0,
        "jain_fairness": jain_index([g["run_share"] for g in groups.values()]),
        "eta_median_abs_err_s": float(np.median(etas)) if etas else None,
        "eta_jobs": len(etas),
        "preemptions": result.preemptions,
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
