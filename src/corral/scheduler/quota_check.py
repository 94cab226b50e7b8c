"""Quota admission of one job in a cycle: the GPU models its group's quota (and the user's cap)
let it use now, or the reason it waits. The arithmetic is the QuotaLedger's (admission.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from corral.scheduler.admission import QuotaLedger
from corral.scheduler.jobinfo import JobInfo
from corral.scheduler.outcomes import Verdicts
from corral.scheduler.types import Job, Reason


class QuotaCheck:
    def __init__(
        self,
        ledger: QuotaLedger,
        verdicts: Verdicts,
        shadow: Callable[[str, str, int], float] | None = None,
        now: float = 0.0,
        runtime: Callable[[Job], float] | None = None,
    ) -> None:
        self.ledger, self.verdicts = ledger, verdicts
        # quota_backfill: group -> [job, key model, GPUs still held, shadow time]
        self.shadow, self.now, self.runtime = shadow, now, runtime
        self.group_res: dict[str, list[Any]] = {}
        self.version = 0
        self.deferred: list[Job] = []  # jobs that may get other GPU models in the borrowing pass
        self.pledges: list[tuple[Job, dict[str, int]]] = []  # guarantee held for starving jobs

    def pledge_aged(self, aged: Iterable[Job], info_of: Callable[[Job], JobInfo]) -> None:
        """The starvation guard's quota half, before the first pass: each starving job (oldest
        first) that its group's guarantee could hold but that its group's running work leaves no
        room for now gets that room held (charged to the group for the guaranteed pass), so that
        no younger job of its group takes the guarantee back as the running work ends. Room the
        older starving jobs can use now is counted first (then released), so a younger job never
        takes an older one's room."""
        ledger = self.ledger
        admissible: list[tuple[Job, dict[str, int]]] = []
        for job in aged:
            info = info_of(job)
            if info.total <= 0 or info.never:
                continue
            group = ledger.group(job.group)
            allowed = ledger.allowed_models(job, info.models, False, info.total)
            if allowed:
                held = {min(allowed): info.total}
                admissible.append((job, held))
            else:
                owed = [ledger.guaranteed(group, ledger.key(group, m)) for m in info.models]
                ever = [m for m, n in zip(info.models, owed, strict=True) if info.total <= n]
                if not ever:
                    continue  # larger than its guarantee: it can only ever borrow
                held = {ever[0]: info.total}
                self.pledges.append((job, held))
            ledger.charge(job, held)
        for job, held in admissible:
            ledger.charge(job, held, -1)

    def _quota_backfill(self, job: Job, info: JobInfo, group: Any) -> frozenset[str] | None:
        """The group's first job that finds too little guaranteed room holds that room until its
        shadow time; a later job of the group may use the held room if it ends by then."""
        ledger = self.ledger
        res = self.group_res.get(job.group)
        if res is None:
            owed = [ledger.guaranteed(group, ledger.key(group, m)) for m in info.models]
            ever = [m for m, n in zip(info.models, owed, strict=True) if info.total <= n]
            if not ever:
                return None
            assert self.shadow is not None
            t = self.shadow(job.group, ever[0], info.total)
            self.group_res[job.group] = [job, ever[0], info.total, t]
            ledger.charge(job, {ever[0]: info.total})
            self.version += 1
            return None
        head, model, held, t = res
        assert self.runtime is not None
        if held <= 0 or self.now + self.runtime(job) > t:
            return None
        take = min(held, info.total)  # it ends before the head can start: use the held room
        ledger.charge(head, {model: -take})
        res[2] = held - take
        self.version += 1
        allowed = ledger.allowed_models(job, info.models, False, info.total)
        if not allowed:
            ledger.charge(head, {model: take})
            res[2] = held
            return None
        return allowed

    def first_jobs(self) -> list[Job]:
        return [r[0] for r in self.group_res.values()]

    def release_pledges(self) -> None:
        for res in self.group_res.values():
            head, model, held, _ = res
            if held > 0:
                self.ledger.charge(head, {model: -held})
            res[2] = 0
        self.version += 1
        """Before the borrowing pass: the held room is no longer the guaranteed pass's."""
        for job, held in self.pledges:
            self.ledger.charge(job, held, -1)
        self.pledges = []

    def admit(self, job: Job, borrowing: bool, may_borrow: bool, info: JobInfo) -> frozenset[str] | None:
        """Models the job may use under its group's quota now; None when none (reason recorded, or
        the job deferred to the borrowing pass)."""
        ledger = self.ledger
        group = ledger.group(job.group)
        cap = group.user_max_gpus
        if cap is not None and not ledger.user_fits(job):
            reason = Reason(
                "user_cap",
                "quota:user",
                f"user {job.user} may hold {cap} GPUs in group {group.name}; "
                f"holds {ledger.user_used.get((group.name, job.user), 0)}; this job needs {job.total_gpus}",
            )
            self.verdicts.wait_or_never(job, reason, never=job.total_gpus > cap)
            return None
        allowed = ledger.allowed_models(job, info.models, borrowing, info.total)
        if allowed:
            return allowed
        if not borrowing and self.shadow is not None and info.total > 0:
            got = self._quota_backfill(job, info, group)
            if got:
                return got
        if not borrowing and may_borrow:
            self.deferred.append(job)
            return None
        never = all(
            job.total_gpus > ledger.limit(group, ledger.key(group, m), may_borrow) for m in info.models
        )
        self.verdicts.wait_or_never(job, self.reason(job, may_borrow), never)
        return None

    def reason(self, job: Job, borrow: bool) -> Reason:
        group = self.ledger.group(job.group)
        if borrow:
            return Reason(
                "quota_max",
                "quota",
                f"group {group.name} is at its maximum quota for the GPU models this job can use",
            )
        why = (
            "borrowing is off" if not group.borrowing else "the job is not preemptible, so it may not borrow"
        )
        return Reason(
            "quota_exhausted",
            "quota",
            f"group {group.name} is at its guaranteed quota for the GPU models this job can use and {why}",
        )
