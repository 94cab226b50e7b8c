"""The Slurm columns' watching for bench/job_latency.py: a `squeue` poller that records when each
job was first seen ended (both Slurm columns are timed by it, the same way), and where a job's
submit -> running went, from its own transition events (Corral) and from slurmctld's log (both)."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

SLURM_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


SLURM_PHASES = (
    "submit_to_scheduled",
    "scheduled_to_sbatch_done",
    "sbatch_done_to_command",
    "command_to_corral_sees_running",
    "command_to_corral_sees_end",
)


# Both Slurm columns (plain sbatch too), from slurmctld's log: submit -> slurmctld has the job (for
# Corral: its own steps and the sbatch call), -> slurmctld allocated it (the wait in Slurm's queue:
# Slurm 22.05 starts batch jobs only at its scheduler's ~1 s ticks and when a job's end frees
# resources), -> the command ran (slurmd, the job's scripts, the sandbox).
SLURM_SIDE_PHASES = ("submit_to_slurmctld", "slurmctld_queue", "allocated_to_command")


SLURMCTLD_EVENT = re.compile(
    r"^\[(?P<at>[0-9T:.-]+)\] (?P<what>_slurm_rpc_submit_batch_job:|sched: Allocate|backfill: Started)"
    r" JobId=(?P<id>\d+)"
)


def slurmctld_times(log: Path) -> tuple[dict[int, float], dict[int, float]]:
    """({Slurm job id: when slurmctld took it}, {id: when it allocated it}) from slurmctld's log
    (local time, ms; SlurmctldDebug=info logs both)."""
    submitted: dict[int, float] = {}
    allocated: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = SLURMCTLD_EVENT.match(line)
        if m is None:
            continue
        at = datetime.strptime(m["at"], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
        into = submitted if m["what"].startswith("_slurm_rpc") else allocated
        into.setdefault(int(m["id"]), at)
    return submitted, allocated


def add_slurm_side(results: Mapping[str, Any], ended: Mapping[str, Mapping[int, float]], log: Path) -> None:
    """Split each Slurm column's submit -> running at slurmctld's taking and allocating the job
    (SLURM_SIDE_PHASES); a job whose id or log lines are missing is left out of the split."""
    submitted, allocated = slurmctld_times(log)
    for res in results.values():
        for name, t0, ran in res.slurm_jobs:
            ids = [i for i, seen in ended.get(name, {}).items() if seen >= t0 and i in allocated]
            if not ids or min(ids) not in submitted:
                continue
            job = min(ids)
            for phase, value in zip(
                SLURM_SIDE_PHASES,
                (submitted[job] - t0, allocated[job] - submitted[job], ran - allocated[job]),
                strict=True,
            ):
                res.phases.setdefault(phase, []).append(value)


def add_phases(phases: dict[str, list[float]], job: Mapping[str, Any], t0: float, ran: float) -> None:
    """Where a Slurm job's submit -> running went: submit -> scheduled (Corral's schedule loop),
    -> starting (dispatch and sbatch returned), -> the command ran (Slurm started it, sandbox);
    and when Corral saw it RUNNING and ended (squeue poll), relative to the command's own time (the
    command is `date`: it ends as it prints; until Corral sees the end it holds the job's slot)."""
    at = {e["to_state"]: e["at"] for e in job.get("events") or [] if e["kind"] == "transition"}
    if "scheduled" not in at or "starting" not in at:
        return
    phases.setdefault("submit_to_scheduled", []).append(at["scheduled"] - t0)
    phases.setdefault("scheduled_to_sbatch_done", []).append(at["starting"] - at["scheduled"])
    phases.setdefault("sbatch_done_to_command", []).append(ran - at["starting"])
    if "running" in at:
        phases.setdefault("command_to_corral_sees_running", []).append(at["running"] - ran)
    if "succeeded" in at:
        phases.setdefault("command_to_corral_sees_end", []).append(at["succeeded"] - ran)


@contextmanager
def squeue_watcher(env: Mapping[str, str], interval_s: float = 0.1) -> Iterator[dict[str, dict[int, float]]]:
    """A thread polling `squeue --states=all --Format` (cli.parse_squeue); yields {job name:
    {Slurm job id: when first seen ended}} (a name comes back when a later Corral server numbers
    its jobs from 1 again). Both Slurm columns are timed by it, the same way."""
    ended: dict[str, dict[int, float]] = {}
    stop = threading.Event()

    from corral.engine.slurm.cli import SQUEUE_FORMAT, parse_squeue

    def loop() -> None:
        # the plain format the engine reads too: `squeue --json` of a few hundred jobs cost
        # ~0.2 s of CPU per call here, which the poller would take from both columns
        argv = ["squeue", "--noheader", "--states=all", f"--Format={SQUEUE_FORMAT}"]
        while not stop.wait(interval_s):
            out = subprocess.run(argv, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                continue  # a slow controller: try again next round
            now = time.time()
            for job in parse_squeue(out.stdout):
                if job["job_state"] in SLURM_ENDED:
                    ended.setdefault(job["name"], {}).setdefault(int(job["job_id"]), now)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield ended
    finally:
        stop.set()
        thread.join(10)


def wait_ended(ended: dict[str, dict[int, float]], name: str, timeout_s: float, since: float = 0.0) -> float:
    """When the job `name` was first seen ended, the first such job that ended after `since`."""
    deadline = time.time() + timeout_s
    while True:
        seen = [t for t in dict(ended.get(name, {})).values() if t >= since]
        if seen:
            return min(seen)
        if time.time() > deadline:
            raise TimeoutError(f"Slurm job {name} not seen finished after {timeout_s} s")
        time.sleep(0.05)
