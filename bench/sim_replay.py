"""Replay the Philly trace on the Philly-sized example cluster with Corral's default policy.

Prints jobs replayed per second, wall time, CPU time of this process (steadier than wall time on a
shared machine), scheduling cycles and the share of time spent inside the scheduler library; the
baseline, measured in the same run, is the same replay under the simplest profile (`fifo`: no
quotas, no backfill, no preemption), on as many jobs as `--jobs` (the whole trace by default).
Target: the whole trace (82,247 jobs) in under 30 s. Last line: one JSON object.

A deep-queue case next to it (`--deep-jobs`, 0 to skip): a `corral sim synth` trace on the synth
cluster (640 GPUs, 4 models) at `--deep-load` (default 1.3x capacity: thousands of jobs queued),
replayed under the same policy and under fifo in the same run. Target: >= 1,000 jobs/s.
Load average of the machine is printed with every figure (a shared machine skews wall times).

    .venv/bin/python bench/sim_replay.py [--jobs N] [--policy default] [--baseline-jobs N]
        [--deep-jobs 9000] [--deep-load 1.3] [--deep-seed 0] [--eta-interval S] [--eta-reuse S]

`--eta-interval S` (default 0: every new job's estimate read in its first cycle, as scored) reads
new jobs' estimated starts at most once per S simulated seconds (`SimConfig.eta_interval_s`, a
speed option that changes what the ETA figure scores); the Philly replay prints that figure.
`--eta-reuse S` sets the policy knob `eta_reuse_s` for every replay of the run (scheduler/eta_kept.py:
a new job's estimate continues the roll kept from a cycle at most S s earlier while nothing started
or ended; not exact, so it moves the ETA figure a little; 0: every roll from scratch). Without it
each profile keeps its own value (`default` 60 s, the others 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

from corral.scheduler import PROFILES
from corral.scheduler.compiled_build import is_compiled
from corral.sim.cluster import load_cluster
from corral.sim.metrics import summarize
from corral.sim.replay import SimConfig, SimResult
from corral.sim.runner import simulate
from corral.sim.synth import SynthSpec, generate
from corral.sim.trace import Trace, first_jobs, load_trace

TARGET_S = 30.0
DEEP_TARGET_JOBS_S = 1000.0


def load_text() -> str:
    return "load avg " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def deep_case(
    jobs: int, load: float, seed: int, policy: str, config: SimConfig, knobs: dict[str, float]
) -> dict[str, Any]:
    """The synthetic deep-queue replay under `policy` and fifo, same trace, same run."""
    cluster = load_cluster("synth")
    trace: Trace = generate(SynthSpec(jobs=jobs, load=load, seed=seed), cluster)
    out: dict[str, Any] = {"jobs": jobs, "load": load, "seed": seed}
    for name in (policy, "fifo"):
        started, cpu = time.perf_counter(), time.process_time()
        result = simulate(trace, cluster, name, config, knobs)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        depth = result.max_queued
        s = summarize(result)
        print(
            f"deep {name}: {jobs:,} jobs in {wall:.1f} s (CPU {cpu:.1f} s) = {jobs / wall:,.0f} jobs/s, "
            f"max queued {depth:,}, {result.cycles:,} cycles, avg JCT {s['avg_jct_s'] / 3600:.2f} h, "
            f"ETA error {_percent(s['eta_rel_err_median'])} ({load_text()})"
        )
        out[name] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "jobs_per_s": round(jobs / wall, 1)}
        out[name]["max_queued"] = depth
        out[name]["eta_rel_err_median"] = s["eta_rel_err_median"]
    rate = out[policy]["jobs_per_s"]
    target = DEEP_TARGET_JOBS_S
    print(f"  deep {policy}: {rate:,.0f} jobs/s (target {target:,.0f}: {rate / target:.2f}x)")
    return out


def replay(
    jobs: int | None, policy: str, config: SimConfig | None = None, knobs: dict[str, float] | None = None
) -> tuple[SimResult, int, float, float]:
    """The result, jobs replayed, wall seconds and CPU seconds of one replay."""
    trace = load_trace("philly")
    if jobs:
        trace = first_jobs(trace, jobs)
    cluster = load_cluster("philly")
    started, cpu = time.perf_counter(), time.process_time()
    result = simulate(trace, cluster, policy, config, knobs)
    return result, len(trace.jobs), time.perf_counter() - started, time.process_time() - cpu


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None, help="replay only the first N jobs (default: all)")
    parser.add_argument("--policy", default="default")
    parser.add_argument(
        "--baseline-jobs",
        type=int,
        default=None,
        help="jobs in the fifo baseline (default: the same as --jobs, like for like; 0: skip)",
    )
    parser.add_argument("--deep-jobs", type=int, default=9000, help="synthetic deep-queue case (0: skip)")
    parser.add_argument("--deep-load", type=float, default=1.3)
    parser.add_argument("--deep-seed", type=int, default=0)
    parser.add_argument("--skip-philly", action="store_true", help="only the deep-queue case")
    parser.add_argument(
        "--eta-interval",
        type=float,
        default=0.0,
        help="read new jobs' ETAs at most once per S simulated seconds (0: in each job's first cycle)",
    )
    parser.add_argument(
        "--eta-reuse",
        type=float,
        default=None,
        help="the eta_reuse_s knob: continue a kept estimated-start roll for S s (0: off, exact; "
        "default: each profile's own, default 60 s, the others 0)",
    )
    args = parser.parse_args()
    if args.eta_reuse is not None and (not math.isfinite(args.eta_reuse) or args.eta_reuse < 0):
        parser.error(f"--eta-reuse must be a finite number >= 0 of seconds, got {args.eta_reuse}")
    if not math.isfinite(args.eta_interval) or args.eta_interval < 0:
        parser.error(f"--eta-interval must be a finite number >= 0 of seconds, got {args.eta_interval}")
    if args.baseline_jobs is None:
        args.baseline_jobs = args.jobs if args.jobs is not None else 82_247
    return args


def main() -> None:
    args = parse_args()
    config = SimConfig(eta_interval_s=args.eta_interval)
    knobs = {} if args.eta_reuse is None else {"eta_reuse_s": args.eta_reuse}
    deep = None
    if args.deep_jobs:
        deep = deep_case(args.deep_jobs, args.deep_load, args.deep_seed, args.policy, config, knobs)
    if args.skip_philly:
        line = {"bench": "sim_replay", "deep": deep, "compiled": is_compiled(), "load_avg": os.getloadavg()}
        print(json.dumps(line))
        return

    base_rate = base_cpu = None
    if args.baseline_jobs:
        base, base_jobs, base_wall, base_cpu = replay(args.baseline_jobs, "fifo", config, knobs)
        base_rate = base_jobs / base_wall
        print(
            f"baseline fifo: {base_jobs:,} jobs in {base_wall:.1f} s (CPU {base_cpu:.1f} s) = "
            f"{base_rate:,.0f} jobs/s, {base.cycles:,} cycles ({load_text()})"
        )
    result, jobs, wall, cpu = replay(args.jobs, args.policy, config, knobs)
    report(args, result, jobs, wall, cpu, base_rate, base_cpu, deep)


def report(
    args: argparse.Namespace,
    result: SimResult,
    jobs: int,
    wall: float,
    cpu: float,
    base_rate: float | None,
    base_cpu: float | None,
    deep: dict[str, Any] | None,
) -> None:
    """The policy's replay: its lines, then one JSON line with every figure."""
    rate = jobs / wall
    library_s = result.schedule_s + result.diagnosis_s  # diagnoses are computed lazily on first read
    sched_share = library_s / wall if wall else 0.0
    print(
        f"{args.policy}: {jobs:,} jobs in {wall:.1f} s (CPU {cpu:.1f} s) = {rate:,.0f} jobs/s ({load_text()})"
    )
    print(
        f"  cycles {result.cycles:,} ({result.cycles / wall:,.0f}/s), "
        f"inside the scheduler library: {sched_share:.0%}"
    )
    cycles = max(result.cycles, 1)
    print(
        f"  per cycle: {1000 * result.schedule_s / cycles:.2f} ms in schedule(), "
        f"{1000 * result.diagnosis_s / cycles:.2f} ms in diagnoses (ETAs), "
        f"{1000 * (wall - library_s) / cycles:.2f} ms in the simulator"
    )
    projected = 82_247 / rate
    print(
        f"  whole trace projected: {projected:.0f} s (target {TARGET_S:.0f} s: {projected / TARGET_S:.1f}x)"
    )
    if base_rate:
        print(f"  vs fifo baseline: {rate / base_rate:.2f}x its jobs/s")
    summary = summarize(result)
    eta_rel = summary["eta_rel_err_median"]
    print(
        f"  ETA error (median |ETA - start| / wait, jobs waiting > 5 min): "
        f"{_percent(eta_rel)} over {summary['eta_rel_jobs']:,} jobs, "
        f"{summary['eta_none_jobs']:,} shown none (ETAs read every {args.eta_interval:g} s; 0: at submit)"
    )
    print(
        json.dumps(
            {
                "bench": "sim_replay",
                "policy": args.policy,
                "jobs": jobs,
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "jobs_per_s": round(rate, 1),
                "cycles": result.cycles,
                "schedule_s": round(result.schedule_s, 2),
                "diagnosis_s": round(result.diagnosis_s, 2),
                "schedule_share": round(sched_share, 3),
                "projected_full_trace_s": round(projected, 1),
                "target_s": TARGET_S,
                "baseline_fifo_jobs_per_s": None if base_rate is None else round(base_rate, 1),
                "baseline_fifo_cpu_s": None if base_cpu is None else round(base_cpu, 2),
                "ratio_vs_fifo": None if base_rate is None else round(rate / base_rate, 3),
                "eta_interval_s": args.eta_interval,
                "eta_reuse_s": PROFILES[args.policy].eta_reuse_s
                if args.eta_reuse is None
                else args.eta_reuse,
                "eta_rel_err_median": eta_rel,
                "eta_rel_jobs": summary["eta_rel_jobs"],
                "eta_none_jobs": summary["eta_none_jobs"],
                "deep": deep,
                "compiled": is_compiled(),  # the mypyc-compiled scheduler (docs/scheduler.md)
                "load_avg": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
