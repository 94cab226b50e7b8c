"""The cycle's queue: in what order waiting jobs are considered (Profile.order).

- fair_share (`FairShareQueue`): groups take turns by weighted decayed usage (plus what they run
  now, and what this cycle already gave them); inside a group, higher priority first, then (with
  size_order) the smallest estimated job, then the user with the least usage, then submit time;
  a starvation guard puts long-waiting jobs first.
- fifo: submit time. sjf: shortest runtime estimate first. las: Tiresias-style discretised 2-D
  least attained service (GPU-seconds) queues, FIFO inside a queue (`OrderedQueue`).

`build_queue` makes the cycle's queue. Whether quota lets a job in is admission.py's.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import groupby
from operator import attrgetter
from typing import Protocol

from corral.scheduler.admission import cpu_only, las_queue, size_class
from corral.scheduler.cluster import RunningTotals
from corral.scheduler.types import Group, Job, Usage


class QueuePolicy(Protocol):
    """The Profile fields the queue reads (a Profile; admission does not import profiles.py)."""

    @property
    def order(self) -> str: ...
    @property
    def fair_share_horizon_s(self) -> float: ...
    @property
    def las_thresholds(self) -> tuple[float, ...]: ...
    @property
    def size_order(self) -> bool: ...
    @property
    def default_runtime_s(self) -> float: ...
    @property
    def starvation_s(self) -> float: ...


# A sort key of numbers (bools and ints count as floats) ending in the job id: (submit time, id)...
OrderKey = tuple[float | str, ...]


class OrderedQueue:
    """A fixed order (fifo, sjf, las); `key` sorts jobs into it."""

    aged: Sequence[Job] = ()  # no starvation guard (fair_share only)

    def __init__(self, jobs: list[Job], key: Callable[[Job], OrderKey]) -> None:
        self.key = key
        self._jobs = deque(sorted(jobs, key=key))
        self.cpu_ids = {j.id for j in jobs if cpu_only(j)}
        self.cpu_only_left = len(self.cpu_ids)
        self.parked: list[Job] = []

    def pop(self) -> Job | None:
        if not self._jobs:
            return None
        job = self._jobs.popleft()
        if job.id in self.cpu_ids:
            self.cpu_only_left -= 1
        return job

    def charge(self, job: Job) -> None:
        """Ordering does not depend on what was placed."""

    def run_ahead(self) -> Sequence[Job]:
        """The jobs pop() returns next, in order (the order never changes)."""
        return self._jobs

    def skip(self, n: int) -> list[Job]:
        """Pop the next `n` jobs, all GPU work (see run_ahead)."""
        jobs = self._jobs
        return [jobs.popleft() for _ in range(n)]

    def park(self, job: Job) -> None:
        """Keep the job just popped for the second (borrowing) pass."""
        self.parked.append(job)
        self.cpu_only_left += job.id in self.cpu_ids

    def resume(self, jobs: list[Job]) -> None:
        """Start the second pass: parked and deferred jobs back in, in order."""
        merged = [*self.parked, *jobs, *self._jobs]
        self.parked = []
        self.cpu_ids |= {j.id for j in jobs if cpu_only(j)}
        self.cpu_only_left = sum(1 for j in merged if j.id in self.cpu_ids)
        self._jobs = deque(sorted(merged, key=self.key))


_user_of = attrgetter("user")


UserKey = tuple[int, int, float, float, str, str]  # (-priority, size class, user share, submit, id, user)


class FairShareQueue:
    """Groups take turns by share; inside a group, priority, then (with `size_of`) the smallest
    estimated job, then the least-served user, then age.

    `by_user` lists each group's jobs per user by (priority desc, submit time, id); `cpu_ids` are
    the ids of those that ask for no GPU (`split_by_user` makes both from per-group lists).
    `presorted`: the lists are already in the in-user order with `size_of` (`_job_key`).
    Starvation guard: `aged` jobs (waiting since before `now - starvation_s`) come first of all,
    oldest first, in the first (guaranteed) pass only, so that they open their backfill
    reservation and search for victims before any other job takes what they wait for; one whose
    group has no guaranteed quota left is parked and goes back to its group's order."""

    def __init__(
        self,
        by_user: Mapping[str, Mapping[str, Sequence[Job]]],
        cpu_ids: set[str],
        weights: Mapping[str, float],
        group_usage: Mapping[str, float],
        user_usage: Mapping[tuple[str, str], float],
        horizon_s: float,
        size_of: Callable[[Job], int] | None = None,
        aged_before: float | None = None,
        presorted: bool = False,
    ) -> None:
        self.horizon = horizon_s
        self.weights = weights
        self.size_of = size_of
        # the classes themselves when `size_of` keeps them (build_queue's): a look-up instead of a
        # call in every user key (one per pop, the queue's most frequent step)
        self._sizes = size_of.sizes if isinstance(size_of, KeptSizeClasses) else None
        self.group_share = {g: group_usage.get(g, 0.0) / max(weights.get(g, 1.0), 1e-9) for g in by_user}
        self.user_share = dict(user_usage)
        self.users: dict[str, dict[str, deque[Job]]] = {}
        self.user_heaps: dict[str, list[UserKey]] = {}
        self.group_heap: list[tuple[float, str]] = []
        self.cpu_ids = cpu_ids
        self.cpu_only_left = 0
        self._pending: tuple[str, str] | None = None
        self._charged = False  # a job was charged since the last pop (shares changed)
        self.aged: deque[Job] = deque()  # the starvation guard's jobs, oldest first
        self._aged_popped: Job | None = None  # the last pop() came from `aged`
        self._aged_parked: list[Job] = []
        self._aged_before = aged_before
        for g, lists in by_user.items():
            per_user = {}
            for u, jobs in lists.items():
                if aged_before is not None:
                    old = [j for j in jobs if j.submit_time <= aged_before]
                    if old:
                        self.aged.extend(old)
                        jobs = [j for j in jobs if j.submit_time > aged_before]
                if size_of is not None and len(jobs) > 1 and not presorted:
                    jobs = sorted(jobs, key=self._job_key)
                if jobs:
                    per_user[u] = deque(jobs)
            self.users[g] = per_user
            heap = [self._user_key(g, u, q[0]) for u, q in per_user.items()]
            heapq.heapify(heap)
            self.user_heaps[g] = heap
            self.group_heap.append((self.group_share[g], g))
        heapq.heapify(self.group_heap)
        if len(self.aged) > 1:
            self.aged = deque(sorted(self.aged, key=attrgetter("submit_time", "id")))
        self.cpu_only_left = len(self.cpu_ids)

    def _job_key(self, job: Job) -> tuple[int, int, float, str]:
        """A user's jobs in pop order: priority, size class (with `size_of`), submit time."""
        size = self.size_of(job) if self.size_of is not None else 0
        return (-int(job.priority), size, job.submit_time, job.id)

    def _user_key(self, g: str, user: str, head: Job) -> UserKey:
        sizes = self._sizes
        size = sizes.get(head.id) if sizes is not None else None
        if size is None:
            size = self.size_of(head) if self.size_of is not None else 0
        share = self.user_share.get((g, user), 0.0)
        return (-head.priority, size, share, head.submit_time, head.id, user)  # (-IntEnum: an int)

    def pop(self) -> Job | None:
        pending = self._pending
        if pending is not None and not self._charged and not self.aged:
            # Nothing charged since the last pop: the group popped then still has the least share
            # (every other entry is as it was), so it comes first again; only its user heap moves
            # (push then pop, in one heap operation: the same job as _flush then the loop below).
            g, user = pending
            q = self.users[g][user]
            heap = self.user_heaps[g]
            if q:
                top = heapq.heappushpop(heap, self._user_key(g, user, q[0]))
            elif heap:
                top = heapq.heappop(heap)
            else:  # the group has no job left: _flush would put nothing back
                top = None
                self._pending = None
            if top is not None:
                user = top[-1]
                job = self.users[g][user].popleft()
                self._pending = (g, user)
                if job.id in self.cpu_ids:
                    self.cpu_only_left -= 1
                return job
        self._charged = False
        self._aged_popped = None
        if self.aged:
            self._flush()
            job = self.aged.popleft()
            self._aged_popped = job
            if job.id in self.cpu_ids:
                self.cpu_only_left -= 1
            return job
        # `_flush` then the loop below, with the last popped group's and user's entries pushed
        # and the least popped in one heap operation each (the same entry either way: a group is
        # in the group heap at most once and a user in its group's heap at most once, so no two
        # entries are equal). The expected-start queue (diagnosis.py) charges every job it pops.
        back: tuple[float, str] | None = None  # the last popped group's entry, to go back
        back_user: UserKey | None = None  # and its user's, when that user has jobs left
        back_g = ""
        pending = self._pending
        if pending is not None:
            self._pending = None
            back_g, user = pending
            q = self.users[back_g][user]
            if q:
                back_user = self._user_key(back_g, user, q[0])
            if back_user is not None or self.user_heaps[back_g]:
                back = (self.group_share[back_g], back_g)
        group_heap = self.group_heap
        while True:
            if back is not None:
                _, g = heapq.heappushpop(group_heap, back)
                back = None
            elif group_heap:
                _, g = heapq.heappop(group_heap)
            else:
                return None
            heap = self.user_heaps[g]
            if back_user is not None:
                if g == back_g:
                    *_, user = heapq.heappushpop(heap, back_user)
                    back_user = None
                    job = self.users[g][user].popleft()
                    self._pending = (g, user)
                    if job.id in self.cpu_ids:
                        self.cpu_only_left -= 1
                    return job
                heapq.heappush(self.user_heaps[back_g], back_user)
                back_user = None
            if not heap:
                continue
            *_, user = heapq.heappop(heap)
            job = self.users[g][user].popleft()
            self._pending = (g, user)
            if job.id in self.cpu_ids:
                self.cpu_only_left -= 1
            return job

    def _flush(self) -> None:
        """Put the last popped group and user back, keyed by their shares after any charge."""
        if self._pending is None:
            return
        g, user = self._pending
        self._pending = None
        q = self.users[g][user]
        if q:
            heapq.heappush(self.user_heaps[g], self._user_key(g, user, q[0]))
        if self.user_heaps[g]:
            heapq.heappush(self.group_heap, (self.group_share[g], g))

    def run_ahead(self) -> Sequence[Job]:
        """Jobs pop() returns next, in order, as long as nothing is charged: the rest of the last
        popped user's jobs when that user is the only one its group has left (an uncharged group
        keeps the lowest share, so it stays first); empty otherwise."""
        if self._pending is None or self.aged:
            return ()
        g, user = self._pending
        if self.user_heaps[g]:
            return ()  # other users of the group interleave by their own keys
        return self.users[g][user]

    def skip(self, n: int) -> list[Job]:
        """Pop the next `n` jobs of run_ahead(), all GPU work, with nothing charged since."""
        assert self._pending is not None
        g, user = self._pending
        q = self.users[g][user]
        return [q.popleft() for _ in range(n)]

    def park(self, job: Job) -> None:
        """Put back the job just popped and take its group out of this pass (it has no
        guaranteed quota left; its jobs wait for the borrowing pass)."""
        self.cpu_only_left += job.id in self.cpu_ids
        if self._aged_popped is job:  # back into its group's order in the borrowing pass
            self._aged_popped = None
            self._aged_parked.append(job)
            return
        assert self._pending is not None
        g, user = self._pending
        self._pending = None
        self.users[g][user].appendleft(job)
        heapq.heappush(self.user_heaps[g], self._user_key(g, user, job))

    def resume(self, jobs: list[Job]) -> None:
        """Start the second pass: every group with jobs back in, deferred jobs re-inserted; the
        starving jobs (parked, deferred or not yet reached) first again, oldest first."""
        self._flush()
        cutoff = self._aged_before
        aged = [*self._aged_parked, *self.aged]
        self.cpu_only_left -= sum(1 for j in aged if j.id in self.cpu_ids)  # all counted again below
        if cutoff is not None:
            aged += [j for j in jobs if j.submit_time <= cutoff]
            jobs = [j for j in jobs if j.submit_time > cutoff]
        self._aged_parked = []
        for j in aged:
            if cpu_only(j):
                self.cpu_ids.add(j.id)
        self.cpu_only_left += sum(1 for j in aged if j.id in self.cpu_ids)
        self.aged = deque(sorted(aged, key=attrgetter("submit_time", "id")))
        back: dict[tuple[str, str], list[Job]] = {}
        for j in jobs:
            self.user_heaps.setdefault(j.group, [])
            self.group_share.setdefault(j.group, 0.0)
            back.setdefault((j.group, j.user), []).append(j)
            if cpu_only(j):
                self.cpu_ids.add(j.id)
            self.cpu_only_left += j.id in self.cpu_ids
        for (g, u), returning in back.items():
            q = self.users.setdefault(g, {}).setdefault(u, deque())
            returning.sort(key=self._job_key)
            if not q or self._job_key(returning[-1]) < self._job_key(q[0]):
                q.extendleft(reversed(returning))  # the usual case: they were popped off its front
            else:
                q.extend(returning)
                self.users[g][u] = deque(sorted(q, key=self._job_key))
        touched = back.keys()
        for g in {g for g, _ in touched}:
            heap = [self._user_key(g, u, q[0]) for u, q in self.users[g].items() if q]
            heapq.heapify(heap)
            self.user_heaps[g] = heap
        self.group_heap = [(self.group_share[g], g) for g, heap in self.user_heaps.items() if heap]
        heapq.heapify(self.group_heap)

    def taken(self, groups: Collection[str]) -> None:
        """After a caller took jobs off the front of `groups`' user lists and set those groups' and
        users' shares as pop() and charge() would have (eta_kept.KeptOrder): the heaps from the
        lists and shares, so pop() goes on as after those pops (every entry's key is unique, so
        the heaps' layout does not change what they give)."""
        for g in groups:
            heap = [self._user_key(g, u, q[0]) for u, q in self.users[g].items() if q]
            heapq.heapify(heap)
            self.user_heaps[g] = heap
        self.group_heap = [(self.group_share[g], g) for g, heap in self.user_heaps.items() if heap]
        heapq.heapify(self.group_heap)
        self._pending = None
        self._charged = False

    def charge(self, job: Job) -> None:
        """Count a placed job against its group's and user's share for the rest of the cycle."""
        self._charged = True
        cost = max(job.total_gpus, 0) * self.horizon
        g = job.group
        self.group_share[g] = self.group_share.get(g, 0.0) + cost / max(self.weights.get(g, 1.0), 1e-9)
        self.user_share[(g, job.user)] = self.user_share.get((g, job.user), 0.0) + cost


def split_by_user(
    jobs_by_group: Mapping[str, list[Job]],
) -> tuple[dict[str, dict[str, list[Job]]], set[str]]:
    """Per group, its jobs per user (in the group's order), and the ids of CPU-only jobs."""
    by_user: dict[str, dict[str, list[Job]]] = {}
    cpu_ids: set[str] = set()
    for g, jobs in jobs_by_group.items():
        per_user: dict[str, list[Job]] = {}
        if len(set(map(_user_of, jobs))) == 1:  # one user: the group's order as it is
            per_user[jobs[0].user] = jobs
        else:
            for j in jobs:
                q = per_user.get(j.user)
                if q is None:
                    q = per_user[j.user] = []
                q.append(j)
        # the first test settles most jobs (a GPU job's first task asks for GPUs)
        cpu_ids.update(j.id for j in jobs if not j.tasks or (j.tasks[0].resources.gpus <= 0 and cpu_only(j)))
        by_user[g] = per_user
    return by_user, cpu_ids


def group_order_key(job: Job) -> tuple[int, float, str]:
    return (-int(job.priority), job.submit_time, job.id)


class KeptSizeClasses:
    """A job's size class (`size_class`), kept per job id for one cycle. An object rather than a
    closure: mypyc's compiled closure and its environment refer to each other, a reference cycle
    that would leave every cycle's queue to the garbage collector."""

    def __init__(self, sizes: dict[str, int], default_runtime_s: float) -> None:
        self.sizes, self.default_runtime_s = sizes, default_runtime_s

    def __call__(self, job: Job) -> int:
        found = self.sizes.get(job.id)
        if found is None:
            found = self.sizes[job.id] = size_class(job, self.default_runtime_s)
        return found


def build_queue(
    jobs: list[Job],
    policy: QueuePolicy,
    groups: Mapping[str, Group],
    usage: Usage,
    running: RunningTotals,
    now: float,
    indexed: tuple[dict[str, dict[str, list[Job]]], set[str]] | None = None,
    sized: Mapping[str, int] | None = None,
) -> FairShareQueue | OrderedQueue:
    """The cycle's queue over `jobs` (sorted by group, priority desc, submit time, id); `indexed`:
    the same jobs already split per group and user, with the CPU-only ids (queue_index.py).
    `sized` (with `indexed`, under size_order): every job's size class by id, the per-user lists
    being already in the size order (queue_index.py keeps both between cycles)."""
    order, horizon_s, las_thresholds = policy.order, policy.fair_share_horizon_s, policy.las_thresholds
    if order == "fifo":
        return OrderedQueue(jobs, key=lambda j: (j.submit_time, j.id))
    if order == "sjf":
        return OrderedQueue(
            jobs, key=lambda j: (j.runtime_estimate is None, j.runtime_estimate or 0.0, j.submit_time, j.id)
        )
    if order == "las":
        return OrderedQueue(
            jobs, key=lambda j: (las_queue(j.attained_gpu_seconds, las_thresholds), j.submit_time, j.id)
        )
    if indexed is None:
        by_group: dict[str, list[Job]] = {}
        for name, run in groupby(jobs, key=attrgetter("group")):  # callers pass jobs sorted by group
            by_group.setdefault(name, []).extend(run)
        indexed = split_by_user(by_group)
    by_user, cpu_ids = indexed
    group_usage = dict(usage.by_group)
    user_usage = dict(usage.by_user)
    # what runs now counts as `horizon_s` more seconds of use
    for (name, _), n in running.by_group_model.items():
        group_usage[name] = group_usage.get(name, 0.0) + n * horizon_s
    for uk, n in running.by_user.items():
        user_usage[uk] = user_usage.get(uk, 0.0) + n * horizon_s
    weights = {name: g.weight for name, g in groups.items()}
    size_of = None
    if policy.size_order:
        # the cycle's: sorting and every pop read a job's class
        sizes: dict[str, int] = {} if sized is None or indexed is None else dict(sized)
        size_of = KeptSizeClasses(sizes, policy.default_runtime_s)
    aged_before = now - policy.starvation_s if policy.starvation_s > 0 else None
    presorted = sized is not None and size_of is not None
    return FairShareQueue(
        by_user, cpu_ids, weights, group_usage, user_usage, horizon_s, size_of, aged_before, presorted
    )
