"""The running jobs that may become preemption victims, kept in victim order between cycles.

`Preemptor` sorted every preemptible running job afresh in each cycle with a search (quota
priority: borrowed first, then lowest priority, then youngest, then id). That key reads only the
RunningJob and its Job, both frozen, so the order of the jobs that stay running does not change
between cycles; `Occupied` keeps this order and brings it up to date with the jobs that came and
went, and the cycle's candidates are this order filtered (a filter keeps a sorted order). LAS
victims are not kept: their order reads the attained service, which grows with `now`."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from corral.scheduler.types import RunningJob

VictimKey = tuple[bool, int, float, str]


@dataclass(slots=True)
class Candidate:
    """A running job that may become a victim: its GPUs per model and, for LAS, its queue. Never
    changed once made (kept ones are shared by the cycles)."""

    rj: RunningJob
    gpus_by_model: dict[str, int]
    las: int


def victim_key(rj: RunningJob) -> VictimKey:
    """Victims that lose least work first: borrowed, then lowest priority, then youngest
    (`Preemptor.order_key`, on the running job)."""
    return (not rj.borrowed, int(rj.job.priority), -rj.start_time, rj.job.id)


def may_be_victim(rj: RunningJob) -> bool:
    """Whether `Preemptor` would make the job a candidate (before the profile's preemption bound)."""
    return rj.job.preemptible and not rj.stopping


class VictimOrder:
    """The preemptible running jobs that are not asked to stop, sorted by `victim_key`.

    Equal to a stable sort of them only while every key is distinct and comparable: two running
    jobs with the same job id could tie (a sort keeps their snapshot order, this the order of
    arrival) and a NaN start time breaks the order of every comparison, so while any such job is
    kept `order()` says None and the caller sorts afresh. The lists are replaced, never changed in
    place, once handed out (`order()`), so a cycle's copy is unaffected by the next sync."""

    def __init__(self) -> None:
        self._keys: list[VictimKey] = []
        self._items: list[Candidate] = []
        self._shared = False  # the lists were handed out: copy before the next change
        self._unordered = 0  # kept jobs with a NaN start time (not in the lists)
        self._ids: dict[str, int] = {}  # job id -> kept jobs with it
        self._repeated = 0  # job ids held by more than one kept job

    def _own(self) -> None:
        if self._shared:
            self._keys, self._items = self._keys[:], self._items[:]
            self._shared = False

    def _count_id(self, job_id: str, sign: int) -> None:
        n = self._ids.get(job_id, 0)
        if sign > 0:
            self._ids[job_id] = n + 1
            self._repeated += n == 1
        elif n <= 1:
            del self._ids[job_id]
        else:
            self._ids[job_id] = n - 1
            self._repeated -= n == 2

    def add(self, rj: RunningJob, per_model: dict[str, int]) -> None:
        if not may_be_victim(rj):
            return
        self._count_id(rj.job.id, 1)
        if rj.start_time != rj.start_time:  # NaN
            self._unordered += 1
            return
        key = victim_key(rj)
        self._own()
        pos = bisect_left(self._keys, key)
        self._keys.insert(pos, key)
        self._items.insert(pos, Candidate(rj, per_model, 0))

    def remove(self, rj: RunningJob) -> None:
        if not may_be_victim(rj):
            return
        self._count_id(rj.job.id, -1)
        if rj.start_time != rj.start_time:
            self._unordered -= 1
            return
        key = victim_key(rj)
        keys, items = self._keys, self._items
        pos = bisect_left(keys, key)
        while items[pos].rj is not rj:  # equal keys (a repeated id) sit side by side
            pos += 1
        self._own()
        del self._keys[pos]
        del self._items[pos]

    def order(self) -> list[Candidate] | None:
        """The kept jobs in victim order (not to be changed), or None when it may differ from a
        stable sort of them (see the class)."""
        if self._unordered or self._repeated:
            return None
        self._shared = True
        return self._items
