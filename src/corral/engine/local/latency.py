"""Start-up cost of the local engine, sandboxed and not, next to plain subprocess: the figures
bench/job_latency.py reports as the engine's share of submit->running.

    python -m corral.engine.local.latency [--jobs N]   # prints a table, then one JSON line

`measure(engine, n)` is the reusable part: it launches n trivial attempts one after the other,
timing launch() and launch->RUNNING (as poll reports it), then waits for all to finish and
reports completed jobs per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import NotRequired, TypedDict

from corral.engine.base import AttemptLaunch, AttemptPhase, InstanceLaunch
from corral.engine.local.engine import LocalEngine


def _trivial_attempt(engine: LocalEngine, command: str) -> AttemptLaunch:
    aid = f"lat{uuid.uuid4().hex[:12]}.1"
    inst = InstanceLaunch("main", 0, 0, engine.node_name, (), 1.0, 256, command, {"RANK": "0"})
    return AttemptLaunch(aid, aid.split(".")[0], 1, "bench", "bench", (inst,))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wait_all(engine: LocalEngine, ids: list[str]) -> None:
    pending = set(ids)
    while pending:
        pending -= {a for a, s in engine.poll(pending).items() if s.phase.finished}
        if pending:
            time.sleep(0.002)


def measure(engine: LocalEngine, n: int = 50, command: str = "true") -> dict[str, float]:
    """ms figures for launch(), launch->RUNNING and launch->finished over n attempts run one
    after the other, then completed jobs/s for n attempts launched back to back (a burst)."""
    launch_ms: list[float] = []
    running_ms: list[float] = []
    finished_ms: list[float] = []
    ids: list[str] = []
    for _ in range(n):
        attempt = _trivial_attempt(engine, command)
        t0 = time.perf_counter()
        engine.launch(attempt)
        launch_ms.append((time.perf_counter() - t0) * 1000)
        phase = AttemptPhase.PENDING
        while not phase.finished:
            phase = engine.poll([attempt.attempt_id])[attempt.attempt_id].phase
            if phase is not AttemptPhase.PENDING and len(running_ms) < len(launch_ms):
                running_ms.append((time.perf_counter() - t0) * 1000)
            if not phase.finished:
                time.sleep(0.001)
        finished_ms.append((time.perf_counter() - t0) * 1000)
        ids.append(attempt.attempt_id)
    _wait_all(engine, ids)
    burst = [_trivial_attempt(engine, command) for _ in range(n)]
    started = time.perf_counter()
    for attempt in burst:
        engine.launch(attempt)
    _wait_all(engine, [a.attempt_id for a in burst])
    elapsed = time.perf_counter() - started
    return {
        "launch_p50_ms": statistics.median(launch_ms),
        "launch_p99_ms": _pct(launch_ms, 0.99),
        "to_running_p50_ms": statistics.median(running_ms),
        "to_running_p99_ms": _pct(running_ms, 0.99),
        # a whole trivial job, one at a time: includes bwrap's set-up and the cgroup's removal
        "to_finished_p50_ms": statistics.median(finished_ms),
        "jobs_per_s": n / elapsed,
    }


def measure_subprocess(n: int = 50, command: str = "true") -> dict[str, float]:
    """The floor: the same commands started with plain subprocess, back to back."""
    start_ms: list[float] = []
    procs = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        procs.append(subprocess.Popen(["/bin/sh", "-c", command]))
        start_ms.append((time.perf_counter() - t0) * 1000)
    for p in procs:
        p.wait()
    elapsed = time.perf_counter() - started
    return {
        "launch_p50_ms": statistics.median(start_ms),
        "launch_p99_ms": _pct(start_ms, 0.99),
        "jobs_per_s": n / elapsed,
    }


class Comparison(TypedDict):
    jobs: int
    plain: dict[str, float]
    sandboxed: dict[str, float]  # empty where this machine cannot sandbox
    subprocess: dict[str, float]
    sandbox_cost_per_start_ms: NotRequired[float]
    sandbox_cost_per_job_ms: NotRequired[float]


def compare(n: int = 50, home: Path | None = None) -> Comparison:
    """Sandboxed vs plain local engine vs subprocess, measured in the same run."""
    with tempfile.TemporaryDirectory(prefix="corral-latency-") as tmp:
        base = home or Path(tmp)
        plain_engine = LocalEngine(base / "plain", "bench", virtual_gpus=0, isolation=False)
        try:
            plain = measure(plain_engine, n)
        finally:
            plain_engine.close()
        sandboxed_engine = LocalEngine(
            base / "sandboxed", "bench", virtual_gpus=0, cgroup_parent=f"corral-bench-{uuid.uuid4().hex[:6]}"
        )
        try:
            sandboxed = measure(sandboxed_engine, n) if sandboxed_engine.status.complete else {}
        finally:
            sandboxed_engine.close()
            sandboxed_engine.remove_cgroup_parent(wait_s=2.0)
        floor = measure_subprocess(n)
    result: Comparison = {"jobs": n, "plain": plain, "sandboxed": sandboxed, "subprocess": floor}
    if sandboxed:
        result["sandbox_cost_per_start_ms"] = sandboxed["to_running_p50_ms"] - plain["to_running_p50_ms"]
        result["sandbox_cost_per_job_ms"] = sandboxed["to_finished_p50_ms"] - plain["to_finished_p50_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    result = compare(args.jobs)
    for name in ("subprocess", "plain", "sandboxed"):
        figures = result[name]
        print(f"{name:>10}: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    if "sandbox_cost_per_start_ms" in result:
        print(f"sandbox cost per start: {result['sandbox_cost_per_start_ms']:.1f} ms (p50 to RUNNING)")
        print(
            f"sandbox cost per job: {result['sandbox_cost_per_job_ms']:.1f} ms (p50 of a whole trivial job)"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
