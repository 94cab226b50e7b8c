"""Named scheduling policies. A Profile is plain data: which ordering, which admission rules,
which placement plugins with which weights, and the knobs that bound per-cycle work."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from corral.scheduler.plugins import DEFAULT_FILTERS, FILTERS, PLACEMENTS, SCORERS
from corral.scheduler.types import Job

ORDERS = ("fair_share", "fifo", "sjf", "las")
PREEMPTIONS = ("none", "quota_priority", "las")
ETA_ROLLS = ("backfill", "pooled")
NUMERIC_KNOBS = (
    "grace_s",
    "fair_share_horizon_s",
    "default_runtime_s",
    "max_reservations",
    "backfill_depth",
    "max_preemption_attempts",
    "max_victims",
    "eta_limit",
    "eta_reuse_s",
    "max_preemptions",
    "starvation_s",
)
BOOL_KNOBS = ("size_order", "eta_calibration")
# `default`'s eta_reuse_s. Chosen by the rule in docs/simulator.md, "Sixteenth round": on the whole
# Philly trace and synth seeds 0-4 the ETA figure moves by less than 0.5 points either way (it
# moved -0.08 .. +0.19) and the whole-Philly replay is measurably cheaper (the schedule is the same)
DEFAULT_ETA_REUSE_S = 60.0


@dataclass(frozen=True, slots=True)
class Profile:
    name: str = "default"
    # admission
    order: str = "fair_share"  # fair_share | fifo | sjf | las
    quotas: bool = True  # group guaranteed/max quotas, borrowing, per-user caps
    backfill: bool = True  # EASY: reserve for the head job, let others jump only if harmless
    head_of_line_blocking: bool = False  # strict FIFO: nothing passes a job that does not fit
    preemption: str = "quota_priority"  # none | quota_priority | las
    grace_s: float = 30.0  # SIGTERM-to-kill time given to each victim
    fair_share_horizon_s: float = 3600.0  # a running GPU counts as this many GPU-seconds of usage
    las_thresholds: tuple[float, ...] = (3600.0, 36000.0)  # GPU-seconds that demote to the next queue
    # fair_share: inside a group, smaller estimated GPU-time first (size_class: log2 GPU-minutes
    # of the runtime estimate, which comes from user limits and history, never true durations)
    size_order: bool = True
    # fair_share: a job waiting longer than this comes before every other job in the guaranteed
    # pass (the starvation guard: it reserves and reclaims first); 0: off
    starvation_s: float = 2 * 86400.0
    # placement
    placement: str = "bestfit"  # bestfit | spread | random
    extra_scorers: tuple[tuple[str, float], ...] = ()  # more (scorer, weight) pairs added to placement
    filters: tuple[str, ...] = DEFAULT_FILTERS
    cpu_jobs_on_gpu_nodes: bool = False
    use_index: bool = True  # False: plain scan over all nodes (the benchmark baseline; same result)
    # estimates and per-cycle work bounds
    default_runtime_s: float = 3600.0  # runtime assumed for jobs without an estimate
    max_reservations: int = 4  # backfill reservations per cycle (one per distinct GPU-model set)
    backfill_depth: int = 5000  # jobs tried per cycle once a reservation stands (Slurm: bf_max_job_test)
    max_preemption_attempts: int = 16  # waiting jobs per cycle that may look for victims
    max_victims: int = 64  # victims one waiting job may consider
    # a job preempted this many times is not preempted again (the bound per job); 0: no bound
    max_preemptions: int = 16
    eta_limit: int = 2000  # waiting jobs per cycle that get an estimated start (others: None)
    # How estimated starts roll the cycle forward (diagnosis.py): "backfill" (per-model timelines,
    # remaining times of running jobs from their history) or "pooled" (the earlier walk, kept as
    # the baseline the simulator's ETA error is compared with)
    eta_roll: str = "backfill"
    # A targeted estimate (the simulator's new jobs) continues the roll kept from a cycle at most
    # this many seconds earlier while nothing started, ended or stopped and the order ahead is
    # unchanged (eta_kept.py): a speed option, not exact (the kept timelines are of that earlier
    # now). 0 here (every roll from scratch); `default` sets DEFAULT_ETA_REUSE_S. The full
    # diagnoses (what the live server shows) never continue a kept roll, whatever the value
    eta_reuse_s: float = 0.0
    # Estimated starts shown corrected by the platform's past outcomes (eta_calibration.py). Off
    # for the FIFO profiles: their start order is the submit order, so the roll is already close
    # and a fit of past waits, which lags a growing queue by a whole wait, only moves it away
    # (docs/simulator.md, Round 3, "By policy": strict FIFO 10.7% -> 34.5% with it, seed 0)
    eta_calibration: bool = True

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"profile {self.name}: unknown order {self.order!r}; use one of {ORDERS}")
        if self.preemption not in PREEMPTIONS:
            raise ValueError(
                f"profile {self.name}: unknown preemption {self.preemption!r}; use one of {PREEMPTIONS}"
            )
        if self.eta_roll not in ETA_ROLLS:
            raise ValueError(
                f"profile {self.name}: unknown eta_roll {self.eta_roll!r}; use one of {ETA_ROLLS}"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"profile {self.name}: unknown placement {self.placement!r}; use one of {PLACEMENTS}"
            )
        for scorer, _ in self.extra_scorers:
            if scorer not in SCORERS:
                raise ValueError(
                    f"profile {self.name}: unknown scorer {scorer!r}; use one of {tuple(SCORERS)}"
                )
        for knob in NUMERIC_KNOBS:  # (`not >= 0`: a nan compares False both ways)
            value = getattr(self, knob)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"profile {self.name}: {knob} must be >= 0 and finite, got {value}")
        if not all(t >= 0 and math.isfinite(t) for t in self.las_thresholds):
            raise ValueError(
                f"profile {self.name}: las_thresholds must be >= 0 and finite, got {self.las_thresholds}"
            )
        for f in self.filters:
            if f not in FILTERS:
                raise ValueError(f"profile {self.name}: unknown filter {f!r}; use one of {tuple(FILTERS)}")

    @property
    def scorers(self) -> tuple[tuple[str, float], ...]:
        return ((self.placement, 1.0), *self.extra_scorers)

    @property
    def indexed(self) -> bool:
        """Whether the bucket index gives exactly the plain scan's answer for this profile."""
        return (
            self.use_index
            and self.placement in ("bestfit", "spread")
            and not self.extra_scorers
            and set(self.filters) == set(DEFAULT_FILTERS)
        )

    def with_placement(self, placement: str) -> Profile:
        return dataclasses.replace(self, placement=placement)


def grace_of(job: Job, profile: Profile) -> float:
    """The stop grace a preempted job gets: its own `stop_grace_s` (the caller bounds it by its
    admin maximum), else the profile's `grace_s`."""
    return profile.grace_s if job.stop_grace_s is None else job.stop_grace_s


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(name="default", eta_reuse_s=DEFAULT_ETA_REUSE_S),
        Profile(
            name="fifo",
            order="fifo",
            quotas=False,
            backfill=False,
            head_of_line_blocking=True,
            preemption="none",
            eta_calibration=False,
        ),
        Profile(
            name="fifo-backfill",
            order="fifo",
            quotas=False,
            backfill=True,
            preemption="none",
            eta_calibration=False,
        ),
        Profile(name="sjf", order="sjf", quotas=False, backfill=False, preemption="none"),
        Profile(name="las", order="las", quotas=False, backfill=False, preemption="las", max_preemptions=0),
    )
}
