"""Issue 19's Slurm targets over several runs of `bench/job_latency.py --engine slurm`.

One run's ratios swing with plain sbatch's own figures (its 400-job burst has ranged from 24 to 51
jobs/s on the same box), so one run says little about a target. This runs the same bench N times
in a row, each run measuring Corral on Slurm and plain sbatch side by side as always, and prints
every run's ratios, their median and in how many runs each target held.

    .venv/bin/python bench/slurm_repeat.py --runs 5 [--slurm-jobs 100 --slurm-rate 20 --slurm-burst 400]

Last line: one JSON object with the per-run ratios, medians and counts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (JSON key in job_latency.py's last line, label, target, whether the ratio must stay at or below it)
TARGETS = (
    ("slurm_over_sbatch_submit_to_running_p50_ms", "p50 at the rate", 1.2, True),
    ("slurm_over_sbatch_submit_to_running_p99_ms", "p99 at the rate", 1.5, True),
    ("slurm_over_sbatch_jobs_per_s", "jobs/s at the rate", 0.9, False),
    ("slurm_burst_over_sbatch_burst_jobs_per_s", "jobs/s, all at once", 0.9, False),
)


def one_run(args: argparse.Namespace) -> dict[str, float]:
    cmd = [
        sys.executable,
        str(HERE / "job_latency.py"),
        "--engine",
        "slurm",
        "--slurm-only",
        "--slurm-jobs",
        str(args.slurm_jobs),
        "--slurm-rate",
        str(args.slurm_rate),
        "--slurm-burst",
        str(args.slurm_burst),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"job_latency.py failed (exit {proc.returncode})")
    result: dict[str, float] = json.loads(lines[-1])
    return result


def met(ratio: float, target: float, at_most: bool) -> bool:
    return ratio <= target if at_most else ratio >= target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="how many runs of the bench (default 5)")
    parser.add_argument("--slurm-jobs", type=int, default=100)
    parser.add_argument("--slurm-rate", type=float, default=20.0)
    parser.add_argument("--slurm-burst", type=int, default=400)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    if args.slurm_burst < 1:
        parser.error(f"--slurm-burst must be >= 1 (the burst is one of the targets), got {args.slurm_burst}")
    runs = []
    for n in range(1, args.runs + 1):
        load = os.getloadavg()[0]
        res = one_run(args)
        runs.append(res)
        ratios = "  ".join(f"{label} {res[key]:.2f}x" for key, label, _, _ in TARGETS)
        print(
            f"run {n}: {ratios}  (sbatch burst {res['sbatch_burst_jobs_per_s']:.1f} jobs/s, "
            f"Corral {res['slurm_burst_jobs_per_s']:.1f}; load {load:.2f} -> {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    summary: dict[str, object] = {"runs": args.runs}
    for key, label, target, at_most in TARGETS:
        values = [r[key] for r in runs]
        held = sum(met(v, target, at_most) for v in values)
        median = statistics.median(values)
        sign = "<=" if at_most else ">="
        print(f"{label}: median {median:.2f}x (target {sign} {target}x), held in {held} of {len(values)}")
        summary[key] = {"per_run": values, "median": median, "held": held}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
