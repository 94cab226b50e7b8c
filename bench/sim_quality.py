"""Scheduling quality under overload: the default policy (no true durations) against FIFO and the
SJF-with-true-durations bound, on several seeds of `corral sim synth` on the synth cluster.

Targets (issue 19), per seed: avg JCT <= 1.1x sjf-oracle's; p99 queueing (every wait) <= 0.5x
FIFO's; the worst group's slowdown no worse than FIFO's; every guaranteed group held its share
(`worst_guarantee_held`, reported). Also the ETA error (median |ETA - start| / wait over jobs that
waited > 5 min) and preemptions. Each figure is printed next to its baselines from the same run,
with the machine's load average. Last line: one JSON object.

`--knob NAME=VALUE` (repeatable, as `corral sim --knob`) changes the default policy's profile, to
try a variant against the same baselines. `--reference POLICY[,POLICY]` replays more policies and
prints their ratios too (e.g. `fifo-backfill`: submit order with backfill, the order that keeps the
longest waits short, for what the p99 target asks). `over_half_fifo_p99`: how many jobs waited
longer than 0.5x FIFO's p99 (the p99 target holds when that is at most 1% of the jobs).

    .venv/bin/python bench/sim_quality.py [--seeds 0,1,2,3,4] [--jobs 3000] [--load 1.3]
        [--knob starvation_s=86400] [--reference fifo-backfill]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from corral.sim.cluster import load_cluster
from corral.sim.metrics import job_arrays, summarize
from corral.sim.replay import SimConfig
from corral.sim.runner import parse_knobs, simulate
from corral.sim.synth import SynthSpec, generate

POLICIES = ("default", "fifo", "sjf-oracle")
NO_HISTORY = "default-no-history"  # the ETA baseline: estimates from user limits only (as before)
KEYS = (
    "avg_jct_s",
    "p99_queue_s",
    "avg_queue_s",
    "worst_group_slowdown",
    "worst_guarantee_held",
    "eta_rel_err_median",
    "preemptions",
    "max_preemptions_per_job",
    "lost_work_gpu_h",
    "gpu_alloc_arrivals",
    "jobs_censored",
)


def one_seed(
    seed: int,
    jobs: int,
    load: float,
    eta_baseline: bool,
    knobs: dict[str, Any] | None = None,
    references: tuple[str, ...] = (),
) -> dict[str, Any]:
    cluster = load_cluster("synth")
    trace = generate(SynthSpec(jobs=jobs, load=load, seed=seed), cluster)
    out: dict[str, Any] = {}
    waits: dict[str, Any] = {}
    policies = (*POLICIES, *references, *((NO_HISTORY,) if eta_baseline else ()))
    for policy in policies:
        started = time.perf_counter()
        config = SimConfig(runtime_history=policy != NO_HISTORY)
        name = policy.removesuffix("-no-history")
        result = simulate(trace, cluster, name, config, knobs if name == "default" else None)
        s = summarize(result)
        waits[policy] = job_arrays(result)["queue"]
        out[policy] = {k: s[k] for k in KEYS} | {"wall_s": round(time.perf_counter() - started, 1)}
    d, f, o = out["default"], out["fifo"], out["sjf-oracle"]
    half = 0.5 * f["p99_queue_s"]
    for policy in policies:
        out[policy]["over_half_fifo_p99"] = int((waits[policy] > half).sum())
    out["jct_vs_sjf_oracle"] = d["avg_jct_s"] / o["avg_jct_s"]
    out["p99_queue_vs_fifo"] = d["p99_queue_s"] / f["p99_queue_s"] if f["p99_queue_s"] else None
    out["worst_slowdown_vs_fifo"] = d["worst_group_slowdown"] / f["worst_group_slowdown"]
    load_avg = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"seed {seed}: avg JCT default {d['avg_jct_s'] / 3600:.2f} h, fifo {f['avg_jct_s'] / 3600:.2f} h, "
        f"sjf-oracle {o['avg_jct_s'] / 3600:.2f} h -> {out['jct_vs_sjf_oracle']:.2f}x sjf-oracle "
        "(target <= 1.1); "
        f"p99 queue default {d['p99_queue_s']:,.0f} s, fifo {f['p99_queue_s']:,.0f} s -> "
        f"{out['p99_queue_vs_fifo'] or 0:.2f}x fifo (target <= 0.5); worst-group slowdown "
        f"{d['worst_group_slowdown']:.2f} vs fifo {f['worst_group_slowdown']:.2f}; guarantee held "
        f"{d['worst_guarantee_held']:.1%} (fifo {f['worst_guarantee_held']:.1%}); ETA rel err "
        f"{d['eta_rel_err_median'] or 0:.0%} (fifo {f['eta_rel_err_median'] or 0:.0%}); preemptions "
        f"{d['preemptions']} (max {d['max_preemptions_per_job']} per job, "
        f"{d['lost_work_gpu_h']:,.0f} GPU-h lost); jobs waiting > 0.5x fifo's p99: "
        f"{d['over_half_fifo_p99']} (1% of the jobs: {jobs / 100:g}) "
        f"(load avg {load_avg})",
        flush=True,
    )
    for policy in references:
        r = out[policy]
        print(
            f"  reference {policy}: avg JCT {r['avg_jct_s'] / o['avg_jct_s']:.2f}x sjf-oracle, p99 queue "
            f"{r['p99_queue_s'] / f['p99_queue_s'] if f['p99_queue_s'] else 0:.2f}x fifo, worst-group "
            f"slowdown {r['worst_group_slowdown']:.2f}, guarantee held {r['worst_guarantee_held']:.1%}, "
            f"jobs waiting > 0.5x fifo's p99: {r['over_half_fifo_p99']}",
            flush=True,
        )
    if eta_baseline:
        before = out[NO_HISTORY]["eta_rel_err_median"]
        print(f"  ETA rel err default {d['eta_rel_err_median'] or 0:.0%}, without history {before or 0:.0%}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument(
        "--no-eta-baseline", action="store_true", help="skip the replay without runtime history"
    )
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change a knob of the default policy (as corral sim --knob); repeatable",
    )
    parser.add_argument(
        "--reference",
        default="",
        metavar="POLICY[,POLICY]",
        help="more policies to replay and compare (e.g. fifo-backfill)",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    try:
        knobs = parse_knobs(args.knob)
    except ValueError as exc:
        parser.error(str(exc))
    references = tuple(p.strip() for p in args.reference.split(",") if p.strip())
    results = {
        seed: one_seed(seed, args.jobs, args.load, not args.no_eta_baseline, knobs, references)
        for seed in seeds
    }
    met = {
        "jct_le_1.1x_sjf_oracle": all(r["jct_vs_sjf_oracle"] <= 1.1 for r in results.values()),
        "p99_queue_le_0.5x_fifo": all((r["p99_queue_vs_fifo"] or 0) <= 0.5 for r in results.values()),
        "worst_slowdown_le_fifo": all(r["worst_slowdown_vs_fifo"] <= 1.0 for r in results.values()),
    }
    print(f"targets met on every seed: {met}")
    print(
        json.dumps(
            {
                "bench": "sim_quality",
                "jobs": args.jobs,
                "load": args.load,
                "knobs": args.knob,
                "targets_met": met,
                "seeds": results,
                "load_avg": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
