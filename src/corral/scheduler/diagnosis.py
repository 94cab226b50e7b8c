"""Diagnosis of waiting jobs: reasons from the placement filters' own refusals on the final free
capacity (and the reasons the cycle's stages recorded), queue positions in the order jobs are
expected to start, and estimated starts from rolling the plan forward with runtime estimates.

The roll (`Profile.eta_roll`): "backfill" (eta.py: per-model timelines, conservative backfill,
remaining times of running jobs from what they ran) or "pooled" (the earlier walk below, kept as
a baseline: each GPU model one pool, waiting jobs in order, one clock for all of them). A job held
by its group's quota or its user's cap keeps its place in the roll but gets no time; its reason
says what it waits for. A job that waits for CPUs or memory starts no earlier than a node that
could take it has them free (eta_cpu.py). Bounded by Profile.eta_limit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING

from corral.domain import HELD_CODES  # quota-stage reasons whose diagnosis gives no time
from corral.scheduler.admission import STORAGE_SOURCE
from corral.scheduler.backfill import Event
from corral.scheduler.cluster import ClusterState, Request, ShapeKey, shape_key
from corral.scheduler.eta import backfill_starts, running_events, through_last
from corral.scheduler.eta_cpu import CpuMemoryFloors, raise_to_floors
from corral.scheduler.eta_kept import OrderRecorder
from corral.scheduler.jobinfo import JobInfo, Waiting, job_models
from corral.scheduler.plugins import FILTERS
from corral.scheduler.profiles import Profile, grace_of
from corral.scheduler.queues import FairShareQueue, split_by_user
from corral.scheduler.types import Allocation, Diagnosis, Job, Reason, TaskSpec
from corral.words import gpus_of, plural

if TYPE_CHECKING:
    from corral.scheduler.core import Cycle

RANGE_LIMIT = 200  # waiting jobs, first in the start order, whose estimate gets a range (2 more rolls)

__all__ = ["CapacityReasons", "DiagnosisView", "Event", "LazyDiagnoses", "Waiting", "job_models"]


class LazyDiagnoses(Mapping[str, Diagnosis]):
    """The plan's diagnoses, built on first access: one job's alone when it is looked up by id
    (`one`), all at once when they are iterated or counted.

    Building them (a reason, a queue position and an estimate for every waiting job) costs about as
    much as placing; a caller that never asks "why is it waiting" in a cycle does not pay for it.
    The builders only read the cycle's final state, so the result is the same whenever they run."""

    def __init__(
        self,
        build: Callable[[], dict[str, Diagnosis]],
        one: Callable[[str], Diagnosis | None] | None = None,
        eta: Callable[[str], float | None] | None = None,
        etas: Callable[[Collection[str]], dict[str, float | None]] | None = None,
    ) -> None:
        self._build: Callable[[], dict[str, Diagnosis]] | None = build
        self._one = one
        self._eta = eta
        self._etas = etas
        self._data: dict[str, Diagnosis] | None = None

    def estimated_starts(self, job_ids: Collection[str]) -> dict[str, float | None]:
        """Several jobs' estimated starts (each equal to its Diagnosis's), rolling the plan forward
        only as far as the last of them: what the simulator reads for the jobs that just arrived."""
        if self._data is None and self._etas is not None:
            return self._etas(job_ids)
        return {job_id: self.estimated_start(job_id) for job_id in job_ids}

    def estimated_start(self, job_id: str) -> float | None:
        """`self[job_id].estimated_start` without building its reasons (None also when the job is
        not waiting): what the simulator scores, at the cost of the estimates alone."""
        if self._data is None and self._eta is not None:
            return self._eta(job_id)
        found = self._get().get(job_id)
        return None if found is None else found.estimated_start

    def _get(self) -> dict[str, Diagnosis]:
        if self._data is None:
            assert self._build is not None
            self._data = self._build()
            self._build = self._one = self._eta = self._etas = None  # let the cycle's state go
        return self._data

    def __getitem__(self, job_id: str) -> Diagnosis:
        if self._data is None and self._one is not None:
            found = self._one(job_id)
            if found is None:
                raise KeyError(job_id)
            return found
        return self._get()[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


@dataclass(slots=True)
class Refusals:
    """What the filters said of every node for one task instance: how many nodes passed them all,
    and for the others the first filter that refused each (by its position in the profile)."""

    passing: int = 0
    by_filter: dict[int, dict[str, int]] = field(default_factory=dict)  # position -> code -> nodes
    not_ready: dict[str, int] = field(default_factory=dict)  # node state -> nodes node_state refused

    def not_ready_note(self) -> str:
        """ "1 node cordoned, 2 nodes down" (empty when node_state refused nothing)."""
        return ", ".join(
            f"{n} node{'s' if n > 1 else ''} {state}" for state, n in sorted(self.not_ready.items())
        )


class CapacityReasons:
    """Why a job does not fit the free capacity left at the end of the cycle, from the refusals of
    the very filters placement ran (cached per job shape and per instance request)."""

    def __init__(self, st: ClusterState, profile: Profile) -> None:
        self.st = st
        self.filters = [(name, FILTERS[name]) for name in profile.filters]
        self.cpu_on_gpu = profile.cpu_jobs_on_gpu_nodes
        self._cache: dict[ShapeKey, tuple[Reason]] = {}
        self._refusals: dict[Request, Refusals] = {}

    def reasons(self, job: Job, key: ShapeKey | None = None) -> tuple[Reason]:
        key = shape_key(job) if key is None else key
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = (self._reason(job),)
        return hit

    def refusals(self, req: Request) -> Refusals:
        """Run the profile's filters over every node for one instance of `req`."""
        found = self._refusals.get(req)
        if found is not None:
            return found
        out = self._refusals[req] = Refusals()
        st, filters, cpu_on_gpu = self.st, self.filters, self.cpu_on_gpu
        for i, node in enumerate(st.nodes):
            for pos, (name, f) in enumerate(filters):
                code = f(st, i, req, cpu_on_gpu)
                if code is not None:
                    codes = out.by_filter.setdefault(pos, {})
                    codes[code] = codes.get(code, 0) + 1
                    if name == "node_state":
                        state = node.state.value
                        out.not_ready[state] = out.not_ready.get(state, 0) + 1
                    break
            else:
                out.passing += 1
        return out

    def _models(self, t: TaskSpec) -> tuple[list[str], str, int]:
        """The cluster models the task may use, their label, and their free GPUs on ready nodes."""
        st, allowed = self.st, t.resources.gpu_models
        models = [m for m in st.models if allowed is None or m in allowed]
        return models, "|".join(models) or "any", sum(st.free_total.get(m, 0) for m in models)

    def _reason(self, job: Job) -> Reason:
        for t in job.tasks:
            r = t.resources
            refusals = self.refusals(Request(r.gpus, r.gpu_models, r.cpus, r.memory_mib))
            if refusals.passing == 0:
                return self._refused(t, refusals)
            if r.gpus > 0:  # some node takes one instance; are there enough free GPUs for all?
                _, label, free = self._models(t)
                if free < t.instances * r.gpus:
                    return self._too_few_gpus(t.instances * r.gpus, label, free, refusals)
        return Reason(
            "no_fit",
            "placement:gang",
            "free capacity exists, but no set of nodes holds every instance with its GPUs, CPUs "
            "and memory at once",
        )

    def _refused(self, t: TaskSpec, refusals: Refusals) -> Reason:
        """No node passed every filter for one instance: the reason of the filter that refused
        the nodes that got furthest (the last filter in order that refused any)."""
        pos = max(refusals.by_filter)
        name = self.filters[pos][0]
        r = t.resources
        note = refusals.not_ready_note()
        if name == "node_state":
            return Reason(
                "node_not_ready", "filter:node_state", f"no node that could take it is ready: {note}"
            )
        suffix = f"; not ready: {note}" if note else ""
        if name == "gpu_free" and r.gpus > 0:
            models, label, free = self._models(t)
            if free < t.instances * r.gpus:
                return self._too_few_gpus(t.instances * r.gpus, label, free, refusals)
            block = max((self.st.largest_block(m) for m in models), default=0)
            return Reason(
                "gpu_fragmented",
                "filter:gpu_free",
                f"needs {gpus_of(r.gpus, label)} on one node; largest free block is {block}{suffix}",
            )
        if name == "cpu_memory":
            where = "for CPU-only work" if r.gpus <= 0 else f"with {plural(r.gpus, 'free GPU')}"
            return Reason(
                "insufficient_cpu_memory",
                "filter:cpu_memory",
                f"needs {plural(r.cpus, 'CPU')} and {r.memory_mib} MiB on a node {where}; "
                f"none has it free{suffix}",
            )
        codes = refusals.by_filter[pos]
        code = max(codes, key=lambda c: (codes[c], c))
        return Reason(
            code, f"filter:{name}", f"the {name} filter refused {plural(sum(codes.values()), 'node')}{suffix}"
        )

    @staticmethod
    def _too_few_gpus(need: int, label: str, free: int, refusals: Refusals) -> Reason:
        note = refusals.not_ready_note()
        suffix = f"; not ready: {note}" if note else ""
        return Reason(
            "insufficient_gpus",
            "filter:gpu_free",
            f"needs {gpus_of(need, label)}; {free} {'is' if free == 1 else 'are'} free now{suffix}",
        )


def estimate_starts(
    now: float,
    free_by_model: Mapping[str, int],
    capacity_by_model: Mapping[str, int],
    events: Sequence[Event],
    waiting: Sequence[Waiting],
    default_runtime_s: float,
    targets: Collection[str] | None = None,
) -> dict[str, float | None]:
    """Roll the cluster forward: each waiting job (in order) starts when its model pool has room.
    With `targets`, stop once all of them have their estimate (later jobs cannot change it)."""
    waiting = through_last(waiting, targets)
    pools = {w[2] for w in waiting if w[1] > 0}
    if len(pools) == 1:
        (only,) = pools
        if len(only) == 1:  # one pool of one model (a homogeneous cluster): plain counts
            return _roll_one_model(
                now, only[0], free_by_model, capacity_by_model, events, waiting, default_runtime_s
            )
    free = dict(free_by_model)
    heap: list[tuple[float, int, Mapping[str, int]]] = [(end, n, pm) for n, (end, pm) in enumerate(events)]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    seq = len(heap)
    t = now
    out: dict[str, float | None] = {}
    capacity: dict[tuple[str, ...], int] = {}
    for job_id, need, models, runtime in waiting:
        cap = capacity.get(models)
        if cap is None:
            cap = capacity[models] = sum(capacity_by_model.get(m, 0) for m in models)
        if need <= 0 or not models or need > cap:
            out[job_id] = now if need <= 0 else None
            continue
        taken: dict[str, int]
        if len(models) == 1:  # the common case: one pool, no sums
            model = models[0]
            avail = free.get(model, 0)
            while avail < need and heap:
                end, _, pm = pop(heap)
                if end > t:
                    t = end
                for m, n in pm.items():
                    free[m] = free.get(m, 0) + n
                avail = free.get(model, 0)
            if avail < need:
                out[job_id] = None
                continue
            free[model] = avail - need
            taken = {model: need}
        else:
            avail = sum(free.get(m, 0) for m in models)
            while avail < need and heap:
                end, _, pm = pop(heap)
                t = max(t, end)
                for m, n in pm.items():
                    free[m] = free.get(m, 0) + n
                    if m in models:
                        avail += n
            if avail < need:
                out[job_id] = None
                continue
            taken = {}
            left = need
            for m in models:
                k = min(left, free.get(m, 0))
                if k:
                    free[m] -= k
                    taken[m] = k
                    left -= k
        out[job_id] = t
        push(heap, (t + (default_runtime_s if runtime is None else runtime), seq, taken))
        seq += 1
    return out


def _not_now(
    found: dict[str, float | None], now: float, events: Sequence[Event], waiting: Sequence[Waiting]
) -> dict[str, float | None]:
    """A waiting GPU job did not start this cycle, although the pooled roll-forward (which ignores
    quota and how free GPUs are spread over nodes) says it could start now: its estimate becomes
    the next time GPUs of one of its models come back (unchanged when none are due). `events`
    sorted by time; the caller sorts them only when some estimate is `now`."""
    late = [(job_id, models) for job_id, need, models, _ in waiting if need > 0 and found.get(job_id) == now]
    wanted = {m for _, models in late for m in models}
    first: dict[str, float] = {}
    for end, per_model in events:  # in time order: the first end after now of each wanted model
        if end > now:
            for m, n in per_model.items():
                if n > 0 and m in wanted and m not in first:
                    first[m] = end
            if len(first) == len(wanted):
                break
    later_of: dict[tuple[str, ...], float | None] = {}  # per model set: few sets, many jobs
    for job_id, models in late:
        if models in later_of:
            later = later_of[models]
        else:
            later = later_of[models] = min((first[m] for m in models if m in first), default=None)
        if later is not None:
            found[job_id] = later
    return found


def _roll_one_model(
    now: float,
    model: str,
    free_by_model: Mapping[str, int],
    capacity_by_model: Mapping[str, int],
    events: Sequence[Event],
    waiting: Sequence[Waiting],
    default_s: float,
) -> dict[str, float | None]:
    """estimate_starts when every waiting GPU job uses the same single model: the same walk with
    that model's free GPUs as a plain count (other models cannot change any estimate)."""
    free = free_by_model.get(model, 0)
    cap = capacity_by_model.get(model, 0)
    heap = [(end, n, pm.get(model, 0)) for n, (end, pm) in enumerate(events)]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    seq = len(heap)
    t = now
    out: dict[str, float | None] = {}
    for job_id, need, models, runtime in waiting:
        if need <= 0 or not models or need > cap:
            out[job_id] = now if need <= 0 else None
            continue
        while free < need and heap:
            end, _, back = pop(heap)
            if end > t:
                t = end
            free += back
        if free < need:
            out[job_id] = None
            continue
        free -= need
        out[job_id] = t
        push(heap, (t + (default_s if runtime is None else runtime), seq, need))
        seq += 1
    return out


class DiagnosisView:
    """What the diagnoses of one cycle share (queue positions, estimated starts, capacity
    reasons), built from the cycle's final state (a `core.Cycle`, read only) on the first
    diagnosis read. The plan's LazyDiagnoses hold it; the cycle never points back to it, so the
    cycle is freed by reference counting as soon as the plan is."""

    def __init__(self, cycle: Cycle) -> None:
        self.cycle = cycle
        self.etas: dict[str, float | None] | None = None
        self.events: dict[float, list[Event]] = {}  # the backfill roll's GPU returns, per quantile
        self.floors: dict[float, CpuMemoryFloors] = {}  # CPU/memory floors of estimates, per quantile
        self.ranges: tuple[dict[str, float | None], dict[str, float | None]] | None = None
        self.order: list[Job] | None = None  # the roll-forward order, extended as far as asked
        self.order_ids: set[str] = set()
        self.order_done = False  # the queue is used up, or eta_limit reached
        self.built = False
        self.positions: dict[str, tuple[Job, int]] | None = None  # for one(): id -> (job, position)
        self.start_queue: FairShareQueue | None = None  # the expected start order (fair share)

    def all(self) -> dict[str, Diagnosis]:
        """Every waiting job's Diagnosis."""
        self._build()
        out: dict[str, Diagnosis] = {}
        for job, pos in self._positions():
            out[job.id] = self.diagnose(job, pos)
        return out

    def one(self, job_id: str) -> Diagnosis | None:
        """One waiting job's Diagnosis (None: not waiting), equal to its entry in `all()`."""
        self._build()
        if self.positions is None:
            self.positions = {job.id: (job, pos) for job, pos in self._positions()}
        hit = self.positions.get(job_id)
        return None if hit is None else self.diagnose(*hit)

    def estimated_start(self, job_id: str) -> float | None:
        """One job's estimated start, equal to its Diagnosis's (None also when not waiting)."""
        if job_id in self.cycle.assigned_ids:
            return None
        return self._etas().get(job_id)

    def _positions(self) -> Iterator[tuple[Job, int]]:
        """Waiting jobs not assigned, each with its 1-based position in the order they are expected
        to start in (`_eta_order`, then the rest of that queue): the order the estimates roll in."""
        assigned = self.cycle.assigned_ids
        order = self._eta_order(None)
        seen = set(self.order_ids)
        rest: list[Job] = []
        start_queue = self.start_queue
        queue = start_queue if start_queue is not None else self.cycle.queue
        while (job := queue.pop()) is not None:  # past eta_limit: positions only, no estimate
            if start_queue is not None:
                start_queue.charge(job)
            if job.id not in seen:
                seen.add(job.id)
                rest.append(job)
        # jobs no pass and no pop reached (parked by a cut-short pass): last, in group order
        rest.extend(j for j in self.cycle.waiting if j.id not in seen)
        pos = 0
        for job in (*order, *rest):
            if job.id in assigned:
                continue
            pos += 1
            yield job, pos

    def _etas(self) -> dict[str, float | None]:
        """Estimated starts of the waiting jobs (computed once)."""
        if self.etas is None:
            self.etas = self._roll(self._eta_order(None), None)
        return self.etas

    def estimated_starts(self, job_ids: Collection[str]) -> dict[str, float | None]:
        """Estimated starts of `job_ids` (each equal to its Diagnosis's), the queue popped and the
        plan rolled forward only as far as the last of them."""
        if self.etas is not None:
            return {j: self.etas.get(j) for j in job_ids}
        assigned = self.cycle.assigned_ids
        wanted = {j for j in job_ids if j not in assigned}
        found = self._roll(self._eta_order(wanted, keep=True), wanted, keep=True) if wanted else {}
        return {j: found.get(j) for j in job_ids}

    def _roll(
        self, order: list[Job], targets: set[str] | None, q: float = 0.5, keep: bool = False
    ) -> dict[str, float | None]:
        """Estimated starts of `order` (as far as `targets`), every runtime at its quantile `q`;
        a job held by its quota or user cap keeps its place in the roll but gets no time. `keep`
        (a targeted roll): continue the roll kept from an earlier cycle where it holds, and keep
        this one (eta_kept.py)."""
        found = self._roll_all(order, targets, q, keep)
        jobs = order[: self.cycle.profile.eta_limit]
        if targets is not None:
            # A targeted roll's caller reads only the targets' starts; every job ahead of them was
            # placed for its effect on the timelines alone, which its floor and hold do not change
            # (each adjusts only its own entry): the floors and holds of the targets alone (the
            # roll places ~200 jobs to answer for one new job)
            jobs = [j for j in jobs if j.id in targets]
            found = {j: found[j] for j in targets if j in found}
        raise_to_floors(found, jobs, self._floors(q))
        why = self.cycle.verdicts.why
        for job_id in found:
            reason = why.get(job_id)
            if reason is not None and reason.code in HELD_CODES:
                found[job_id] = None
        return found

    def _roll_all(
        self, order: list[Job], targets: set[str] | None, q: float, keep: bool = False
    ) -> dict[str, float | None]:
        cycle = self.cycle
        unschedulable = cycle.verdicts.unschedulable
        if unschedulable:
            order = [j for j in order if j.id not in unschedulable]
        st, info_of, profile = cycle.st, cycle.infos, cycle.profile
        memo = info_of.memo  # JobInfos.__call__'s own look-up, inlined: this runs for every job
        waiting = []
        order = order[: profile.eta_limit]
        for job in order:
            hit = memo.get(id(job))
            eta = hit[1].eta if hit is not None and hit[0] is job else info_of(job).eta
            if q != 0.5 and job.runtime_spread is not None:  # the early or late end of the range
                eta = (*eta[:3], job.runtime_spread[0 if q < 0.5 else 1])
            waiting.append(eta)
        if profile.eta_roll == "pooled":  # the earlier estimate, kept as a baseline
            events = cycle.backfill.events()
            found = estimate_starts(
                cycle.now, st.free_total, st.capacity, events, waiting, profile.default_runtime_s, targets
            )
            if cycle.now not in found.values():
                return found
            return _not_now(found, cycle.now, cycle.backfill.sorted_events(), waiting)
        waiting = list(through_last(waiting, targets))
        if keep and q == 0.5 and profile.eta_reuse_s > 0:
            return self._continued(order[: len(waiting)], waiting)
        events = self._events(q)
        found = backfill_starts(
            cycle.now,
            st.free_total,
            st.capacity,
            events,
            waiting,
            profile.default_runtime_s,
            profile.head_of_line_blocking,
        )
        if cycle.now not in found.values():
            return found
        return _not_now(found, cycle.now, sorted(events, key=itemgetter(0)), waiting)

    def _continued(self, jobs: list[Job], waiting: list[Waiting]) -> dict[str, float | None]:
        """`_roll_all`'s backfill roll through `jobs` (their etas `waiting`), continuing the roll
        the Scheduler kept from an earlier cycle where it holds (eta_kept.py): the starts of the
        jobs placed past the kept ones."""
        now = self.cycle.now
        found, placed, roll, since = self.cycle.kept_rolls.place(
            self.cycle, jobs, waiting, self._median_events
        )
        events = roll.events
        if since > 0.0:  # continued: the kept roll seen `since` s later (eta_kept.py)
            for job_id, at in found.items():
                if at is not None:
                    found[job_id] = at + since
            if now in found.values():
                events = [(end + since, per_model) for end, per_model in events]
        if now not in found.values():
            return found
        return _not_now(found, now, events, placed)

    def _floors(self, q: float) -> CpuMemoryFloors:
        """When nodes have the CPUs and memory for a job free (eta_cpu.py), from the same ends as
        the GPU returns: running jobs', then those of the jobs started this cycle."""
        found = self.floors.get(q)
        if found is None:
            cycle, cache = self.cycle, self.events

            def ends() -> list[tuple[float, Allocation]]:  # (not through self: the view holds it)
                allocations = [rj.allocation for rj, _ in cycle.backfill.running]
                allocations += [a.allocation for a in cycle.assignments]
                # running_events: one per running job, then one per job started this cycle
                events = _cycle_events(cycle, cache, q)
                return [(end, a) for (end, _), a in zip(events, allocations, strict=True)]

            found = self.floors[q] = CpuMemoryFloors(
                cycle.st, cycle.profile.cpu_jobs_on_gpu_nodes, cycle.now, ends
            )
        return found

    def _median_events(self) -> list[Event]:
        return self._events(0.5)

    def _events(self, q: float) -> list[Event]:
        """When running GPUs come back, for the backfill roll (computed once per cycle and q)."""
        return _cycle_events(self.cycle, self.events, q)

    def _eta_order(self, targets: set[str] | None, keep: bool = False) -> list[Job]:
        """Waiting jobs in the order they are expected to start, up to eta_limit: all of them, or
        (`targets`) at least as far as every target; later calls extend what earlier ones popped.
        Fair share: `_start_queue`, each job charged to its group and user as it is taken, as the
        cycle that starts it will charge it. Other orders (fixed by submit time, estimate or
        attained service): the order the cycle considered them, then the rest of its queue.
        `keep` (a targeted read with `eta_reuse_s` on, fair share, the first call of the cycle):
        the last such read's order taken without popping where it provably comes first, and this
        read's pops kept for the next (eta_kept.KeptOrder; the same order either way)."""
        cycle = self.cycle
        order, seen = self.order, self.order_ids
        recorder = None
        if order is None:
            order = self.order = []
            self.start_queue = self._start_queue()
            if self.start_queue is None:  # not fair share: the cycle's own order, then its queue
                assigned = cycle.assigned_ids
                for job in cycle.visited:
                    if job.id not in assigned and job.id not in seen:
                        seen.add(job.id)
                        order.append(job)
            elif keep and cycle.profile.eta_reuse_s > 0:
                recorder = OrderRecorder(self.start_queue, cycle.verdicts.unschedulable)
                recorder.skip(cycle.kept_rolls.order, order, seen, cycle.profile.eta_limit)
                cycle.kept_rolls.skipped += recorder.skipped
        missing = None if targets is None else len(targets - seen)
        limit = cycle.profile.eta_limit
        start_queue = self.start_queue
        queue = start_queue if start_queue is not None else cycle.queue
        never = cycle.verdicts.unschedulable
        pop = queue.pop
        charge = start_queue.charge if start_queue is not None else None
        while not self.order_done and (missing is None or missing > 0):
            if len(order) >= limit:
                self.order_done = True
                break
            rest = pop()
            if rest is None:
                self.order_done = True
                break
            rest_id = rest.id
            if recorder is not None:
                recorder.popped(rest)
            if charge is not None and rest_id not in never:
                charge(rest)  # as the cycle that starts it will: its group's turn passes
            if rest_id not in seen:
                seen.add(rest_id)
                order.append(rest)
                if missing is not None and rest_id in targets:  # type: ignore[operator]
                    missing -= 1
        if recorder is not None:  # (not where eta_limit cut the order: that is no pop sequence)
            cycle.kept_rolls.order = None if len(order) >= limit else recorder.record(order)
        return order

    def _start_queue(self) -> FairShareQueue | None:
        """A fair-share queue over the jobs still waiting, from the shares the cycle ended with:
        popped with each job charged as it would be when it starts, it gives the order jobs are
        expected to start in (the cycle's own queue charges only the jobs it placed, so a group
        whose jobs did not fit keeps every turn)."""
        cycle = self.cycle
        q = cycle.queue
        if not isinstance(q, FairShareQueue):
            return None
        by_user, cpu_ids = self._still_waiting_by_user()
        usage = {g: share * max(q.weights.get(g, 1.0), 1e-9) for g, share in q.group_share.items()}
        return FairShareQueue(by_user, cpu_ids, q.weights, usage, q.user_share, q.horizon)

    def _still_waiting_by_user(self) -> tuple[dict[str, dict[str, list[Job]]], set[str]]:
        """The jobs left waiting per group and user (in-group order), and the CPU-only ones' ids:
        from the cycle's queue index while it is as the cycle left it (only the users whose jobs
        started are filtered), else split afresh from the cycle's waiting jobs."""
        cycle = self.cycle
        assigned = cycle.assigned_ids
        at = cycle.index_at
        if at is not None and at[0].version == at[1]:
            index = at[0]
            by_user = index.per_user()  # read only here; the version check above says they are the cycle's
            for g, u in cycle.assigned_users:
                users = by_user[g]
                left = [j for j in users[u] if j.id not in assigned]
                if left:
                    users[u] = left
                else:
                    del users[u]
                    if not users:
                        del by_user[g]
            return by_user, index.cpu_ids - assigned
        by_group: dict[str, list[Job]] = {}
        for j in cycle.waiting:  # sorted by group, then the in-group order
            if j.id not in assigned:
                by_group.setdefault(j.group, []).append(j)
        return split_by_user(by_group)

    def _build(self) -> None:
        if self.built:
            return
        self.built = True
        cycle = self.cycle
        self._etas()
        self.caps = CapacityReasons(cycle.st, cycle.profile)
        self.visited = {j.id for j in cycle.visited} if cycle.cut_short else set()
        blocker = cycle.blocker
        self.blocked = None
        if blocker is not None:
            self.blocked = Reason(
                "blocked_by_head",
                "admission:fifo",
                f"strict FIFO: waits behind job {blocker.id}, which does not fit yet",
            )
        self.depth_reason = Reason(
            "backfill_depth",
            "admission:backfill",
            f"not tried this cycle: at most {cycle.profile.backfill_depth} jobs are tried "
            "behind a reserved job",
        )

    def diagnose(self, job: Job, pos: int) -> Diagnosis:
        """The job's Diagnosis: the reason a stage of the cycle recorded for it, else why the free
        capacity left does not hold it (after strict FIFO's or the backfill depth's reason)."""
        cycle = self.cycle
        verdicts = cycle.verdicts
        never = verdicts.unschedulable.get(job.id)
        if never is not None:
            return Diagnosis(job.id, never, pos, None, True)
        reasons: tuple[Reason, ...]
        why = verdicts.why.get(job.id)
        info = cycle.infos.known(job)  # a job no pass reached needs no JobInfo made for this
        sig = info.sig if info is not None else shape_key(job)
        if why is not None:
            if why.code in HELD_CODES:  # no time: it starts when its quota or cap allows, not
                # when GPUs free up, and nothing here can tell when that is
                return Diagnosis(job.id, (self.held_reason(job, why, info),), pos, None)
            reasons = (why,)
        elif self.blocked is not None and job is not cycle.blocker:
            reasons = (self.blocked, *self.caps.reasons(job, sig))
        elif cycle.cut_short and job.id not in self.visited:
            reasons = (self.depth_reason, *self.caps.reasons(job, sig))
        else:
            reasons = self.caps.reasons(job, sig)
        return Diagnosis(job.id, reasons, pos, self._etas().get(job.id), start_range=self._range(job.id))

    def held_reason(self, job: Job, why: Reason, info: JobInfo | None) -> Reason:
        """The quota stage's reason said with the numbers: what the group or user may hold, what
        it holds, what the job needs."""
        if why.source == STORAGE_SOURCE:  # it names the storage held and the quota already
            return why
        ledger = self.cycle.ledger
        group = ledger.group(job.group)
        need = job.total_gpus
        if why.code == "user_cap":
            cap = group.user_max_gpus  # set: the cap is why it waits
            held = ledger.user_used.get((group.name, job.user), 0)
            may = plural(cap or 0, "GPU")
            return Reason(
                why.code,
                why.source,
                f"waits for the per-user cap: {job.user} may hold {may} in group {group.name} "
                f"and holds {held}; this job needs {need}. It starts when {job.user}'s running jobs "
                "free enough of them",
            )
        borrow = why.code == "quota_max"
        models = info.models if info is not None else ()
        keys = {ledger.key(group, m) for m in models} or {"*"}
        free = max(ledger.limit(group, k, borrow) - ledger.used.get((group.name, k), 0) for k in keys)
        which = "maximum" if borrow else "guaranteed"
        left = "no limit" if math.isinf(free) else f"{max(0, int(free))} free"
        because = "" if borrow else f" ({why.message.rsplit(' and ', 1)[-1]})"
        return Reason(
            why.code,
            why.source,
            f"waits for group {group.name}'s {which} quota: needs {plural(need, 'GPU')}, {left} in its quota"
            f"{because}. It starts when the group's running jobs free enough of it",
        )

    def _range(self, job_id: str) -> tuple[float, float] | None:
        """(early, late) estimated start with every runtime at the 25th and 75th percentile of its
        history (the backfill roll only, the first RANGE_LIMIT jobs in the order; None without an
        estimate)."""
        if self.cycle.profile.eta_roll != "backfill" or self._etas().get(job_id) is None:
            return None
        if self.ranges is None:
            order = self._eta_order(None)[:RANGE_LIMIT]
            self.ranges = (self._roll(order, None, 0.25), self._roll(order, None, 0.75))
        early, late = self.ranges[0].get(job_id), self.ranges[1].get(job_id)
        if early is None or late is None:
            return None
        mid = self._etas()[job_id]
        assert mid is not None
        return min(early, mid), max(late, mid)


def _cycle_events(cycle: Cycle, cache: dict[float, list[Event]], q: float) -> list[Event]:
    """When running GPUs come back, for the backfill roll (computed once per cycle and q, kept in
    `cache`)."""
    found = cache.get(q)
    if found is None:
        backfill, profile, now = cycle.backfill, cycle.profile, cycle.now
        gone_by = dict(backfill.victims)
        for rj, _ in backfill.running:
            if rj.stopping:
                gone_by[rj.job.id] = now + grace_of(rj.job, profile) if rj.stops_by is None else rj.stops_by
        found = cache[q] = running_events(
            now, backfill.running, backfill.started, gone_by, profile.default_runtime_s, q
        )
    return found
