"""Quota admission of one job in a cycle: the GPU models its group's quota (and the user's cap)
let it use now, or the reason it waits. The arithmetic is the QuotaLedger's (admission.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from corral.scheduler.admission import QuotaLedger
from corral.scheduler.jobinfo import JobInfo
from corral.scheduler.outcomes import Verdicts
from corral.scheduler.types import Job, Reason
from corral.words import plural


class QuotaCheck:
    def __init__(self, ledger: QuotaLedger, verdicts: Verdicts) -> None:
        self.ledger, self.verdicts = ledger, verdicts
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

    def release_pledges(self) -> None:
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
                f"user {job.user} may hold {plural(cap, 'GPU')} in group {group.name}; "
                f"holds {ledger.user_used.get((group.name, job.user), 0)}; this job needs {job.total_gpus}",
            )
            self.verdicts.wait_or_never(job, reason, never=job.total_gpus > cap)
            return None
        allowed = ledger.allowed_models(job, info.models, borrowing, info.total)
        if allowed:
            return allowed
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
