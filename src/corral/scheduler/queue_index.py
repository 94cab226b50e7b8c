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
from collections.abc import Callable, Sequence
from itertools import compress
from operator import attrgetter
from typing import Generic, TypeVar

from corral.scheduler.seqdiff import DiffMemo, appended_diff
from corral.scheduler.types import Job, RunningJob

OrderKey = tuple[str, int, float, str]  # (group, -priority, submit time, id)
SizedKey = tuple[int, int, float, str]  # (-priority, size class, submit time, id): a user's fair-share order
UserKey = tuple[str, str]  # (group, user)
_running_id = attrgetter("job.id")


def _running_counts(running: Sequence[RunningJob]) -> dict[str, int]:
    """How many of `running` carry each job id."""
    counts: dict[str, int] = {}
    for job_id in map(_running_id, running):
        counts[job_id] = counts.get(job_id, 0) + 1
    return counts


def order_key(job: Job) -> OrderKey:
    return (job.group, -int(job.priority), job.submit_time, job.id)


def _bump(counts: dict[str, int], key: str, delta: int) -> None:
    left = counts.get(key, 0) + delta
    if left:
        counts[key] = left
    else:
        del counts[key]


def _cpu_only(job: Job) -> bool:
    return all(t.resources.gpus <= 0 for t in job.tasks)


K = TypeVar("K", OrderKey, SizedKey)


class _Sorted(Generic[K]):
    """Jobs with their keys in two parallel lists, kept sorted by key."""

    __slots__ = ("jobs", "keys")

    def __init__(self) -> None:
        self.keys: list[K] = []
        self.jobs: list[Job] = []

    def add(self, key: K, job: Job) -> None:
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.jobs.insert(i, job)

    def remove(self, key: K, job: Job) -> None:
        i = bisect_left(self.keys, key)
        while self.jobs[i] is not job:  # equal keys only with duplicate ids (then sync gives up)
            i += 1
        del self.keys[i]
        del self.jobs[i]


class QueueIndex:
    """`size_of` (a pure function of the Job: the fair-share queue's size class): each user's jobs
    are also kept in the fair-share queue's in-user order (priority desc, size class, submit time,
    id), with every job's class, so that a cycle neither works the classes out nor sorts again."""

    def __init__(
        self, size_of: Callable[[Job], int] | None = None, running_diff: DiffMemo | None = None
    ) -> None:
        self.size_of = size_of
        # where the running tuples' difference is worked out: the Scheduler's, shared with its free
        # capacity (Occupied.sync diffs the same two tuples first in each cycle)
        self.running_diff = running_diff if running_diff is not None else DiffMemo()
        self.version = 0  # bumped by every sync that changed the queue: lists read later check it
        # The tuples the last sync that gave a list was handed: the very same queued tuple again
        # (the simulator's, when no job joined or left the queue since) needs no difference, and
        # the same running tuple no check against the running ids either.
        self.last_queued: tuple[Job, ...] | None = None
        self.last_running: tuple[RunningJob, ...] | None = None
        # The running tuple the last check against the waiting ids read, its jobs' ids counted,
        # and whether that check held (`_running_disjoint`)
        self.run_last: tuple[RunningJob, ...] | None = None
        self.run_ids: dict[str, int] | None = None  # run_last's ids counted, made when first needed
        self.last_ok = False
        self._clear()

    def _clear(self) -> None:
        self.held: dict[int, Job] = {}  # id(job) -> the job (held, so ids stay unique)
        self.keys: dict[int, OrderKey] = {}
        self.all: _Sorted[OrderKey] = _Sorted()
        self.users: dict[UserKey, _Sorted[OrderKey]] = {}
        self.sized: dict[UserKey, _Sorted[SizedKey]] = {}  # with size_of: each user's fair-share order
        self.size_keys: dict[int, SizedKey] = {}  # id(job) -> its key in `sized`
        self.sizes: dict[str, int] = {}  # job id -> size class (with size_of)
        self.sizes_stale = False  # an id was on two objects: `sizes` is made again from size_keys
        self.ids: dict[str, int] = {}  # job id -> queued Job objects carrying it
        self.duplicates = 0  # job ids carried by more than one queued Job object
        self.cpu: dict[str, int] = {}  # job id -> queued Job objects with it that ask for no GPU

    def sync(self, queued: Sequence[Job], running: Sequence[RunningJob]) -> list[Job] | None:
        """The waiting jobs in (group, priority desc, submit time, id) order, equal to
        `core.waiting_jobs` (None when the caller must work it out afresh)."""
        if queued is self.last_queued:  # unchanged since a sync that gave a list
            if running is not self.last_running:
                if not self._running_disjoint(running, ()):
                    return None
                self._seen(queued, running)
            return list(self.all.jobs)
        last = self.last_queued
        self.last_queued = self.last_running = None
        if last is not None and isinstance(queued, tuple):
            added = self._sync_appended(last, queued)
            if added is not None:
                return self._answer(queued, running, True, added)
        # A set of ids, not an id -> job dict: the few new jobs are picked out of `queued` at C
        # speed (as Occupied.sync does); the dict only for a rebuild.
        keys = list(map(id, queued))
        current = set(keys)
        held = self.held
        gone = held.keys() - current
        new = current.difference(held)
        if gone or new:
            self.version += 1
        if len(gone) + len(new) > max(64, len(queued) // 2):  # mostly new: sort afresh
            self._rebuild(dict(zip(keys, queued, strict=True)))
        else:
            for k in gone:
                self._remove(k)
            for job in compress(queued, map(new.__contains__, keys)) if new else ():
                k = id(job)
                if k not in held:  # (the same object twice is added once, as before)
                    self._add(k, job)
        return self._answer(queued, running, len(current) == len(queued), None)

    def _sync_appended(self, last: tuple[Job, ...], queued: tuple[Job, ...]) -> tuple[Job, ...] | None:
        """The difference when `queued` is the last tuple with a few jobs gone and new ones
        appended (the usual step: seqdiff.py), without a set over every waiting job: the same
        removals and additions (and the same choice of a rebuild) as the set difference; the
        jobs added. None, with nothing changed, when it is not that, or an appended job is one
        already held."""
        diff = appended_diff(last, queued)
        if diff is None:
            return None
        gone, tail = diff
        added = queued[tail:]
        held = self.held
        ids = [id(job) for job in added]
        if len(set(ids)) != len(ids) or any(k in held for k in ids):
            return None  # the same object twice, or a held job moved: the set difference
        if len(gone) + len(added) > max(64, len(queued) // 2):
            return None  # the set difference rebuilds
        if gone or added:
            self.version += 1
        for pos in gone:
            self._remove(id(last[pos]))
        for k, job in zip(ids, added, strict=True):
            self._add(k, job)
        return added

    def _answer(
        self,
        queued: Sequence[Job],
        running: Sequence[RunningJob],
        distinct: bool,
        added: Sequence[Job] | None,
    ) -> list[Job] | None:
        """The waiting jobs after a difference, or None (see `sync`); `distinct`: no object twice;
        `added`: the jobs the short difference added (None after the set difference)."""
        if not distinct or self.duplicates:
            return None  # the same object twice, or one id on two objects
        if self.sizes_stale:  # rare: every id is on one object again
            self.sizes = {key[3]: key[1] for key in self.size_keys.values()}
            self.sizes_stale = False
        if not self._running_disjoint(running, added):
            return None
        self._seen(queued, running)
        return list(self.all.jobs)

    def _running_disjoint(self, running: Sequence[RunningJob], added: Sequence[Job] | None) -> bool:
        """No waiting job's id is a running job's. The last check held it for the waiting jobs
        then and the running tuple `run_last` (`last_ok`): when the waiting jobs changed since
        only by removals and `added`, and the running tuple is `run_last` with jobs removed and
        new ones appended (seqdiff.py), only the new ones on either side are looked up (the
        running ids counted, kept with `run_last`); otherwise every running job's id."""
        last, self.run_last = self.run_last, None
        if added is not None and last is not None and isinstance(running, tuple) and self.last_ok:
            diff = ([], len(running)) if running is last else self.running_diff.diff(last, running)
            if diff is not None:
                run_ids = self.run_ids
                if run_ids is None:  # counted only now: the live loop's fresh tuples never get here
                    run_ids = self.run_ids = _running_counts(last)
                gone, tail = diff
                for pos in gone:
                    _bump(run_ids, last[pos].job.id, -1)
                new_running = running[tail:]
                for rj in new_running:
                    _bump(run_ids, rj.job.id, 1)
                self.run_last = running
                ids = self.ids
                self.last_ok = not any(j.id in run_ids for j in added) and not any(
                    rj.job.id in ids for rj in new_running
                )
                return self.last_ok
        self.run_ids = None
        self.run_last = running if isinstance(running, tuple) else None
        self.last_ok = self.ids.keys().isdisjoint(map(_running_id, running))
        return self.last_ok

    def _seen(self, queued: Sequence[Job], running: Sequence[RunningJob]) -> None:
        """Keep the tuples a sync gave a list for (lists could change under the same identity)."""
        self.last_queued = queued if isinstance(queued, tuple) else None
        self.last_running = running if isinstance(running, tuple) else None

    def per_user(self) -> dict[str, dict[str, list[Job]]]:
        """Waiting jobs per group and user, each list in (priority desc, submit time, id) order
        (valid after a `sync` that returned a list). The lists are the index's own: read only."""
        out: dict[str, dict[str, list[Job]]] = {}
        for (group, user), s in self.users.items():
            out.setdefault(group, {})[user] = s.jobs
        return out

    def per_user_sized(self) -> dict[str, dict[str, list[Job]]]:
        """`per_user` with each list in (priority desc, size class, submit time, id) order (the
        index was made with a size_of); the classes are in `sizes`. Read only."""
        out: dict[str, dict[str, list[Job]]] = {}
        for (group, user), s in self.sized.items():
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
        if self.size_of is not None:  # the in-user fair-share order, appended in order too
            size_of, sizes = self.size_of, self.sizes
            sized_items = []
            for k, job in current.items():
                if job.id in sizes:  # a second object with this id
                    self.sizes_stale = True
                size = sizes[job.id] = size_of(job)
                sized_items.append(((-int(job.priority), size, job.submit_time, job.id), k, job))
            sized_items.sort(key=lambda t: t[0])
            for skey, k, job in sized_items:
                self.size_keys[k] = skey
                uk = (job.group, job.user)
                found = self.sized.get(uk)
                if found is None:
                    found = self.sized[uk] = _Sorted()
                found.keys.append(skey)
                found.jobs.append(job)

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
        if self.size_of is not None:
            self._add_sized(k, job)

    def _add_sized(self, k: int, job: Job) -> None:
        assert self.size_of is not None
        size = self.size_of(job)
        key = self.size_keys[k] = (-int(job.priority), size, job.submit_time, job.id)
        if job.id in self.sizes:  # a second object with this id
            self.sizes_stale = True
        self.sizes[job.id] = size
        uk = (job.group, job.user)
        s = self.sized.get(uk)
        if s is None:
            s = self.sized[uk] = _Sorted()
        s.add(key, job)

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
        if self.size_of is not None:
            sized = self.sized[uk]
            sized.remove(self.size_keys.pop(k), job)
            if not sized.jobs:
                del self.sized[uk]
            if job.id in self.ids:  # another object carries its id: its class, once it is alone
                self.sizes_stale = True
            else:
                del self.sizes[job.id]
