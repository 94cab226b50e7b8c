"""How the ETA calibration does on re-estimates (a diagnostic, never the shipped path): the default
policy's replay as bench/sim_eta.py runs it (calibrated, the roll `backfill`), which also reads,
every `--every` seconds of simulated time, the roll of up to `--sample` jobs that have been waiting
since an earlier first estimate (the live loop shows such a re-estimate on every tick; the replay
itself scores only the first). Each sample is scored, once the job has started, by
|shown remaining wait - actual remaining wait| / actual remaining wait (samples whose actual
remaining wait is over 5 min; the median) for:

- `roll`: the roll's own remaining wait, uncorrected;
- `shipped`: the calibration's fit applied to it (as the first estimate is);
- `fade`: the fit faded with the share of the wait already elapsed: weight w = predicted /
  (elapsed + predicted), shown = roll + w * (fit - roll) (elapsed 0, the first estimate: w = 1;
  eta_calibration.faded, what the live loop shows since this measurement);
- `until_first`: the fit while the job has waited less than its first predicted wait, else the roll.

The calibration each sample is corrected with is the replay's at that moment (outcomes of jobs that
started before it), and the first-estimate figure of the same run is printed: reading more rolls
does not change the schedule, so it must equal bench/sim_eta.py's `current`.

    CORRAL_PURE_PYTHON=1 .venv/bin/python bench/eta_reestimates.py [--jobs 90000] [--seeds 0,1,2,3,4]
        [--synth-jobs 3000] [--load 1.3] [--every 3600] [--sample 200]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Mapping, Set
from typing import Any

import numpy as np

from corral.scheduler.apply import estimated_starts
from corral.scheduler.compiled_build import is_compiled
from corral.scheduler.eta_calibration import faded
from corral.scheduler.types import Diagnosis
from corral.sim import replay
from corral.sim.cluster import ClusterSpec, load_cluster
from corral.sim.metrics import ETA_MIN_WAIT_S, summarize
from corral.sim.replay import SimConfig
from corral.sim.runner import simulate
from corral.sim.synth import SynthSpec, generate
from corral.sim.trace import Trace, first_jobs, load_trace

VARIANTS = ("roll", "shipped", "fade", "until_first")


def shown_waits(
    predicted: float, fitted: float | None, elapsed: float, first_predicted: float
) -> dict[str, float]:
    """Each variant's remaining wait for a roll predicting `predicted` s, `elapsed` s after the
    job's first estimate (which predicted `first_predicted` s); `fitted`: the calibration's fit of
    `predicted` (None: too few outcomes, every variant shows the roll)."""
    if fitted is None:
        return dict.fromkeys(VARIANTS, predicted)
    return {
        "roll": predicted,
        "shipped": fitted,
        "fade": faded(predicted, fitted, elapsed),  # the shipped one (as the live loop shows)
        "until_first": fitted if elapsed < first_predicted else predicted,
    }


def sampling_diagnose(every_s: float, sample: int, samples: list[tuple[str, float, dict[str, float]]]):  # type: ignore[no-untyped-def]
    """_SimSink.diagnose, then every `every_s` the sampled re-estimates (appended to `samples`)."""
    shipped = replay._SimSink.diagnose
    next_at = [-math.inf]

    def diagnose(self: replay._SimSink, diagnoses: Mapping[str, Diagnosis], planned: Set[str]) -> None:
        shipped(self, diagnoses, planned)
        sim, now = self.sim, self.now
        if now < next_at[0] or sim.eta_calibration is None:
            return
        next_at[0] = now + every_s
        jobs = sim.jobs
        waiting = sorted(
            j
            for j in sim.queued
            if j not in planned and not math.isnan(jobs[j].eta_read_at) and jobs[j].eta_read_at < now
        )
        if len(waiting) > sample:
            waiting = sorted(random.Random(int(now)).sample(waiting, sample))
        for job_id, eta in estimated_starts(diagnoses, waiting).items():
            if eta is None:
                continue
            sj = jobs[job_id]
            predicted = max(0.0, eta - now)
            fitted = sim.eta_calibration.corrected_wait(sj.trace.num_gpus, predicted)
            waits = shown_waits(predicted, fitted, now - sj.eta_read_at, sj.eta_predicted_wait_s)
            samples.append((job_id, now, waits))

    return diagnose


def one_case(label: str, trace: Trace, cluster: ClusterSpec, every_s: float, sample: int) -> dict[str, Any]:
    if is_compiled():  # a compiled _SimSink takes no patch
        raise SystemExit("eta_reestimates replaces the replay's diagnose: run it with CORRAL_PURE_PYTHON=1")
    samples: list[tuple[str, float, dict[str, float]]] = []
    shipped = replay._SimSink.diagnose
    replay._SimSink.diagnose = sampling_diagnose(every_s, sample, samples)  # type: ignore[method-assign]
    try:
        result = simulate(trace, cluster, "default", SimConfig(), {"eta_roll": "backfill"})
    finally:
        replay._SimSink.diagnose = shipped  # type: ignore[method-assign]
    first = summarize(result)["eta_rel_err_median"]
    starts = {j.trace.job_id: j.first_start for j in result.jobs}
    errors: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for job_id, now, waits in samples:
        start = starts[job_id]
        if math.isnan(start) or start - now <= ETA_MIN_WAIT_S:
            continue
        actual = start - now
        for variant, shown in waits.items():
            errors[variant].append(abs(shown - actual) / actual)
    out: dict[str, Any] = {"first_estimate": first, "samples": len(samples), "scored": len(errors["roll"])}
    for variant, errs in errors.items():
        out[variant] = round(float(np.median(errs)), 3) if errs else None
    print(
        f"{label}: first estimate {first or 0:.1%}; re-estimates ({out['scored']:,} of {len(samples):,} "
        "samples, remaining > 5 min): " + ", ".join(f"{v} {out[v] or 0:.1%}" for v in VARIANTS),
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=90000, help="Philly prefix (0: skip Philly)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="synthetic seeds ('' to skip)")
    parser.add_argument("--synth-jobs", type=int, default=3000)
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument(
        "--every", type=float, default=3600.0, help="seconds of simulated time between samples"
    )
    parser.add_argument("--sample", type=int, default=200, help="waiting jobs read per sample at most")
    args = parser.parse_args()
    if args.every <= 0 or args.sample < 1:
        raise SystemExit(f"--every must be > 0 and --sample >= 1, got {args.every} and {args.sample}")
    results: dict[str, Any] = {}
    if args.jobs:
        philly = first_jobs(load_trace("philly"), args.jobs)
        label = f"philly ({len(philly.jobs):,} jobs)"
        results["philly"] = one_case(label, philly, load_cluster("philly"), args.every, args.sample)
    synth = load_cluster("synth")
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        trace = generate(SynthSpec(jobs=args.synth_jobs, load=args.load, seed=seed), synth)
        results[f"synth_seed_{seed}"] = one_case(f"synth seed {seed}", trace, synth, args.every, args.sample)
    print(
        json.dumps(
            {"bench": "eta_reestimates", "every_s": args.every, "sample": args.sample, "results": results}
        )
    )


if __name__ == "__main__":
    main()
