"""Accuracy of the estimated start shown at submit, without true durations: the default policy's
replay on the Philly trace (a prefix with --jobs) and on synthetic overloaded traces, each run three
times in the same process: with the current estimator (runtime-history chain with spread, backfill
roll over per-model timelines, remaining times of running jobs from what they ran, the roll's wait
calibrated by the replay's own past outcomes: scheduler/eta_calibration.py), with the same roll
uncalibrated (`uncalibrated`: `SimConfig(eta_calibration=False)`, the same schedule) and with the
previous round's (`baseline`: name/shape history only, the pooled roll, uncalibrated;
`SimConfig.legacy_estimates` and `eta_roll="pooled"`). The baseline changes the runtime estimates
the policy itself reads too, so its schedule is its own; every figure is measured on its own run.

Figure (issue 19): the median over jobs that waited > 5 min of |ETA - actual start| / actual wait.
Target <= 25% on Philly and on the synthetic traces, and below the baseline's in the same run.
Also: jobs that waited > 5 min but were shown no ETA (held by a quota or cap: they say so
instead), the median absolute error, and the time spent computing estimates. Last line: JSON.

    .venv/bin/python bench/sim_eta.py [--jobs 20000] [--seeds 0,1,2] [--synth-jobs 3000] [--load 1.3]
        [--eta-reuse 0,60,300] [--estimators current]

`--eta-reuse S1,S2,...` runs each estimator once per value of the policy knob `eta_reuse_s` (the
estimated-start roll kept across cycles, scheduler/eta_kept.py; the schedule is the same at every
value, only the estimates move) and names each result `NAME@S`; without it each estimator runs
once with the profile's own value. `--estimators` runs only the named ones (default: all three).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

from corral.sim.cluster import ClusterSpec, load_cluster
from corral.sim.metrics import summarize
from corral.sim.replay import SimConfig
from corral.sim.runner import simulate
from corral.sim.synth import SynthSpec, generate
from corral.sim.trace import Trace, first_jobs, load_trace

TARGET = 0.25
ESTIMATORS = {
    "current": (SimConfig(), {"eta_roll": "backfill"}),
    "uncalibrated": (SimConfig(eta_calibration=False), {"eta_roll": "backfill"}),
    "baseline": (SimConfig(legacy_estimates=True, eta_calibration=False), {"eta_roll": "pooled"}),
}


def load_text() -> str:
    return "load avg " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def one_case(
    label: str, trace: Trace, cluster: ClusterSpec, estimators: list[str], reuses: list[float] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs = (
        [(name, None) for name in estimators]
        if reuses is None
        else [(n, s) for n in estimators for s in reuses]
    )
    for estimator, reuse in runs:
        config, roll = ESTIMATORS[estimator]
        name = estimator if reuse is None else f"{estimator}@{reuse:g}"
        knobs: dict[str, Any] = dict(roll) if reuse is None else {**roll, "eta_reuse_s": reuse}
        started = time.perf_counter()
        result = simulate(trace, cluster, "default", config, knobs)
        s = summarize(result)
        rel = s["eta_rel_err_median"]
        out[name] = {
            "eta_rel_err_median": rel,
            "eta_rel_jobs": s["eta_rel_jobs"],
            "eta_none_jobs": s["eta_none_jobs"],
            "eta_median_abs_err_s": s["eta_median_abs_err_s"],
            "diagnosis_s": round(result.diagnosis_s, 2),
            "wall_s": round(time.perf_counter() - started, 1),
        }
        print(
            f"{label} {name}: ETA rel err {rel or 0:.1%} over {s['eta_rel_jobs']:,} jobs that waited > 5 min "
            f"({s['eta_none_jobs']:,} more shown no ETA: held, or past eta_limit), median abs err "
            f"{s['eta_median_abs_err_s'] or 0:,.0f} s, {result.diagnosis_s:.1f} s in estimates, "
            f"replay {out[name]['wall_s']} s ({load_text()})",
            flush=True,
        )
    if reuses is not None or set(estimators) != set(ESTIMATORS):
        return out  # the comparisons below are of the three estimators at one setting
    cur, base = out["current"]["eta_rel_err_median"], out["baseline"]["eta_rel_err_median"]
    raw = out["uncalibrated"]["eta_rel_err_median"]
    out["met_target"] = cur is not None and cur <= TARGET
    out["better_than_baseline"] = cur is not None and base is not None and cur < base
    out["better_than_uncalibrated"] = cur is not None and raw is not None and cur < raw
    print(
        f"  {label}: {cur or 0:.1%} vs uncalibrated {raw or 0:.1%}, baseline {base or 0:.1%} "
        f"(target <= {TARGET:.0%}: "
        f"{'met' if out['met_target'] else 'not met'})",
        flush=True,
    )
    return out


def reuse_value(parser: argparse.ArgumentParser, text: str) -> float:
    """One `--eta-reuse` value: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        parser.error(f"--eta-reuse: {text.strip()!r} is not a number of seconds")
    if not math.isfinite(value) or value < 0:
        parser.error(f"--eta-reuse: values must be finite numbers >= 0 of seconds, got {text.strip()}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000, help="Philly prefix (0: the whole trace)")
    parser.add_argument("--seeds", default="0,1,2", help="synthetic seeds ('' to skip)")
    parser.add_argument("--synth-jobs", type=int, default=3000)
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument(
        "--eta-reuse",
        default=None,
        help="comma-separated eta_reuse_s values in s, each run (default: the profile's)",
    )
    parser.add_argument(
        "--estimators", default=",".join(ESTIMATORS), help="comma-separated, of: " + ", ".join(ESTIMATORS)
    )
    args = parser.parse_args()
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown or not estimators:
        parser.error(
            f"--estimators: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(ESTIMATORS)}"
        )
    reuses = None if args.eta_reuse is None else [reuse_value(parser, v) for v in args.eta_reuse.split(",")]
    results: dict[str, Any] = {}
    philly = load_trace("philly")
    if args.jobs:
        philly = first_jobs(philly, args.jobs)
    results["philly"] = one_case(
        f"philly ({len(philly.jobs):,} jobs)", philly, load_cluster("philly"), estimators, reuses
    )
    synth = load_cluster("synth")
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        trace = generate(SynthSpec(jobs=args.synth_jobs, load=args.load, seed=seed), synth)
        results[f"synth_seed_{seed}"] = one_case(f"synth seed {seed}", trace, synth, estimators, reuses)
    print(
        json.dumps(
            {
                "bench": "sim_eta",
                "philly_jobs": len(philly.jobs),
                "synth_jobs": args.synth_jobs,
                "load": args.load,
                "eta_reuse_s": reuses,
                "results": results,
                "load_avg": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
