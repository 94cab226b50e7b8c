"""Submit -> running latency and completed jobs/s: Corral's engines next to their floors, one run.

Same trivial job everywhere (`date +%s.%N`, 0.01 CPU, 16 MiB), submitted at a steady rate, to:
corral (real server, local engine, sandboxed: the default, so each job in its own network
namespace without outbound access), hostnet (sandboxed, but CORRAL_JOB_NETWORK=host), internet
(sandboxed, CORRAL_JOB_OUTBOUND=internet: slirp4netns per job), unsandboxed (CORRAL_ISOLATION=false),
subprocess (plain Popen: the floor), and with --engine slurm, on a 3-node Slurm cluster started here,
slurm (Corral with CORRAL_ENGINE=slurm, via its API) and sbatch (Slurm's own `sbatch --wrap`).
submit = just before the POST/Popen/sbatch; running = the time the command printed (read back from
its log): one clock for all columns. The engine's `started_at` is taken before the sandbox is built,
so `started_at -> running` p50, sandboxed minus unsandboxed, is the sandbox's cost per job start;
corral minus hostnet is what the network namespace adds, internet minus hostnet what slirp4netns adds.
jobs/s = jobs / (first submit -> last end); Slurm ends are first-seen by one `squeue --Format` poller
(0.1 s; Slurm's own times are whole seconds), after a few uncounted sbatch jobs warm slurmctld up.
--slurm-burst N adds both Slurm columns again with N jobs submitted at once (slurm_burst, sbatch_burst);
--slurm-no-ahead adds the Corral-on-Slurm columns again with CORRAL_SLURM_QUEUE_AHEAD=0 (no job handed
to Slurm before its slot is free: server/ahead.py); --slurm-queue-ahead and --slurm-launch-workers set
CORRAL_SLURM_QUEUE_AHEAD and CORRAL_SLURM_LAUNCH_WORKERS for the Corral-on-Slurm columns (the server
does not take CORRAL_* settings from the bench's environment); --slurm-only skips the local columns. The Slurm
column also splits Corral's submit -> running into phases from the job's own transition events
(submit -> scheduled -> sbatch returned -> the command ran), and both Slurm columns split theirs at
slurmctld's taking and allocating each job, read from its log (submit_to_slurmctld, slurmctld_queue,
allocated_to_command).

Saturation (local engine): --saturate N adds the sandboxed, unsandboxed and subprocess columns again
with N jobs submitted at once (sat_, sat_unsandboxed_, sat_baseline_); --ramp offers each of the
three modes rates from --ramp-from, --ramp-by higher every step of --ramp-step-s seconds (one server
per mode), until a step is not sustained (p99 over --ramp-p99-ms, or < 90% of the offered rate
completed: a backlog), and reports the highest sustained step per mode; --local-only skips the
steady-rate columns. Every Corral column also reports CPU per job over its window (first submit ->
last end): server_cpu_ms_per_job (the server process) and all_cpu_ms_per_job (everything this bench
started, itself included, via a cgroup-v1 cpuacct group; where there is none: null); both Slurm
columns also split that CPU by process (cpu_<part>_ms_per_job, CPU_PARTS: the server, the Slurm tools
it ran, slurmctld, munged, the slurmds, the job steps with their scripts and sandbox, this bench,
other). --profile DIR
runs each server under cProfile (CORRAL_PROFILE_OUT, every thread on its own CPU clock) and prints
its top entries.

    python bench/job_latency.py [--jobs 500] [--rate 60] [--engine local|slurm] [--slurm-jobs 40]
                                [--no-network-columns] [--saturate 300] [--ramp] [--profile DIR]

Last line: one JSON object, submit_to_running_p50_ms/_p99_ms and jobs_per_s (sandboxed local engine),
the same prefixed baseline_ (subprocess), unsandboxed_, hostnet_, internet_, slurm_, sbatch_, sat_...;
sandbox_cost_per_start_ms, netns_cost_per_start_ms, slirp_cost_per_start_ms; with --ramp
max_sustained_jobs_per_s (and unsandboxed_, baseline_), ramp_steps, and their sandboxed/unsandboxed.
Targets (issue 19): p99 < 150 ms at 60/s; >= 150 jobs/s sustained sandboxed (or, where the sandbox's
own CPU per start makes that impossible on 2 cores, sandboxed >= 0.9x unsandboxed): docs/isolation.md.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "src"):  # corral (src layout) and the Slurm harness under tests/
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import psutil  # noqa: E402

from bench.slurm_watch import (  # noqa: E402
    SLURM_PHASES,
    SLURM_SIDE_PHASES,
    add_phases,
    add_slurm_side,
    squeue_watcher,
    wait_ended,
)
from tests.server_harness import CorralServer, start_server  # noqa: E402

COMMAND = "date +%s.%N"
SPEC: dict[str, Any] = {"cpus": 0.01, "memory": "16MiB", "gpus": 0}
LIVE = "queued,scheduled,starting,running,preempted"
NO_AHEAD = {"CORRAL_SLURM_QUEUE_AHEAD": "0"}  # --slurm-no-ahead's columns (server/ahead.py)
NO_RATE_LIMITS = {"CORRAL_RATE_SUBMIT_PER_MIN": "0", "CORRAL_RATE_LOGS_PER_MIN": "0"}
T = TypeVar("T")


@dataclass
class Result:
    latencies_s: list[float] = field(default_factory=list)  # submit -> the command's own clock
    start_cost_s: list[float] = field(default_factory=list)  # engine started_at -> command (local)
    to_engine_s: list[float] = field(default_factory=list)  # submit -> engine started_at (local)
    # Slurm column: when each job reached each state, from its transition events (Corral's clock)
    phases: dict[str, list[float]] = field(default_factory=dict)
    jobs_per_s: float = 0.0
    failed: int = 0
    # CPU per job over the measured window (first submit -> all ended; the read-back not counted):
    # the server process alone (its loops, API and launch pool), and everything (cpuacct: server,
    # launcher, supervisors, sandboxes, jobs and this bench's own submitting), when measurable
    server_cpu_ms_per_job: float | None = None
    all_cpu_ms_per_job: float | None = None
    # Slurm columns: the same window's CPU per job by process (CPU_PARTS), where measurable
    cpu_split_ms_per_job: dict[str, float] = field(default_factory=dict)
    # Slurm columns: (Slurm job name, submit, the command's own time) of each job, for the split
    # of Slurm's own part read from slurmctld's log (add_slurm_side)
    slurm_jobs: list[tuple[str, float, float]] = field(default_factory=list)

    def finish(self, first: float, ends: list[float]) -> Result:
        self.jobs_per_s = len(self.latencies_s) / max(1e-9, max(ends, default=first) - first)
        return self


def ms(values: list[float], q: float) -> float | None:
    """The q-th percentile in ms; None (JSON null) when nothing was measured."""
    ordered = sorted(values)
    if not ordered:
        return None
    return round(1000 * ordered[max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))], 2)


def printed_time(text: str) -> float | None:
    """The time `date +%s.%N` printed, or None when the log holds no such line."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def paced(n: int, rate: float, fn: Callable[[int], T], workers: int = 8) -> list[T]:
    """Call fn(i) for i in range(n), the i-th at start + i / rate (rate 0: all at once)."""
    start = time.time() + 0.05
    with ThreadPoolExecutor(workers) as pool:
        futures = []
        for i in range(n):
            delay = start + (i / rate if rate > 0 else 0.0) - time.time()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(fn, i))
        return [f.result() for f in futures]


# ---- Corral through its REST API ---------------------------------------------------------------------
def submit_jobs(
    srv: CorralServer, n: int, rate: float, tag: str, resources: Mapping[str, Any]
) -> list[tuple[int, float]]:
    """POST n trivial jobs at `rate`/s; [(job id, time just before its POST)]."""
    local = threading.local()

    def submit(i: int) -> tuple[int, float]:
        if not hasattr(local, "client"):
            local.client = srv.client(timeout=30.0)
        spec = {"name": f"bench-{tag}-{i}", "tasks": {"main": {"command": COMMAND, "resources": resources}}}
        t0 = time.time()
        r = local.client.post("/api/v1/jobs", json=spec)
        if r.status_code != 201:
            raise RuntimeError(f"submit of job {i} refused: {r.status_code} {r.text}")
        return int(r.json()["id"]), t0

    return paced(n, rate, submit)


def wait_done(srv: CorralServer, timeout_s: float) -> None:
    """Wait until no job is live any more."""
    with srv.client(timeout=30.0) as c:
        deadline = time.time() + timeout_s
        while c.get("/api/v1/jobs", params={"state": LIVE, "limit": 1}).json()["total"] > 0:
            if time.time() > deadline:
                raise TimeoutError(f"jobs still live after {timeout_s} s")
            time.sleep(0.2)


def finished_jobs(srv: CorralServer, ids: list[int], timeout_s: float) -> list[tuple[dict[str, Any], str]]:
    """Wait until no job is live any more, then read every job and its log back."""
    wait_done(srv, timeout_s)
    with srv.client(timeout=30.0) as c:
        out = []
        for job_id in ids:
            logs = c.get(f"/api/v1/jobs/{job_id}/logs")
            job = c.get(f"/api/v1/jobs/{job_id}").json()
            out.append((job, logs.json()["data"] if logs.is_success else ""))
        return out


@contextmanager
def corral_server(label: str, args: argparse.Namespace, env: Mapping[str, str]) -> Iterator[CorralServer]:
    """A Corral server with `env` for one column (with --profile: under cProfile, its top entries
    printed once it stopped)."""
    profile = Path(args.profile) / f"{label}.pstats" if getattr(args, "profile", None) else None
    srv = start_server(
        Path(tempfile.mkdtemp(prefix=f"corral-bench-{label}-")) / "home",
        database_url=args.database_url,
        virtual_gpus=0,
        # the bench submits and reads back hundreds of jobs with one token: the API's rate
        # limits (their own tests cover them) would refuse it, measuring the limit, not the path
        extra_env={
            "CORRAL_LOG_LEVEL": "WARNING",
            **NO_RATE_LIMITS,
            **env,
            **({"CORRAL_PROFILE_OUT": str(profile)} if profile else {}),
        },
        allow_unisolated=False,  # the sandboxed column measures the sandbox, or fails
    )
    try:
        yield srv
    finally:
        srv.stop(timeout_s=60.0 if profile else 10.0)
        shutil.rmtree(srv.home.parent, ignore_errors=True)
    if profile is not None:
        print_profile(label, profile)


def print_profile(label: str, path: Path, top: int = 25) -> None:
    """The profile's top entries by own time and by cumulative time (server-side CPU)."""
    import io
    import pstats

    if not path.exists():
        print(f"{label}: no profile written to {path}")
        return
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        stats = pstats.Stats(str(path), stream=buf)
        stats.sort_stats(key).print_stats(top)
        body = buf.getvalue()
        print(f"\n---- profile of the {label} server, top {top} by {key} ({path}) ----")
        print(body[body.find("   ncalls") :].rstrip())


METER: Any = None  # corral.engine.local.latency.CpuMeter, when this machine has cpuacct (v1)


def process_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def tree_cpu_s(pid: int) -> float:
    """A process's own CPU plus what its children that it reaped used (their children's too, as
    far as each waited for them): a short-lived tool's CPU shows up in the process that ran it."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system + t.children_user + t.children_system)


# The Slurm columns' CPU by process (cpu_split): the Corral server's own, the Slurm tools it ran
# (sbatch, squeue, scancel: reaped by it), slurmctld, munged, the slurmds, the job steps
# (slurmstepd, batch.sh -> node.sh -> rank script -> bwrap -> the command: reaped by each node's
# namespace init), this bench (its submitting, the squeue watcher, plain sbatch's calls), and
# whatever else the cpuacct group saw (other = all - the rest).
CPU_PARTS = ("server", "server_tools", "slurmctld", "munged", "slurmd", "steps", "bench", "other")
SLURM_PIDS: Callable[[], dict[str, list[int]]] | None = None  # set by run_slurm: part -> pids


class CpuSplit:
    """CPU per part (CPU_PARTS) over a window: taken at creation, read by per_job_ms."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        if SLURM_PIDS is None:
            return {}
        pids = SLURM_PIDS()
        out = {part: sum(tree_cpu_s(p) for p in pids.get(part, [])) for part in CPU_PARTS[2:7]}
        out["bench"] = tree_cpu_s(os.getpid())
        if self.server_pid is not None:
            own = process_cpu_s(self.server_pid)
            out["server"], out["server_tools"] = own, tree_cpu_s(self.server_pid) - own
        if METER is not None:
            out["all"] = METER.used_s()
        return out

    def per_job_ms(self, n: int) -> dict[str, float]:
        end = self._now()
        used = {k: end[k] - self.start.get(k, 0.0) for k in end}
        if "all" in used:
            used["other"] = used.pop("all") - sum(used.values())
        return {k: round(1000 * used[k] / n, 2) for k in CPU_PARTS if k in used}


class CpuWindow:
    """CPU used from now on: by process `pid` (None: not measured) and by everything (METER)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.own = process_cpu_s(pid) if pid is not None else 0.0
        self.all = METER.used_s() if METER is not None else 0.0

    def per_job_ms(self, n: int) -> tuple[float | None, float | None]:
        own = 1000 * (process_cpu_s(self.pid) - self.own) / n if self.pid is not None else None
        everything = 1000 * (METER.used_s() - self.all) / n if METER is not None else None
        return (round(own, 2) if own is not None else None), (round(everything, 2) if everything else None)


def measure_jobs(
    srv: CorralServer,
    n: int,
    rate: float,
    label: str,
    args: argparse.Namespace,
    watcher: dict[str, dict[int, float]] | None = None,
) -> Result:
    """Submit n jobs at `rate` to a running server, wait for all, read back. End times from the
    engine or from `watcher`."""
    # Slurm allocates whole CPUs (as the sbatch reference asks: 1): ask the same through Corral,
    # or Corral's scheduler would pack fractional-CPU jobs that Slurm then runs a few at a time.
    resources = {**SPEC, "cpus": max(1.0, float(SPEC["cpus"]))} if watcher else SPEC
    cpu, split = CpuWindow(srv.pid), CpuSplit(srv.pid)
    submitted = submit_jobs(srv, n, rate, label, resources)
    wait_done(srv, args.timeout)
    res, ends = Result(), []
    res.server_cpu_ms_per_job, res.all_cpu_ms_per_job = cpu.per_job_ms(n)
    res.cpu_split_ms_per_job = split.per_job_ms(n)
    jobs = finished_jobs(srv, [job_id for job_id, _ in submitted], args.timeout)
    for (_, t0), (job, log) in zip(submitted, jobs, strict=True):
        ran = printed_time(log)
        attempt = job["attempts"][-1] if job["attempts"] else None
        if job["state"] != "succeeded" or attempt is None or ran is None:
            if not res.failed:  # say why once: a column of failures is a setup problem
                print(f"{label}: job {job['id']} {job['state']}: {job['reason']!r}, log {log[:200]!r}")
            res.failed += 1
            continue
        res.latencies_s.append(ran - t0)
        if watcher is not None:  # the Slurm engine names each Slurm job corral-<job id>.<attempt>
            name = f"corral-{job['id']}.{attempt['number']}"  # ids restart with each server
            ends.append(wait_ended(watcher, name, args.timeout, since=submitted[0][1]))
            add_phases(res.phases, job, t0, ran)
            res.slurm_jobs.append((name, t0, ran))
        else:
            res.start_cost_s.append(ran - attempt["started_at"])
            res.to_engine_s.append(attempt["started_at"] - t0)
            ends.append(job["finished_at"] or attempt["ended_at"])
    return res.finish(min(t0 for _, t0 in submitted), ends)


def run_corral(
    label: str,
    args: argparse.Namespace,
    env: Mapping[str, str],
    watcher: dict[str, dict[int, float]] | None = None,
) -> Result:
    """One server with `env`: submit, wait, read back."""
    n, rate = (args.slurm_jobs, args.slurm_rate) if watcher else (args.jobs, args.rate)
    with corral_server(label, args, env) as srv:
        return measure_jobs(srv, n, rate, label, args, watcher)


def run_baseline(args: argparse.Namespace, n: int | None = None, rate: float | None = None) -> Result:
    n = args.jobs if n is None else n
    rate = args.rate if rate is None else rate
    done: list[tuple[float, float, float | None]] = []  # (submit, reaped, printed time)
    lock = threading.Lock()

    def start(_i: int) -> None:
        t0 = time.time()
        proc = subprocess.Popen(["/bin/sh", "-c", COMMAND], stdout=subprocess.PIPE, text=True)

        def reap() -> None:
            out, _ = proc.communicate()
            with lock:
                done.append((t0, time.time(), printed_time(out)))

        threading.Thread(target=reap, daemon=True).start()

    first, cpu = time.time(), CpuWindow(None)
    paced(n, rate, start)
    while len(done) < n:
        time.sleep(0.01)
    res = Result(latencies_s=[ran - t0 for t0, _, ran in done if ran is not None])
    res.all_cpu_ms_per_job = cpu.per_job_ms(n)[1]
    res.failed = n - len(res.latencies_s)
    return res.finish(first, [end for _, end, _ in done])


# ---- saturation: all at once, and a ramp of offered rates -------------------------------------------
LOCAL_MODES = {  # prefix -> (label, server env); None: plain subprocess
    "": ("sandboxed", {}),
    "unsandboxed_": ("unsandboxed", {"CORRAL_ISOLATION": "false"}),
    "baseline_": ("subprocess", None),
}


def run_saturated(args: argparse.Namespace) -> dict[str, Result]:
    """--saturate N: N jobs submitted at once to each local mode (columns sat_*)."""
    burst = argparse.Namespace(**{**vars(args), "jobs": args.saturate, "rate": 0.0})
    out = {}
    for prefix, (label, env) in LOCAL_MODES.items():
        if env is None:
            out[f"sat_{prefix}"] = run_baseline(burst)
        else:
            out[f"sat_{prefix}"] = run_corral(f"sat-{label}", burst, env)
    return out


@dataclass
class RampStep:
    offered: float
    result: Result
    sustained: bool


def sustained(res: Result, offered: float, p99_limit_ms: float) -> bool:
    """A step is sustained when every job ran, p99 submit -> running stayed under the limit and
    jobs completed at >= 90% of the offered rate (no backlog built up over the step)."""
    p99 = ms(res.latencies_s, 99)
    return res.failed == 0 and p99 is not None and p99 <= p99_limit_ms and res.jobs_per_s >= 0.9 * offered


def ramp(
    label: str, args: argparse.Namespace, measure: Callable[[int, float], Result], stride: float = 1.0
) -> list[RampStep]:
    """Offered rates from --ramp-from, --ramp-by (times `stride`) higher each step (--ramp-step-s
    seconds of jobs each), until a step is not sustained or --ramp-to is passed."""
    steps: list[RampStep] = []
    rate = args.ramp_from
    while rate <= args.ramp_to:
        res = measure(max(20, round(rate * args.ramp_step_s)), rate)
        ok = sustained(res, rate, args.ramp_p99_ms)
        steps.append(RampStep(rate, res, ok))
        print(
            f"ramp {label}: offered {rate:.0f}/s -> {res.jobs_per_s:.1f} jobs/s, p50 "
            f"{cell(ms(res.latencies_s, 50), 0)} ms, p99 {cell(ms(res.latencies_s, 99), 0)} ms, "
            f"failed {res.failed}, CPU/job server {cell(res.server_cpu_ms_per_job, 0)} ms, all "
            f"{cell(res.all_cpu_ms_per_job, 0)} ms: {'sustained' if ok else 'not sustained'}, "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if not ok:
            break
        rate += args.ramp_by * stride
    return steps


def run_ramps(args: argparse.Namespace) -> dict[str, list[RampStep]]:
    """One ramp per local mode; one server per mode, the steps one after the other on it."""
    out = {}
    for prefix, (label, env) in LOCAL_MODES.items():
        if env is None:
            # the floor is far above the engine's: coarser steps (its ramp is a reference)
            out[prefix] = ramp(label, args, lambda n, rate: run_baseline(args, n, rate), stride=5.0)
            continue
        with corral_server(f"ramp-{label}", args, env) as srv:
            out[prefix] = ramp(label, args, functools.partial(measure_jobs, srv, label=label, args=args))
    return out


def ramp_figures(ramps: Mapping[str, list[RampStep]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for prefix, steps in ramps.items():
        best = max((s for s in steps if s.sustained), key=lambda s: s.offered, default=None)
        out[f"{prefix}max_sustained_offered_per_s"] = best.offered if best else None
        out[f"{prefix}max_sustained_jobs_per_s"] = round(best.result.jobs_per_s, 2) if best else None
        out[f"{prefix}ramp_steps"] = [
            {
                "offered": s.offered,
                "jobs_per_s": round(s.result.jobs_per_s, 2),
                "p50_ms": ms(s.result.latencies_s, 50),
                "p99_ms": ms(s.result.latencies_s, 99),
                "failed": s.result.failed,
                "sustained": s.sustained,
                "server_cpu_ms_per_job": s.result.server_cpu_ms_per_job,
                "all_cpu_ms_per_job": s.result.all_cpu_ms_per_job,
            }
            for s in steps
        ]
    sandboxed, plain = out.get("max_sustained_jobs_per_s"), out.get("unsandboxed_max_sustained_jobs_per_s")
    ratio = round(sandboxed / plain, 3) if sandboxed and plain else None
    out["sandboxed_over_unsandboxed_max_sustained"] = ratio
    return out


# ---- Slurm -------------------------------------------------------------------------------------------


def run_sbatch(
    args: argparse.Namespace, cluster: Any, ended: dict[str, dict[int, float]], tag: str = "sbatch"
) -> Result:
    """The same command as plain sbatch jobs, with the requests the Slurm engine makes."""
    nodes, out_dir = cluster.node_names, cluster.base / "out"

    def submit(i: int) -> tuple[str, float]:
        name = f"{tag}-{i}"
        t0 = time.time()
        subprocess.run(
            [
                *("sbatch", "--parsable", f"--job-name={name}", f"--nodelist={nodes[i % len(nodes)]}"),
                *("--ntasks=1", "--cpus-per-task=1", "--mem=16M", "--no-requeue", "--export=ALL"),
                *(f"--output={out_dir}/{name}.out", f"--wrap={COMMAND}"),
            ],
            env=cluster.env,
            capture_output=True,
            check=True,
        )
        return name, t0

    cpu, split = CpuWindow(None), CpuSplit(None)
    submitted = paced(args.slurm_jobs, args.slurm_rate, submit)
    res = Result()
    ends = [wait_ended(ended, name, args.timeout) for name, _ in submitted]
    res.all_cpu_ms_per_job = cpu.per_job_ms(args.slurm_jobs)[1]
    res.cpu_split_ms_per_job = split.per_job_ms(args.slurm_jobs)
    for name, t0 in submitted:
        out = out_dir / f"{name}.out"
        ran = printed_time(out.read_text()) if out.exists() else None
        if ran is None:
            res.failed += 1
        else:
            res.latencies_s.append(ran - t0)
            res.slurm_jobs.append((name, t0, ran))
    return res.finish(min(t0 for _, t0 in submitted), ends)


def run_slurm(args: argparse.Namespace) -> dict[str, Result]:
    from tests.slurm.harness import SlurmCluster, missing_binaries
    from tests.slurm.helpers import server_env

    missing = missing_binaries()
    if missing:
        raise SystemExit(f"--engine slurm needs these Slurm/munge programs: {', '.join(missing)}")
    global SLURM_PIDS
    with SlurmCluster() as cluster:
        print(f"slurm: {len(cluster.node_names)} nodes up in {cluster.started_in_s:.1f} s", flush=True)
        SLURM_PIDS = cluster.daemon_pids

        def corral_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
            """Each Corral server its own state dir: a new server numbers its jobs from 1 again,
            and the engine would take attempt 1.1 for the one it launched before (idempotence)."""
            # a deployment's settings on the harness, as tests/slurm's servers get them: user map,
            # state and storage dirs, GPU device files, group gids with Unix groups, command timeout
            env = server_env(cluster, cluster.new_state_dir())
            if args.slurm_queue_ahead is not None:
                env["CORRAL_SLURM_QUEUE_AHEAD"] = str(args.slurm_queue_ahead)
            if args.slurm_launch_workers is not None:
                env["CORRAL_SLURM_LAUNCH_WORKERS"] = str(args.slurm_launch_workers)
            env.update(extra or {})
            # the harness's nodes have GPUs; Corral on Slurm keeps GPU nodes for GPU work by default
            env["CORRAL_CPU_JOBS_ON_GPU_NODES"] = "true"
            return env

        with squeue_watcher(cluster.env) as ended:
            # not counted: the first jobs after slurmctld starts were ~2 s slower (bench/slurm_latency.py)
            run_sbatch(argparse.Namespace(**{**vars(args), "slurm_jobs": 3}), cluster, ended, "warmup")
            out = {"sbatch": run_sbatch(args, cluster, ended)}
            out["slurm"] = run_corral("slurm", args, corral_env(), ended)
            if args.slurm_no_ahead:  # the same, no job handed to Slurm before its slot is free
                out["slurm_noahead"] = run_corral("slurm", args, corral_env(NO_AHEAD), ended)
            if args.slurm_burst:  # all at once: Slurm's queue and Corral's both hold hundreds
                burst = argparse.Namespace(**{**vars(args), "slurm_jobs": args.slurm_burst, "slurm_rate": 0})
                out["sbatch_burst"] = run_sbatch(burst, cluster, ended, "burst")
                out["slurm_burst"] = run_corral("slurm", burst, corral_env(), ended)
                if args.slurm_no_ahead:
                    out["slurm_burst_noahead"] = run_corral("slurm", burst, corral_env(NO_AHEAD), ended)
            add_slurm_side(out, ended, cluster.base / "log" / "slurmctld.log")
    return out


# ---- report ------------------------------------------------------------------------------------------
COLUMNS = {"": "corral", "unsandboxed_": "unsandboxed", "baseline_": "subprocess", "slurm_": "slurm"}
COLUMNS.update(sbatch_="sbatch", hostnet_="hostnet", internet_="internet")
COLUMNS.update(slurm_burst_="slurm_burst", sbatch_burst_="sbatch_burst")
COLUMNS.update(slurm_noahead_="slurm_noahead", slurm_burst_noahead_="burst_noahead")
COLUMNS.update(sat_="sat_corral", sat_unsandboxed_="sat_unsandboxed", sat_baseline_="sat_subprocess")
SLURM_RATIOS = {  # (column, its sbatch reference) pairs, printed as column/sbatch where both ran
    "slurm/sbatch": ("slurm_", "sbatch_"),
    "noahead/sbatch": ("slurm_noahead_", "sbatch_"),
    "burst slurm/sbatch": ("slurm_burst_", "sbatch_burst_"),
    "burst noahead/sbatch": ("slurm_burst_noahead_", "sbatch_burst_"),
}
# the engine's started_at is ours
LOCAL_COLUMNS = ("", "unsandboxed_", "hostnet_", "internet_", "sat_", "sat_unsandboxed_")
RATIOS = {"corral/subprocess": ("", "baseline_"), "corral/unsandboxed": ("", "unsandboxed_")}
RATIOS["sat corral/unsandboxed"] = ("sat_", "sat_unsandboxed_")
ROWS = ("submit_to_running_p50_ms", "submit_to_running_p99_ms", "jobs_per_s")
CPU_ROWS = ("server_cpu_ms_per_job", "all_cpu_ms_per_job")


def figures(results: Mapping[str, Result], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(args, k) for k in ("jobs", "rate", "cpus", "engine", "saturate")}
    for prefix, res in results.items():
        out[f"{prefix}submit_to_running_p50_ms"] = ms(res.latencies_s, 50)
        out[f"{prefix}submit_to_running_p99_ms"] = ms(res.latencies_s, 99)
        out[f"{prefix}jobs_per_s"] = round(res.jobs_per_s, 2)
        out[f"{prefix}failed"] = res.failed
        out[f"{prefix}server_cpu_ms_per_job"] = res.server_cpu_ms_per_job
        out[f"{prefix}all_cpu_ms_per_job"] = res.all_cpu_ms_per_job
        for part, value in res.cpu_split_ms_per_job.items():
            out[f"{prefix}cpu_{part}_ms_per_job"] = value
        for phase, values in res.phases.items():
            out[f"{prefix}{phase}_p50_ms"], out[f"{prefix}{phase}_p99_ms"] = ms(values, 50), ms(values, 99)
        if prefix in LOCAL_COLUMNS:
            for q in (50, 99):
                out[f"{prefix}submit_to_engine_start_p{q}_ms"] = ms(res.to_engine_s, q)
                out[f"{prefix}engine_start_to_running_p{q}_ms"] = ms(res.start_cost_s, q)
    sandboxed, plain = (out.get(p + "engine_start_to_running_p50_ms") for p in ("", "unsandboxed_"))
    out["sandbox_cost_per_start_ms"] = round(sandboxed - plain, 2) if sandboxed and plain else None
    if "sat_" in results:  # the sandbox's start cost under a burst, the same way
        start_cost = "engine_start_to_running_p50_ms"
        sandboxed, plain = (out.get(p + start_cost) for p in ("sat_", "sat_unsandboxed_"))
        out["sat_sandbox_cost_per_start_ms"] = round(sandboxed - plain, 2) if sandboxed and plain else None
        x, y = out["sat_jobs_per_s"], out["sat_unsandboxed_jobs_per_s"]
        out["sat_sandboxed_over_unsandboxed_jobs_per_s"] = round(x / y, 3) if y else None
    if "hostnet_" in results:
        hostnet = out["hostnet_engine_start_to_running_p50_ms"]
        internet = out["internet_engine_start_to_running_p50_ms"]
        out["netns_cost_per_start_ms"] = round(sandboxed - hostnet, 2) if sandboxed and hostnet else None
        out["slirp_cost_per_start_ms"] = round(internet - hostnet, 2) if internet and hostnet else None
    if "slurm_" in results:
        out.update(slurm_jobs=args.slurm_jobs, slurm_rate=args.slurm_rate, slurm_burst=args.slurm_burst)
        for a, b in SLURM_RATIOS.values():
            for key in ROWS if a in results else ():
                x, y = out[a + key], out[b + key]
                out[f"{a}over_{b}{key}"] = round(x / y, 3) if x is not None and y else None
    out["load_avg_1m_start"], out["load_avg_1m"] = args.load_at_start, round(os.getloadavg()[0], 2)
    return out


def cell(value: float | None, width: int = 12) -> str:
    return f"{value:>{width}.2f}" if value is not None else f"{'-':>{width}}"


def print_table(out: Mapping[str, Any], prefixes: list[str]) -> None:
    ratios = {k: v for k, v in RATIOS.items() if v[0] in prefixes and v[1] in prefixes}
    ratios.update({k: (a, b) for k, (a, b) in SLURM_RATIOS.items() if a in prefixes})
    print(f"\n{'':26}" + "".join(f"{COLUMNS[p]:>14}" for p in prefixes) + "".join(f"{r:>22}" for r in ratios))
    for key in ROWS:
        cells = "".join(cell(out[p + key], 14) for p in prefixes)
        quotients = [(out[a + key], out[b + key]) for a, b in ratios.values()]
        print(
            f"{key:26}{cells}"
            + "".join(cell(x / y if x is not None and y else None, 22) for x, y in quotients)
        )
    for key in CPU_ROWS:
        print(f"{key:26}" + "".join(cell(out[p + key], 14) for p in prefixes))
    for key in (f"cpu_{part}_ms_per_job" for part in CPU_PARTS):
        if any(p + key in out for p in prefixes):
            print(f"  {key:24}" + "".join(cell(out.get(p + key), 14) for p in prefixes))
    for p in (c for c in LOCAL_COLUMNS if c in prefixes):
        for q in ("p50", "p99"):
            a, b = (
                cell(out[p + k], 0)
                for k in (f"submit_to_engine_start_{q}_ms", f"engine_start_to_running_{q}_ms")
            )
            print(f"{COLUMNS[p]}: submit -> engine started_at {a} ms -> running {b} ms ({q})")
    if "" in prefixes:
        cost = cell(out["sandbox_cost_per_start_ms"], 0)
        print(f"sandbox cost per job start (started_at -> running): {cost} ms")
    if "sat_" in prefixes:
        cost = cell(out["sat_sandbox_cost_per_start_ms"], 0)
        print(f"saturated ({out['saturate']} at once): sandbox cost per job start {cost} ms")
    if "hostnet_" in prefixes:
        netns, slirp = (cell(out[k], 0) for k in ("netns_cost_per_start_ms", "slirp_cost_per_start_ms"))
        print(f"network per job start (p50 vs hostnet): own namespace {netns} ms, + slirp4netns {slirp} ms")
    for p in (c for c in prefixes if c.startswith("slurm")):
        for q in ("p50", "p99"):
            steps = [(k, out.get(f"{p}{k}_{q}_ms")) for k in SLURM_PHASES]
            print(f"{COLUMNS[p]} ({q}): " + ", ".join(f"{k} {cell(v, 0)} ms" for k, v in steps))
    for p in (c for c in prefixes if c.startswith(("slurm", "sbatch"))):
        steps = [(k, out.get(f"{p}{k}_p50_ms")) for k in SLURM_SIDE_PHASES]
        if any(v is not None for _, v in steps):
            print(f"{COLUMNS[p]} in Slurm (p50): " + ", ".join(f"{k} {cell(v, 0)} ms" for k, v in steps))
    print("failed: " + ", ".join(f"{COLUMNS[p]} {out[p + 'failed']}" for p in prefixes))
    if any(p in prefixes for p in LOCAL_COLUMNS):
        print("targets, local: p99 < 150 ms at 60/s; >= 150 jobs/s (or sandboxed >= 0.9x unsandboxed)")
    if "slurm_" in prefixes:
        print("targets, slurm vs sbatch: p50 <= 1.2x, p99 <= 1.5x, jobs/s >= 0.9x (also for a burst)")
    print(
        f"load average (1 min) {out['load_avg_1m_start']} at the start, "
        f"{out['load_avg_1m']} at the end (the bench's own jobs count)"
    )


def print_ramps(
    out: Mapping[str, Any], ramps: Mapping[str, list[RampStep]], args: argparse.Namespace
) -> None:
    limit = f"p99 <= {args.ramp_p99_ms:.0f} ms and >= 90% of the offered rate completed"
    print(f"\nmax sustained rate ({limit}), {args.ramp_step_s:.0f} s per step:")
    for prefix in ramps:
        label = LOCAL_MODES[prefix][0]
        offered, done = out[f"{prefix}max_sustained_offered_per_s"], out[f"{prefix}max_sustained_jobs_per_s"]
        print(f"  {label:12} offered {cell(offered, 0)}/s, completed {cell(done, 0)} jobs/s")
    ratio = out["sandboxed_over_unsandboxed_max_sustained"]
    print(f"  sandboxed / unsandboxed: {cell(ratio, 0)}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    add = parser.add_argument
    add("--jobs", type=int, default=500, help="jobs per local column (default 500)")
    add("--rate", type=float, default=60.0, help="submissions per second (0: all at once)")
    add("--engine", choices=("local", "slurm"), default="local", help="slurm: add slurm + sbatch")
    add("--slurm-jobs", type=int, default=40, help="jobs per Slurm column (default 40)")
    add("--slurm-rate", type=float, default=5.0, help="Slurm submissions per second (default 5)")
    add("--cpus", type=float, default=0.01, help="CPUs each job asks (default 0.01)")
    add("--database-url", default=None, help="default: SQLite in a temp home")
    add("--timeout", type=float, default=300.0, help="seconds to wait for all jobs")
    add("--no-network-columns", action="store_true", help="skip the hostnet and internet columns")
    add("--local-only", action="store_true", help="skip the steady-rate columns (with --saturate/--ramp)")
    add("--saturate", type=int, default=0, help="also submit N jobs at once to each local mode (sat_*)")
    add("--ramp", action="store_true", help="also ramp the offered rate per local mode (max sustained)")
    add("--ramp-from", type=float, default=40.0, help="first offered rate of the ramp (default 40/s)")
    add("--ramp-by", type=float, default=20.0, help="offered rate added each step (default 20/s)")
    add("--ramp-to", type=float, default=400.0, help="last offered rate tried (default 400/s)")
    add("--ramp-step-s", type=float, default=5.0, help="seconds of jobs per step (default 5)")
    add("--ramp-p99-ms", type=float, default=500.0, help="a step with a higher p99 is not sustained")
    add("--profile", default=None, help="dir: run each Corral server under cProfile, print its top")
    add("--slurm-only", action="store_true", help="with --engine slurm: only the Slurm columns")
    add(
        "--slurm-no-ahead",
        action="store_true",
        help="also run each Corral-on-Slurm column with CORRAL_SLURM_QUEUE_AHEAD=0 (columns *_noahead)",
    )
    add(
        "--slurm-queue-ahead",
        type=int,
        default=None,
        help="CORRAL_SLURM_QUEUE_AHEAD for the Corral-on-Slurm columns (default: the engine's)",
    )
    add(
        "--slurm-launch-workers",
        type=int,
        default=None,
        help="CORRAL_SLURM_LAUNCH_WORKERS for the Corral-on-Slurm columns (default: the engine's)",
    )
    add(
        "--slurm-burst",
        type=int,
        default=0,
        help="also submit this many jobs at once to each Slurm side (columns slurm_burst, sbatch_burst)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.slurm_jobs < 1 or args.rate < 0 or args.slurm_rate < 0 or args.cpus <= 0:
        parser.error("--jobs and --slurm-jobs must be >= 1, --rate and --slurm-rate >= 0, --cpus > 0")
    if args.saturate < 0 or args.ramp_from <= 0 or args.ramp_by <= 0 or args.ramp_step_s <= 0:
        parser.error("--saturate must be >= 0; --ramp-from, --ramp-by and --ramp-step-s > 0")
    if args.local_only and not (args.saturate or args.ramp):
        parser.error("--local-only skips the steady columns: give --saturate N or --ramp")
    if args.slurm_burst < 0:
        parser.error(f"--slurm-burst must be >= 0, got {args.slurm_burst}")
    if (args.slurm_only or args.slurm_burst or args.slurm_no_ahead) and args.engine != "slurm":
        parser.error("--slurm-only, --slurm-burst and --slurm-no-ahead need --engine slurm")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    SPEC["cpus"] = args.cpus
    global METER
    from corral.engine.local.latency import CpuMeter

    if CpuMeter.available():  # all_cpu_ms_per_job: everything this bench starts, jobs included
        METER = CpuMeter()
        atexit.register(METER.close)  # back to our own cgroup, and the meter's removed
    args.load_at_start = round(os.getloadavg()[0], 2)  # the box is shared: note what else ran
    # Ctrl-C and SIGTERM unwind through every `finally` (servers, Slurm daemons), also when a
    # shell started us in the background with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    results: dict[str, Result] = {}
    if not args.slurm_only and not args.local_only:
        results[""] = run_corral("sandboxed", args, {})
        if not args.no_network_columns:
            results["hostnet_"] = run_corral("hostnet", args, {"CORRAL_JOB_NETWORK": "host"})
            results["internet_"] = run_corral("internet", args, {"CORRAL_JOB_OUTBOUND": "internet"})
        results["unsandboxed_"] = run_corral("unsandboxed", args, {"CORRAL_ISOLATION": "false"})
        results["baseline_"] = run_baseline(args)
    if args.saturate and not args.slurm_only:
        results.update(run_saturated(args))
    ramps = run_ramps(args) if args.ramp and not args.slurm_only else {}
    if args.engine == "slurm":
        results.update({f"{k}_": v for k, v in run_slurm(args).items()})
    out = figures(results, args)
    if results:
        print_table(out, list(results))
    if ramps:
        out.update(ramp_figures(ramps))
        print_ramps(out, ramps, args)
    print(json.dumps(out))
    return 0 if all(r.failed == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
