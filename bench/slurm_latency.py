"""Slurm engine latency and throughput on a real (emulated, 3-node) Slurm cluster.

Submits a burst of N trivial jobs through Corral's SlurmEngine (launch -> RUNNING -> finished),
then the same burst as plain `sbatch --wrap true` jobs with the same requests (the baseline,
measured in the same run on the same cluster). Both sides are watched the same way: one
`squeue --json` per poll round (the engine's poll does exactly one). Prints submit->running
p50/p99, submit->finished p50 and jobs/s for both, the ratios, and one JSON line at the end.

    .venv/bin/python bench/slurm_latency.py [--jobs 30] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from corral.engine.base import AttemptPhase  # noqa: E402
from tests.slurm.harness import SlurmCluster, missing_binaries  # noqa: E402
from tests.slurm.helpers import attempt, instance, slurm_engine  # noqa: E402

POLL_S = 0.02
RUNNING_OR_LATER = {"RUNNING", "COMPLETING", "COMPLETED", "FAILED", "CANCELLED"}
FINISHED_SLURM = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summarize(name: str, submit: dict[str, float], running: dict[str, float], done: dict[str, float]) -> dict:
    to_running = [running[k] - submit[k] for k in submit]
    to_done = [done[k] - submit[k] for k in submit]
    span = max(done.values()) - min(submit.values())
    return {
        "name": name,
        "jobs": len(submit),
        "submit_to_running_p50_s": round(percentile(to_running, 50), 3),
        "submit_to_running_p99_s": round(percentile(to_running, 99), 3),
        "submit_to_running_mean_s": round(statistics.fmean(to_running), 3),
        "submit_to_finished_p50_s": round(percentile(to_done, 50), 3),
        "jobs_per_s": round(len(submit) / span, 2),
    }


def watch(keys: list[str], states: Callable[[], dict[str, str]], timeout_s: float) -> tuple[dict, dict]:
    """Poll until every key is finished; record when each was first seen running and finished."""
    running: dict[str, float] = {}
    done: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < len(keys):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(keys) - len(done)} jobs not finished after {timeout_s}s")
        now = time.time()
        for key, state in states().items():
            if state in RUNNING_OR_LATER:
                running.setdefault(key, now)
            if state in FINISHED_SLURM:
                done.setdefault(key, now)
        time.sleep(POLL_S)
    return running, done


def run_engine(cluster: SlurmCluster, state_dir: Path, n: int, tag: str) -> dict:
    engine = slurm_engine(cluster, state_dir)  # as alice's account, in bubblewrap on the node
    nodes = cluster.node_names
    submit: dict[str, float] = {}
    for i in range(n):
        aid = f"bench{tag}-{i}.1"
        submit[aid] = time.time()
        engine.launch(attempt(aid, instance(nodes[i % len(nodes)], "true", cpus=1, memory_mib=100)))

    phase_to_slurm = {
        AttemptPhase.PENDING: "PENDING",
        AttemptPhase.RUNNING: "RUNNING",
        AttemptPhase.SUCCEEDED: "COMPLETED",
        AttemptPhase.FAILED: "FAILED",
        AttemptPhase.LOST: "NODE_FAIL",
    }

    def states() -> dict[str, str]:
        return {k: phase_to_slurm[s.phase] for k, s in engine.poll(list(submit)).items()}

    running, done = watch(list(submit), states, timeout_s=120)
    failed = [k for k, s in engine.poll(list(submit)).items() if s.phase is not AttemptPhase.SUCCEEDED]
    if failed:
        raise RuntimeError(f"engine jobs did not succeed: {failed[:3]}")
    engine.close()
    return summarize("corral-slurm-engine", submit, running, done)


def run_sbatch(cluster: SlurmCluster, out_dir: Path, n: int) -> dict:
    env = cluster.env
    nodes = cluster.node_names
    submit: dict[str, float] = {}
    for i in range(n):
        t0 = time.time()
        job = subprocess.run(
            [
                "sbatch",
                "--parsable",
                f"--nodelist={nodes[i % len(nodes)]}",
                "--ntasks=1",
                "--cpus-per-task=1",
                "--mem=100M",
                "--no-requeue",
                f"--output={out_dir}/sbatch-%j.out",
                "--wrap=true",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        submit[job.split(";")[0]] = t0

    def states() -> dict[str, str]:
        data = json.loads(
            subprocess.run(
                ["squeue", "--json", "--states=all"], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
        out = {}
        for j in data.get("jobs", []):
            key = str(j["job_id"])
            if key in submit:
                state = j["job_state"]
                out[key] = state[0] if isinstance(state, list) else state
        return out

    running, done = watch(list(submit), states, timeout_s=120)
    return summarize("plain-sbatch", submit, running, done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=30, help="jobs per burst (default 30)")
    parser.add_argument("--rounds", type=int, default=4, help="bursts per side, alternating (default 4)")
    args = parser.parse_args()
    if args.jobs < 1 or args.rounds < 1:
        parser.error("--jobs and --rounds must be >= 1")
    missing = missing_binaries()
    if missing:
        sys.exit(f"missing Slurm/munge programs: {missing}")

    with SlurmCluster() as cluster:
        print(f"cluster: {len(cluster.node_names)} nodes up in {cluster.started_in_s:.2f}s ({cluster.base})")
        # warm-up, not counted: the first burst after slurmctld starts was ~2 s slower here
        run_sbatch(cluster, cluster.base / "out", 6)
        engine_runs, sbatch_runs = [], []
        for r in range(args.rounds):  # alternate so that drift on a shared box hits both sides
            if r % 2:
                engine_runs.append(run_engine(cluster, cluster.base / f"engine-state-{r}", args.jobs, str(r)))
                time.sleep(1.0)
                sbatch_runs.append(run_sbatch(cluster, cluster.base / "out", args.jobs))
            else:
                sbatch_runs.append(run_sbatch(cluster, cluster.base / "out", args.jobs))
                time.sleep(1.0)
                engine_runs.append(run_engine(cluster, cluster.base / f"engine-state-{r}", args.jobs, str(r)))
            time.sleep(1.0)
            print(f"round {r}: sbatch {sbatch_runs[-1]}\n         engine {engine_runs[-1]}")

    def merge(runs: list[dict]) -> dict:
        keys = [k for k in runs[0] if k not in ("name", "jobs")]
        merged = {"name": runs[0]["name"], "jobs": sum(r["jobs"] for r in runs)}
        merged.update({k: round(statistics.median(r[k] for r in runs), 3) for k in keys})
        return merged

    eng, ref = merge(engine_runs), merge(sbatch_runs)
    print(f"\n{'':22} {'engine':>10} {'sbatch':>10} {'ratio':>8}")
    for key in (
        "submit_to_running_p50_s",
        "submit_to_running_p99_s",
        "submit_to_running_mean_s",
        "submit_to_finished_p50_s",
        "jobs_per_s",
    ):
        ratio = eng[key] / ref[key] if ref[key] else float("nan")
        print(f"{key:26} {eng[key]:>8} {ref[key]:>10} {ratio:>8.2f}")
    result = {
        "bench": "slurm_latency",
        "jobs_per_round": args.jobs,
        "rounds": args.rounds,
        "engine": eng,
        "sbatch": ref,
        "ratio_running_p50": round(eng["submit_to_running_p50_s"] / ref["submit_to_running_p50_s"], 3),
        "ratio_jobs_per_s": round(eng["jobs_per_s"] / ref["jobs_per_s"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
