"""Runtime estimates from what a live platform knows, never the trace's true durations.

The live platform estimates a job's runtime as the median of the user's last successful runs of a
job with the same name, capped by the job's own `max_runtime`; else `max_runtime`; else unknown
(`corral.services.jobs.runtime_estimate_s`). The simulator does the same with the jobs that have
finished so far in the replay. Traces without job names (Philly) fall back to the history of the
same (group, user, GPUs); a job with no history and no limit gets None (the profile's
`default_runtime_s`).
"""

from __future__ import annotations

import statistics
from collections import deque

from corral.sim.trace import TraceJob

HISTORY_RUNS = 10  # as services/jobs.py: the last successful runs looked at


class RuntimeHistory:
    def __init__(self) -> None:
        self._runs: dict[tuple[object, ...], deque[float]] = {}
        self._median: dict[tuple[object, ...], float] = {}

    @staticmethod
    def key(job: TraceJob) -> tuple[object, ...]:
        if job.name:
            return ("name", job.user, job.name)
        return ("shape", job.group, job.user, job.num_gpus)

    def record(self, job: TraceJob, ran_s: float) -> None:
        """A finished job ran `ran_s` seconds of work."""
        k = self.key(job)
        runs = self._runs.get(k)
        if runs is None:
            runs = self._runs[k] = deque(maxlen=HISTORY_RUNS)
        runs.append(ran_s)
        self._median[k] = statistics.median(runs)

    def estimate(self, job: TraceJob) -> float | None:
        typical = self._median.get(self.key(job))
        limit = job.max_runtime_s
        if typical is None:
            return limit
        return min(typical, limit) if limit is not None else typical
