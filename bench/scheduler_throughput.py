"""Scheduler throughput: placements per second of `corral.scheduler.Scheduler` at cluster scale.

Builds a heterogeneous cluster (5,000 nodes: 4,875 GPU nodes with 40,000 GPUs of five models,
some with NVLink topology groups, plus 125 CPU-only nodes), 10 groups with guaranteed quotas and
borrowing, and 100,000 queued jobs whose GPU counts and runtimes are drawn from the Philly trace
(jobs over 8 GPUs become gangs of 8-GPU instances; some carry a GPU-model constraint). Then it runs
scheduling cycles: apply each plan (start assigned jobs, stop preempted ones and requeue them),
advance the clock until about a quarter of the running jobs have finished, repeat until the queue
is drained or a cycle changes nothing.

Baseline, in the same run: the same rules with `Profile.use_index=False`, i.e. a plain scan of all
nodes for every job (filters, then scorers), measured on the first cycle of a 1,000-job queue
(the full run would take hours); the indexed path is timed on that same snapshot as well and
both plans are compared (they must be identical).

    python bench/scheduler_throughput.py [--jobs 100000] [--nodes-scale 1.0] [--profile default]

Times are CPU time of this process (`time.process_time`): the machine is shared, and one
scheduling cycle runs on one core. Prints placements/s, p50/p99 cycle time, peak memory, the
baseline and the ratio; the last line is
one JSON object. Target: >= 10,000 placements/s on one core.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

from corral.scheduler import (
    GPU,
    PROFILES,
    Group,
    Job,
    Node,
    Plan,
    Priority,
    Profile,
    Resources,
    RunningJob,
    Scheduler,
    Snapshot,
    TaskSpec,
)
from corral.scheduler.compiled_build import is_compiled

TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/philly/philly_jobs.csv"
# (model, GPUs per node, nodes, topology group size)
NODE_KINDS: tuple[tuple[str, int, int, int | None], ...] = (
    ("A100", 8, 2000, 4),
    ("V100M32", 16, 500, 8),
    ("V100M16", 8, 1250, None),
    ("K80", 4, 750, None),
    ("T4", 8, 375, None),
)
CPU_NODES = 125
CONSTRAINTS = [None] * 14 + ["A100"] * 3 + ["V100M16|V100M32"] * 2 + ["T4"]


def build_nodes(scale: float) -> tuple[Node, ...]:
    nodes: list[Node] = []
    for model, per_node, count, topo in NODE_KINDS:
        for k in range(max(1, int(count * scale))):
            name = f"{model.lower()}-{k:04d}"
            gpus = tuple(
                GPU(i, f"{name}-{i}", model, topology_group=None if topo is None else i // topo)
                for i in range(per_node)
            )
            nodes.append(Node(name, cpus=8.0 * per_node, memory_mib=64 * 1024 * per_node, gpus=gpus))
    for k in range(max(1, int(CPU_NODES * scale))):
        nodes.append(Node(f"cpu-{k:04d}", cpus=64.0, memory_mib=256 * 1024))
    return tuple(nodes)


def trace_sizes() -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    with TRACE.open() as fh:
        for row in csv.DictReader(fh):
            try:
                gpus, duration = int(row["num_gpus"]), float(row["duration"])
            except (TypeError, ValueError):
                continue
            if gpus > 0:
                out.append((gpus, max(duration, 1.0)))
    return out


def build_jobs(n: int, rng: random.Random) -> list[Job]:
    sizes = trace_sizes()
    jobs: list[Job] = []
    for k in range(n):
        gpus, duration = rng.choice(sizes)
        per, inst = (gpus, 1) if gpus <= 8 else ((8, gpus // 8) if gpus % 8 == 0 else (4, -(-gpus // 4)))
        model = rng.choice(CONSTRAINTS) if gpus <= 8 else None
        res = Resources(gpus=per, gpu_model=model, cpus=4.0 * per, memory_mib=16 * 1024 * per)
        g = k % 10
        jobs.append(
            Job(
                id=f"j{k:06d}",
                group=f"g{g}",
                user=f"u{g}-{rng.randrange(10)}",
                tasks=(TaskSpec("worker", inst, res),),
                priority=Priority(rng.choice((0, 1, 1, 1, 2))),
                submit_time=float(k),
                runtime_estimate=duration,
            )
        )
    if n:  # a few CPU-only jobs, too
        for k in range(0, n, 200):
            old = jobs[k]
            jobs[k] = dataclasses.replace(old, tasks=(TaskSpec("cpu", 1, Resources(gpus=0, cpus=8.0)),))
    return jobs


def build_groups(total_gpus: int) -> tuple[Group, ...]:
    share = total_gpus // 12  # guarantees cover ~83% of the cluster; the rest is borrowable
    return tuple(Group(f"g{g}", guaranteed={"*": share}, max=None, user_max_gpus=None) for g in range(10))


def apply(queued: dict[str, Job], running: dict[str, RunningJob], plan: Plan, now: float) -> None:
    for a in plan.assignments:
        job = queued.pop(a.job_id)
        running[a.job_id] = RunningJob(job, a.allocation, now, a.borrowed)
    for p in plan.preemptions:
        rj = running.pop(p.job_id, None)
        if rj is not None:
            queued[p.job_id] = rj.job


def advance(running: dict[str, RunningJob], now: float) -> float:
    """Finish the quarter of running jobs that end first; return the new time."""
    if not running:
        return now
    ends = sorted((rj.start_time + (rj.job.runtime_estimate or 0.0), jid) for jid, rj in running.items())
    cut = ends[max(0, len(ends) // 4 - 1)][0]
    for end, jid in ends:
        if end > cut:
            break
        del running[jid]
    return max(now, cut)


def run_cycles(
    nodes: tuple[Node, ...], groups: tuple[Group, ...], jobs: list[Job], profile: Profile, seed: int
) -> dict[str, float]:
    queued = {j.id: j for j in jobs}
    running: dict[str, RunningJob] = {}
    rng = random.Random(seed)
    scheduler = Scheduler(profile)  # one for the run, like the live loop: its caches serve each cycle
    now, placements, total_s = 0.0, 0, 0.0
    cycles: list[float] = []
    diag_s: list[float] = []
    while queued:
        snap = Snapshot(nodes, groups, tuple(queued.values()), tuple(running.values()))
        t0 = time.process_time()
        plan = scheduler.schedule(snap, now, rng)
        dt = time.process_time() - t0
        total_s += dt
        cycles.append(dt)
        t0 = time.process_time()
        len(plan.diagnoses)  # diagnoses are built on first access: time them on their own
        diag_s.append(time.process_time() - t0)
        placements += len(plan.assignments)
        apply(queued, running, plan, now)
        placed, stopped = len(plan.assignments), len(plan.preemptions)
        print(
            f"  cycle {len(cycles):3d}: {placed:6d} placed, {stopped:3d} preempted,"
            f" {len(queued):6d} waiting, {len(running):6d} running, {dt * 1000:8.1f} ms CPU",
            file=sys.stderr,
        )
        if not plan.assignments and not running:
            break  # stuck: nothing runs and nothing more can start
        now = advance(running, now)
    cycles.sort()
    return {
        "placements": placements,
        "seconds": total_s,
        "placements_per_s": placements / total_s if total_s else 0.0,
        "cycles": len(cycles),
        "cycle_p50_ms": statistics.median(cycles) * 1000 if cycles else 0.0,
        "cycle_p99_ms": cycles[min(len(cycles) - 1, int(len(cycles) * 0.99))] * 1000 if cycles else 0.0,
        "left_waiting": len(queued),
        "diagnosis_s": sum(diag_s),
        "diagnosis_p50_ms": statistics.median(diag_s) * 1000 if diag_s else 0.0,
        "placements_per_s_with_diagnosis": placements / (total_s + sum(diag_s)) if total_s else 0.0,
    }


def one_cycle(snap: Snapshot, profile: Profile, seed: int) -> tuple[Plan, float]:
    """One cycle's CPU time with the per-node tables already built (as in a running server: a
    Scheduler that has seen the nodes before), so that placement alone is timed."""
    scheduler = Scheduler(profile)
    scheduler.schedule(dataclasses.replace(snap, queued=(), running=()), 0.0, random.Random(seed))
    t0 = time.process_time()
    plan = scheduler.schedule(snap, 0.0, random.Random(seed))
    return plan, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes-scale", type=float, default=1.0)
    ap.add_argument("--baseline-jobs", type=int, default=1_000)
    ap.add_argument("--profile", default="default", choices=sorted(PROFILES))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    nodes = build_nodes(args.nodes_scale)
    total_gpus = sum(len(n.gpus) for n in nodes)
    groups = build_groups(total_gpus)
    jobs = build_jobs(args.jobs, rng)
    profile = PROFILES[args.profile]
    print(f"cluster: {len(nodes)} nodes, {total_gpus} GPUs; queue: {len(jobs)} jobs; profile {profile.name}")

    fast = run_cycles(nodes, groups, jobs, profile, args.seed)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    small = Snapshot(nodes, groups, tuple(jobs[: args.baseline_jobs]))
    base_plan, base_s = one_cycle(small, dataclasses.replace(profile, use_index=False), args.seed)
    same_plan, same_s = one_cycle(small, profile, args.seed)
    identical = base_plan == same_plan  # compares every diagnosis too
    base_rate = len(base_plan.assignments) / base_s if base_s else 0.0
    same_rate = len(same_plan.assignments) / same_s if same_s else 0.0

    f = fast
    print(
        f"indexed: {f['placements']:.0f} placements in {f['seconds']:.2f} s CPU over {f['cycles']:.0f} cycles"
        f" = {f['placements_per_s']:,.0f} placements/s; cycle p50 {f['cycle_p50_ms']:.1f} ms,"
        f" p99 {f['cycle_p99_ms']:.1f} ms; {f['left_waiting']:.0f} left waiting; peak RSS {peak_mib:.0f} MiB"
    )
    print(
        f"diagnosing every waiting job (built on first access): {f['diagnosis_s']:.2f} s CPU in all,"
        f" p50 {f['diagnosis_p50_ms']:.1f} ms per cycle; placements/s counting it:"
        f" {f['placements_per_s_with_diagnosis']:,.0f}"
    )
    print(
        f"baseline (plain scan, first cycle of {len(small.queued)} jobs):"
        f" {len(base_plan.assignments)} placements in {base_s:.2f} s = {base_rate:,.0f} placements/s"
    )
    print(f"indexed on that same snapshot: {same_rate:,.0f} placements/s; identical plans: {identical}")
    ratio = f["placements_per_s"] / base_rate if base_rate else 0.0
    same_ratio = same_rate / base_rate if base_rate else 0.0
    print(f"ratio (indexed full run / baseline): {ratio:,.1f}x; on the same snapshot: {same_ratio:,.1f}x")
    print(
        json.dumps(
            {
                "compiled": is_compiled(),  # the mypyc-compiled scheduler (docs/scheduler.md)
                "placements_per_s": round(fast["placements_per_s"], 1),
                "baseline_placements_per_s": round(base_rate, 1),
                "ratio": round(ratio, 2),
                "same_snapshot_placements_per_s": round(same_rate, 1),
                "same_snapshot_ratio": round(same_ratio, 2),
                "identical_plans": identical,
                "placements_per_s_with_diagnosis": round(fast["placements_per_s_with_diagnosis"], 1),
                "diagnosis_p50_ms": round(fast["diagnosis_p50_ms"], 2),
                "cycle_p50_ms": round(fast["cycle_p50_ms"], 2),
                "cycle_p99_ms": round(fast["cycle_p99_ms"], 2),
                "cycles": fast["cycles"],
                "placements": fast["placements"],
                "left_waiting": fast["left_waiting"],
                "peak_rss_mib": round(peak_mib, 1),
                "nodes": len(nodes),
                "gpus": total_gpus,
                "jobs": len(jobs),
                "profile": profile.name,
            }
        )
    )


if __name__ == "__main__":
    main()
