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
import os
import resource
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


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuMeter:
    """CPU time of this process and everything it starts (the launcher, supervisors, bwrap,
    slirp4netns, the jobs): a cgroup-v1 cpuacct group this process moves into, so supervisors
    that are reparented away and job processes in their own cpu/memory cgroups still count.
    Work the kernel does in its own threads (a network namespace's teardown) is not counted."""

    def __init__(self) -> None:
        self.dir = CPUACCT / f"corral-cpumeter-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir()
        self.home = Path(_cgroup_of("cpuacct"))
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    @staticmethod
    def available() -> bool:
        return (CPUACCT / "cpuacct.usage").exists() and os.access(CPUACCT, os.W_OK)

    def used_s(self) -> float:
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9

    def close(self) -> None:
        (CPUACCT / self.home.relative_to("/") / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):  # the last supervisors may still be leaving
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _cgroup_of(controller: str) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


def cpu_per_job(engine: LocalEngine, meter: CpuMeter, n: int, command: str = "true") -> dict[str, float]:
    """CPU ms per trivial job for n jobs launched back to back: launch() in this process, and
    everything outside it (launcher, supervisor, sandbox, job, clean-up). This process' polling
    while it waits is left out (the server polls all live attempts at once, every 0.1 s)."""
    burst = [_trivial_attempt(engine, command) for _ in range(n)]
    before, own_before, in_launch = meter.used_s(), _own_cpu_s(), 0.0
    for attempt in burst:
        t0 = time.thread_time()
        engine.launch(attempt)
        in_launch += time.thread_time() - t0
    pending = {a.attempt_id for a in burst}
    while pending:
        time.sleep(0.05)
        pending -= {a for a, s in engine.poll(pending).items() if s.phase.finished}
    time.sleep(0.2)  # supervisors write status.json before their last exit
    outside = (meter.used_s() - before) - (_own_cpu_s() - own_before)
    return {
        "cpu_ms_per_job": 1000 * (outside + in_launch) / n,
        "launch_cpu_ms_per_job": 1000 * in_launch / n,
    }


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_costs(n: int = 100, command: str = "true") -> dict[str, dict[str, float]]:
    """CPU per job of each isolation level, in one run: plain engine, sandboxed without a network
    namespace (host network), sandboxed (the default, own namespace), and plain subprocess."""
    meter = CpuMeter()
    out: dict[str, dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="corral-cpu-") as tmp:
            levels = {"plain": {"isolation": False}, "hostnet": {"job_network": "host"}, "sandboxed": {}}
            for name, options in levels.items():
                engine = LocalEngine(
                    Path(tmp) / name,
                    "bench",
                    virtual_gpus=0,
                    cgroup_parent=f"corral-bench-{uuid.uuid4().hex[:6]}",
                    **options,  # type: ignore[arg-type]
                )
                try:
                    measure_one = cpu_per_job(engine, meter, 10, command)  # warm: launcher, caches
                    out[name] = cpu_per_job(engine, meter, n, command) if measure_one else {}
                finally:
                    engine.close()
                    engine.remove_cgroup_parent(wait_s=2.0)
        before = meter.used_s()
        procs = [subprocess.Popen(["/bin/sh", "-c", command]) for _ in range(n)]
        for p in procs:
            p.wait()
        out["subprocess"] = {"cpu_ms_per_job": 1000 * (meter.used_s() - before) / n}
    finally:
        meter.close()
    return out


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
    parser.add_argument("--cpu", action="store_true", help="CPU per job instead (cpuacct, root)")
    args = parser.parse_args()
    if args.cpu:
        if not CpuMeter.available():
            raise SystemExit("--cpu needs a writable cgroup-v1 cpuacct hierarchy (root)")
        costs = cpu_costs(args.jobs)
        for level, cost in costs.items():
            print(f"{level:>10}: " + ", ".join(f"{k}={v:.2f}" for k, v in cost.items()))
        print(json.dumps(costs))
        return
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
