"""The Gittins index of a waiting job (Tiresias' Gittins-index order, discretised into size classes).

A job's runtime S is taken as log-normal: its median is the runtime estimate (runtimes.py), its
log-spread comes from the estimate's quartiles (`runtime_spread`, as the ETA code reads them:
eta._sigma, at least `SIGMA_MIN`). Given the service `a` it has attained (S > a, since it has not
finished), the Gittins index is

    G = max over quanta D of  P(S - a <= D | S > a) / E[min(S - a, D) | S > a]

the best rate at which serving the job for a while completes it; per GPU, it is divided by the
job's GPUs. Higher first. `gittins_class` turns it into the scale of `admission.size_class`:
1 / G is a "Gittins size" in GPU-seconds (for a job whose runtime is certain it is the runtime
times the GPUs, so the two orders agree then), and the class is the bit length of its whole
GPU-minutes. A wider spread at an equal median ranks a new job earlier (it may well be short); a
job that already ran long without finishing ranks later (the heavy tail says it has far to go).

Pure functions of the Job (no clock), as the queue index requires of `size_of`.
"""

from __future__ import annotations

import math
from functools import lru_cache

from corral.scheduler.eta import IQR_Z, SIGMA_MIN
from corral.scheduler.types import Job

SIZE_UNIT_S = 60.0  # GPU-seconds of the smallest class (admission.SIZE_UNIT_S)
# Quanta D tried, in medians of the job's runtime: 1/64 to 256 medians in quarter octaves, and D
# unbounded (1 / the mean remaining time). The maximum over this grid is within a few percent of
# the true maximum: far finer than a class (an octave).
QUANTA = tuple(2.0 ** (k / 4) for k in range(-24, 33))
_SQRT2 = math.sqrt(2.0)


def _sigma(spread: tuple[float, float] | None) -> float:
    """The log-normal spread whose quartiles are `spread`, at least SIGMA_MIN (SIGMA_MIN when the
    spread is unknown: a user's limit, or no history)."""
    if spread is None:
        return SIGMA_MIN
    low, high = spread
    if low > 0 and high > low:
        return max(SIGMA_MIN, (math.log(high) - math.log(low)) / IQR_Z)
    return SIGMA_MIN


def _tail(z: float) -> float:
    """P(Z > z) for a standard normal Z (erfc keeps precision deep in the tail)."""
    return 0.5 * math.erfc(z / _SQRT2)


@lru_cache(maxsize=65536)
def unit_index(sigma: float, attained: float) -> float:
    """The Gittins index of a log-normal runtime with median 1 and log-spread `sigma`, after
    `attained` (in medians) of service. Scale-free: a job of median m has index unit_index / m."""
    half_var = 0.5 * sigma * sigma

    def survive(x: float) -> float:  # P(S > x)
        return 1.0 if x <= 0 else _tail(math.log(x) / sigma)

    def upper_mean(x: float) -> float:  # E[S; S > x]
        return math.exp(half_var) * (1.0 if x <= 0 else _tail(math.log(x) / sigma - sigma))

    alive = survive(attained)
    mean_above = upper_mean(attained)
    if alive <= 0.0 or mean_above <= 0.0:  # beyond double precision: as good as never ends
        return 0.0
    # D unbounded: the completion is certain, the service is the mean remaining time
    best = alive / (mean_above - attained * alive)
    for d in QUANTA:
        end = attained + d
        left = survive(end)
        done = alive - left  # P(a < S <= a + D)
        served = mean_above - upper_mean(end) + end * left - attained * alive  # integral of survive
        if done > 0.0 and served > 0.0:
            best = max(best, done / served)
    return best


def gittins_size_s(job: Job, default_runtime_s: float) -> float:
    """1 / the job's Gittins index per GPU, in GPU-seconds (the runtime times the GPUs when the
    runtime is certain). The attained service counts only when the estimate is of the whole run
    (it has a spread): a job whose estimate is already its remaining work (the simulator's, after a
    preemption that kept work) starts afresh at a = 0."""
    estimate = job.runtime_estimate
    median = default_runtime_s if estimate is None else estimate
    gpus = max(job.total_gpus, 1)
    if median <= 0:
        return 0.0
    spread = job.runtime_spread if estimate is not None else None
    attained = job.attained_gpu_seconds / gpus if spread is not None else 0.0
    index = unit_index(_sigma(spread), attained / median)
    if index <= 0.0:
        return math.inf
    return median * gpus / index


def gittins_class(job: Job, default_runtime_s: float) -> int:
    """The job's Gittins size in the classes of `admission.size_class` (the bit length of whole
    GPU-minutes; higher index, lower class, earlier in its user's order)."""
    size = gittins_size_s(job, default_runtime_s)
    if math.isinf(size):
        return 1 << 10  # after every finite class (2**1023 GPU-minutes is beyond any job)
    return int(size // SIZE_UNIT_S).bit_length()
