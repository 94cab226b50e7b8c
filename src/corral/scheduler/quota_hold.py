"""Quota reservations (the `quota_hold` knob): EASY backfill on a group's guarantee.

In the guaranteed pass, a group's first job that its guarantee could hold but that finds too
little free guaranteed room now (or its oldest starving job, when the starvation guard pledges
room for it) holds that room until its shadow time: when the group's running work frees enough
of its guarantee, if every running job ends at its estimate (never its true duration). Later jobs
of the group may use the held room only if their own estimate ends by then. Before the borrowing
pass the held quota is let go, and each hold becomes a GPU reservation instead: a placement on
borrowed quota that would still run at the shadow time may not take the GPUs the holder needs
then, so the holder gets its room without reclaiming work that borrowed it in the meantime.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.scheduler.admission import QuotaLedger, runtime_of
from corral.scheduler.backfill import Backfill
from corral.scheduler.cluster import ClusterState
from corral.scheduler.jobinfo import JobInfo
from corral.scheduler.types import Job, Reason


@dataclass(slots=True)
class Hold:
    """`job` holds `held` of the `need` GPUs of its group's guarantee under `model`'s quota key
    until `shadow`; then (borrowing pass) `extra` GPUs of `models` may still be taken past it."""

    job: Job
    models: frozenset[str]
    model: str
    need: int
    held: int
    shadow: float
    extra: int = 0
    reason: Reason | None = None


class QuotaHolds:
    """The cycle's quota holds, one per group at most."""

    def __init__(
        self, ledger: QuotaLedger, backfill: Backfill, st: ClusterState, now: float, default_runtime_s: float
    ) -> None:
        self.ledger, self.backfill, self.st, self.now = ledger, backfill, st, now
        self.default_runtime_s = default_runtime_s
        self.by_group: dict[str, Hold] = {}
        self.gpu_holds: list[Hold] = []  # the borrowing pass's GPU reservations
        # jobs started this cycle: (group, estimated end, GPUs per model), for the shadow times
        self.started: list[tuple[str, float, dict[str, int]]] = []
        self.version = 0  # changes with every change to the held quota (known.py's state token)

    def record_start(self, job: Job, gpus_by_model: dict[str, int]) -> None:
        self.started.append((job.group, self.now + runtime_of(job, self.default_runtime_s), gpus_by_model))

    def holds_for(self, group: str) -> bool:
        return group in self.by_group

    def hold(self, job: Job, info: JobInfo) -> bool:
        """Make `job` its group's holder if the group has none and its guarantee could ever hold
        the job (and its running work frees enough by the estimates); charge the held room."""
        if job.group in self.by_group or info.total <= 0:
            return False
        ledger = self.ledger
        group = ledger.group(job.group)
        ever = [m for m in info.models if info.total <= ledger.guaranteed(group, ledger.key(group, m))]
        if not ever:
            return False
        shadow = self.shadow(job.group, ever[0], info.total)
        if shadow == float("inf"):
            return False
        # only the guaranteed room free now is held (the rest is still in use by the group's own
        # running work); a later job of the group may take it only by ending by the shadow time
        key = ledger.key(group, ever[0])
        room = max(0, min(info.total, ledger.guaranteed(group, key) - ledger.used.get((job.group, key), 0)))
        self.by_group[job.group] = Hold(job, info.model_set, ever[0], info.total, room, shadow)
        if room:
            ledger.charge(job, {ever[0]: room})
        self.version += 1
        return True

    def backfill_into(self, job: Job, info: JobInfo) -> frozenset[str] | None:
        """The models `job` may use if it takes room its group's holder holds: only when its
        estimate ends by the holder's shadow time. The room it takes stays free of the hold."""
        hold = self.by_group.get(job.group)
        if hold is None or hold.job is job or hold.held <= 0:
            return None
        if self.now + runtime_of(job, self.default_runtime_s) > hold.shadow:
            return None
        take = min(hold.held, info.total)
        ledger = self.ledger
        ledger.charge(hold.job, {hold.model: -take})
        allowed = ledger.allowed_models(job, info.models, False, info.total)
        if not allowed:
            ledger.charge(hold.job, {hold.model: take})
            return None
        hold.held -= take
        self.version += 1
        return allowed

    def shadow(self, group: str, model: str, need: int) -> float:
        """When the group's running work (and what started this cycle) leaves `need` GPUs of its
        guarantee under `model`'s quota key free, if every job ends at its estimate; inf: never."""
        ledger = self.ledger
        g = ledger.group(group)
        key = ledger.key(g, model)
        room = ledger.guaranteed(g, key) - ledger.used.get((group, key), 0)
        if room >= need:
            return self.now
        now, default_s = self.now, self.default_runtime_s
        ends: list[tuple[float, int]] = []
        for rj, per_model in self.backfill.running:
            if rj.job.group == group:
                n = sum(c for m, c in per_model.items() if ledger.key(g, m) == key)
                if n:
                    ends.append((max(now, rj.start_time + runtime_of(rj.job, default_s)), n))
        for name, end, per_model in self.started:
            if name == group:
                n = sum(c for m, c in per_model.items() if ledger.key(g, m) == key)
                if n:
                    ends.append((end, n))
        ends.sort()
        for end, n in ends:
            room += n
            if room >= need:
                return end
        return float("inf")

    def to_gpu_holds(self) -> None:
        """Before the borrowing pass: let the held quota go and hold GPUs instead: of the GPUs of
        the holder's models free now or freed by its shadow time (by the estimates), all but what
        it needs may be taken past the shadow time by work on borrowed quota."""
        st, ledger = self.st, self.ledger
        for hold in self.by_group.values():
            if hold.held > 0:
                ledger.charge(hold.job, {hold.model: -hold.held})
                hold.held = 0
            avail = sum(st.free_total.get(m, 0) for m in hold.models)
            for end, per_model in self.backfill.sorted_events():
                if end > hold.shadow:
                    break
                avail += sum(n for m, n in per_model.items() if m in hold.models)
            hold.extra = max(0, avail - hold.need)
            self.gpu_holds.append(hold)
        self.version += 1

    def blocker(self, job: Job, gpus_by_model: dict[str, int]) -> Hold | None:
        """The hold a placement on borrowed quota would delay, if any; otherwise it consumes the
        spare GPUs of the holds it overlaps."""
        if not self.gpu_holds:
            return None
        end = self.now + runtime_of(job, self.default_runtime_s)
        takes: list[tuple[Hold, int]] = []
        for hold in self.gpu_holds:
            if hold.job is job or end <= hold.shadow:
                continue
            used = sum(n for m, n in gpus_by_model.items() if m in hold.models)
            if used == 0:
                continue
            if used > hold.extra:
                return hold
            takes.append((hold, used))
        for hold, used in takes:
            hold.extra -= used
        return None

    @staticmethod
    def reason(hold: Hold) -> Reason:
        if hold.reason is None:
            hold.reason = Reason(
                "backfill_would_delay",
                "admission:quota_hold",
                f"starting now on borrowed quota would delay job {hold.job.id}, which holds its group "
                f"{hold.job.group}'s guaranteed room to start at {hold.shadow:.0f}",
            )
        return hold.reason
