"""Estimated starts corrected by the platform's own record of how its past estimates turned out.

The roll (diagnosis.py) predicts a waiting job's start from runtime guesses and the expected start
order; both are off in ways that repeat (docs/simulator.md, "Where the ETA error comes from"). A
real scheduler knows, for every job that has started, the wait it predicted when the job was first
shown an estimate and the wait that followed. `EtaCalibration` keeps the last `window` of those
outcomes per size class (the job's GPUs rounded up to a power of two; CPU jobs are a class of
their own) and for the whole cluster,
fits log(actual wait + a) = alpha + beta * log(predicted wait + a) to each window by least
squares (beta held in [0, 1]: a long prediction is pulled towards what such waits turned out to
be, never pushed further out), and maps a new predicted wait through the fit of its class, or the
cluster's when the class has fewer than `min_outcomes` outcomes; with fewer than that on both, the
roll's estimate is shown as it is. `a` (ADDITIVE_S) keeps a predicted wait near 0 from making the
ratio meaningless (a job predicted to start in 1 s that waited 10 min). The fit is one of first
estimates: a later re-estimate of a job that has waited is corrected less (`faded`, what the live
loop shows; the simulator scores first estimates only).

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
    """The job's GPUs rounded up to a power of two; 0 for a CPU job (its own class: its waits are
    not those of the 1-GPU jobs)."""
    if gpus <= 0:
        return 0
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

    def outcomes(self, gpus: int | None = None) -> int:
        """How many outcomes the cluster's window holds now (`gpus`: the window of that size class)."""
        if gpus is None:
            return len(self._cluster.points)
        found = self._classes.get(size_class(gpus))
        return 0 if found is None else len(found.points)

    def corrected_wait(self, gpus: int, predicted_wait_s: float) -> float | None:
        """The corrected wait for a job of `gpus` GPUs the roll predicts to wait `predicted_wait_s`;
        None while neither its class nor the cluster has `min_outcomes` outcomes."""
        fit = self._classes.get(size_class(gpus))
        if fit is None or len(fit.points) < self.min_outcomes:
            fit = self._cluster
            if len(fit.points) < self.min_outcomes:
                return None
        return _mapped(fit.line(), self.additive_s, predicted_wait_s)

    def fits(self) -> EtaFits:
        """Each class's line (and the cluster's) as they are now, computed once: what a schedule
        tick maps all its waiting jobs through (corrected_wait, without a fit per job)."""
        usable = {k: w.line() for k, w in self._classes.items() if len(w.points) >= self.min_outcomes}
        cluster = self._cluster.line() if len(self._cluster.points) >= self.min_outcomes else None
        return EtaFits(usable, cluster, self.additive_s)

    def corrected_start(self, now: float, gpus: int, estimated_start: float) -> float:
        """`estimated_start` (the roll's, same time base as `now`) with its wait from `now`
        corrected; unchanged while there is too little history."""
        wait = self.corrected_wait(gpus, estimated_start - now)
        return estimated_start if wait is None else now + wait


def _mapped(line: tuple[float, float], additive_s: float, predicted_wait_s: float) -> float:
    alpha, beta = line
    return max(0.0, math.exp(alpha + beta * math.log(max(0.0, predicted_wait_s) + additive_s)) - additive_s)


class EtaFits:
    """An EtaCalibration's lines at one moment (EtaCalibration.fits): the same corrected waits."""

    def __init__(
        self, classes: dict[int, tuple[float, float]], cluster: tuple[float, float] | None, additive_s: float
    ) -> None:
        self._classes, self._cluster, self.additive_s = classes, cluster, additive_s

    def corrects(self) -> bool:
        """Whether any wait is corrected (False: too few outcomes anywhere yet)."""
        return self._cluster is not None or bool(self._classes)

    def corrected_wait(self, gpus: int, predicted_wait_s: float, elapsed_s: float = 0.0) -> float | None:
        """As EtaCalibration.corrected_wait at the moment these fits were taken, faded (`faded`)
        for a re-estimate made `elapsed_s` after the job's first (0: the first, corrected in full)."""
        line = self._classes.get(size_class(gpus), self._cluster)
        if line is None:
            return None
        predicted = max(0.0, predicted_wait_s)
        return faded(predicted, _mapped(line, self.additive_s, predicted), elapsed_s)


def faded(predicted_wait_s: float, fitted_wait_s: float, elapsed_s: float) -> float:
    """A re-estimate's wait: the roll's `predicted_wait_s` moved towards the fit's `fitted_wait_s`
    by the share of the wait still ahead, predicted / (elapsed + predicted), where `elapsed_s` is
    the time since the job's first estimate. The fit is made on first estimates (a new job's
    roll); a job that has waited and is near its start is not such a job (docs/simulator.md,
    Round 3, "Re-estimates": better than the fit in full or the roll alone, over Philly and the
    synthetic seeds). At 0 s elapsed, the fit itself."""
    if elapsed_s <= 0.0:
        return fitted_wait_s
    weight = predicted_wait_s / (elapsed_s + predicted_wait_s) if elapsed_s + predicted_wait_s > 0 else 1.0
    return predicted_wait_s + weight * (fitted_wait_s - predicted_wait_s)
