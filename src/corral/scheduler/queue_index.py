"""The waiting queue kept in order between cycles: a pure cache of the `Scheduler`.

Every cycle needs the waiting jobs sorted by (group, priority desc, submit time, id) and, for fair
share, split per (group, user) in that order. Sorting and splitting thousands of waiting jobs
afresh each cycle made a replay's cost per job grow with the queue's depth. `QueueIndex` keeps
both orders between calls and applies only the difference in the queued Job objects (compared by
identity, with strong references held so an id() is never confused with a new object's): a
cycle costs O(changes x log n) plus C-speed set operations over the queue, instead of Python-level
work per waiting job.

It never changes a result: `sync` gives exactly what `core.waiting_jobs` computes, and returns
None (the caller sorts afresh) in the rare cases it does not handle: the same Job object twice, two
queued jobs with one id, a queued job that also runs.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from operator import attrgetter

from corral.scheduler.types import Job, RunningJob

OrderKey = tuple[str, int, float, str]  # (group, -priority, submit time, id)
UserKey = tuple[str, str]  # (group, user)
_running_id = attrgetter("job.id")


def order_key(job: Job) -> OrderKey:
    return (job.group, -int(job.priority), job.submit_time, job.id)


def _cpu_only(job: Job) -> bool:
    return all(t.resources.gpus <= 0 for t in job.tasks)


class _Sorted:
    """Jobs with their keys in two parallel lists, kept sorted by key."""

    __slots__ = ("jobs", "keys")

    def __init__(self) -> None:
        self.keys: list[OrderKey] = []
        self.jobs: list[Job] = []

    def add(self, key: OrderKey, job: Job) -> None:
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.jobs.insert(i, job)

    def remove(self, key: OrderKey, job: Job) -> None:
        i = bisect_left(self.keys, key)
        while self.jobs[i] is not job:  # equal keys only with duplicate ids (then sync gives up)
            i += 1
        del self.keys[i]
        del self.jobs[i]


class QueueIndex:
    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.held: dict[int, Job] = {}  # id(job) -> the job (held, so ids stay unique)
        self.keys: dict[int, OrderKey] = {}
        self.all = _Sorted()
        self.users: dict[UserKey, _Sorted] = {}
        self.ids: dict[str, int] = {}  # job id -> queued Job objects carrying it
        self.duplicates = 0  # job ids carried by more than one queued Job object
        self.cpu: dict[str, int] = {}  # job id -> queued Job objects with it that ask for no GPU

    def sync(self, queued: Sequence[Job], running: Sequence[RunningJob]) -> list[Job] | None:
        """The waiting jobs in (group, priority desc, submit time, id) order, equal to
        `core.waiting_jobs` (None when the caller must work it out afresh)."""
        current = dict(zip(map(id, queued), queued, strict=True))
        held = self.held
        gone = held.keys() - current.keys()
        new = current.keys() - held.keys()
        if len(gone) + len(new) > max(64, len(queued) // 2):  # mostly new: sort afresh
            self._rebuild(current)
        else:
            for k in gone:
                self._remove(k)
            for k in new:
                self._add(k, current[k])
        if len(current) != len(queued) or self.duplicates:
            return None  # the same object twice, or one id on two objects
        if not self.ids.keys().isdisjoint(map(_running_id, running)):  # at C speed
            return None
        return list(self.all.jobs)

    def per_user(self) -> dict[str, dict[str, list[Job]]]:
        """Waiting jobs per group and user, each list in (priority desc, submit time, id) order
        (valid after a `sync` that returned a list). The lists are the index's own: read only."""
        out: dict[str, dict[str, list[Job]]] = {}
        for (group, user), s in self.users.items():
            out.setdefault(group, {})[user] = s.jobs
        return out

    @property
    def cpu_ids(self) -> set[str]:
        """Ids of the waiting jobs that ask for no GPU."""
        return set(self.cpu)

    def _rebuild(self, current: dict[int, Job]) -> None:
        self._clear()
        items = sorted(((order_key(j), k, j) for k, j in current.items()), key=lambda t: t[0])
        for key, k, job in items:  # appended in order: every list stays sorted
            self.held[k] = job
            self.keys[k] = key
            self.all.keys.append(key)
            self.all.jobs.append(job)
            uk = (job.group, job.user)
            s = self.users.get(uk)
            if s is None:
                s = self.users[uk] = _Sorted()
            s.keys.append(key)
            s.jobs.append(job)
            self._count(job, 1)

    def _count(self, job: Job, sign: int) -> None:
        n = self.ids.get(job.id, 0) + sign
        if (sign > 0 and n == 2) or (sign < 0 and n == 1):
            self.duplicates += sign
        if n:
            self.ids[job.id] = n
        else:
            del self.ids[job.id]
        if _cpu_only(job):
            c = self.cpu.get(job.id, 0) + sign
            if c:
                self.cpu[job.id] = c
            else:
                del self.cpu[job.id]

    def _add(self, k: int, job: Job) -> None:
        key = order_key(job)
        self.held[k] = job
        self.keys[k] = key
        self.all.add(key, job)
        uk = (job.group, job.user)
        s = self.users.get(uk)
        if s is None:
            s = self.users[uk] = _Sorted()
        s.add(key, job)
        self._count(job, 1)

    def _remove(self, k: int) -> None:
        job = self.held.pop(k)
        key = self.keys.pop(k)
        self.all.remove(key, job)
        uk = (job.group, job.user)
        s = self.users[uk]
        s.remove(key, job)
        if not s.jobs:
            del self.users[uk]
        self._count(job, -1)
