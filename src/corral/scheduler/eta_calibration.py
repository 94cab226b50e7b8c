"""Estimated starts corrected by the platform's own record of how its past estimates turned out.

The roll (diagnosis.py) predicts a waiting job's start from runtime guesses and the expected start
order; both are off in ways that repeat (docs/simulator.md, "Where the ETA error comes from"). A
real scheduler knows, for every job that has started, the wait it predicted when the job was first
shown an estimate and the wait that followed. `EtaCalibration` keeps the last `window` of those
outcomes per size class (the job's GPUs rounded up to a power of two) and for the whole cluster,
fits log(actual wait + a) = alpha + beta * log(predicted wait + a) to each window by least
squares (beta held in [0, 1]: a long prediction is pulled towards what such waits turned out to
be, never pushed further out), and maps a new predicted wait through the fit of its class, or the
cluster's when the class has fewer than `min_outcomes` outcomes; with fewer than that on both, the
roll's estimate is shown as it is. `a` (ADDITIVE_S) keeps a predicted wait near 0 from making the
ratio meaningless (a job predicted to start in 1 s that waited 10 min).

Only information a real scheduler has: the simulator records the outcomes of its own replay, the
live loop those of its jobs (migration 0032: the first estimated wait and when it was shown). The
policy never reads the corrected time; only what is shown changes. Measured in docs/simulator.md,
"Round 3".
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 500  # outcomes kept per size class (and for the cluster)
MIN_OUTCOMES = 30  # fewer in a class: the cluster's fit; fewer there too: no correction
ADDITIVE_S = 300.0  # seconds added to both waits before the logs
_RESUM_EVERY = 4096  # running sums recomputed from the window this often (no drift)


def size_class(gpus: int) -> int:
    """The job's GPUs rounded up to a power of two (a CPU job counts with the 1-GPU jobs)."""
    size = 1
    while size < gpus:
        size *= 2
    return size


class _Window:
    """The last `limit` (log predicted, log actual) pairs and their running sums."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.points: deque[tuple[float, float]] = deque()
        self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.added = 0

    def add(self, x: float, y: float) -> None:
        self.points.append((x, y))
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y
        if len(self.points) > self.limit:
            ox, oy = self.points.popleft()
            self.sx -= ox
            self.sy -= oy
            self.sxx -= ox * ox
            self.sxy -= ox * oy
        self.added += 1
        if self.added % _RESUM_EVERY == 0:
            self.sx = sum(p[0] for p in self.points)
            self.sy = sum(p[1] for p in self.points)
            self.sxx = sum(p[0] * p[0] for p in self.points)
            self.sxy = sum(p[0] * p[1] for p in self.points)

    def line(self) -> tuple[float, float]:
        """(alpha, beta) of the least-squares fit y = alpha + beta x, beta held in [0, 1] (1 when
        every prediction in the window was the same: then a plain ratio)."""
        n = len(self.points)
        mx, my = self.sx / n, self.sy / n
        var = self.sxx / n - mx * mx
        beta = (self.sxy / n - mx * my) / var if var > 1e-9 else 1.0
        beta = min(1.0, max(0.0, beta))
        return my - beta * mx, beta


class EtaCalibration:
    """Past (predicted, actual) waits of started jobs -> a corrected predicted wait."""

    def __init__(
        self, window: int = WINDOW, min_outcomes: int = MIN_OUTCOMES, additive_s: float = ADDITIVE_S
    ) -> None:
        if window < 1 or min_outcomes < 1 or min_outcomes > window:
            raise ValueError(
                f"need 1 <= min_outcomes <= window, got window={window}, min_outcomes={min_outcomes}"
            )
        if additive_s <= 0:
            raise ValueError(f"additive_s must be > 0 seconds, got {additive_s}")
        self.window, self.min_outcomes, self.additive_s = window, min_outcomes, additive_s
        self._cluster = _Window(window)
        self._classes: dict[int, _Window] = {}

    def record(self, gpus: int, predicted_wait_s: float, actual_wait_s: float) -> None:
        """A job of `gpus` GPUs was shown a wait of `predicted_wait_s` (the roll's own, before any
        correction) and started `actual_wait_s` after it was shown (negative values count as 0)."""
        a = self.additive_s
        x = math.log(max(0.0, predicted_wait_s) + a)
        y = math.log(max(0.0, actual_wait_s) + a)
        self._cluster.add(x, y)
        key = size_class(gpus)
        found = self._classes.get(key)
        if found is None:
            found = self._classes[key] = _Window(self.window)
        found.add(x, y)

    def outcomes(self) -> int:
        """How many outcomes the cluster's window holds now."""
        return len(self._cluster.points)

    def corrected_wait(self, gpus: int, predicted_wait_s: float) -> float | None:
        """The corrected wait for a job of `gpus` GPUs the roll predicts to wait `predicted_wait_s`;
        None while neither its class nor the cluster has `min_outcomes` outcomes."""
        fit = self._classes.get(size_class(gpus))
        if fit is None or len(fit.points) < self.min_outcomes:
            fit = self._cluster
            if len(fit.points) < self.min_outcomes:
                return None
        alpha, beta = fit.line()
        a = self.additive_s
        return max(0.0, math.exp(alpha + beta * math.log(max(0.0, predicted_wait_s) + a)) - a)

    def corrected_start(self, now: float, gpus: int, estimated_start: float) -> float:
        """`estimated_start` (the roll's, same time base as `now`) with its wait from `now`
        corrected; unchanged while there is too little history."""
        wait = self.corrected_wait(gpus, estimated_start - now)
        return estimated_start if wait is None else now + wait
