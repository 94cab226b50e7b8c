"""Admission: whether quota lets waiting jobs in, and the per-job measures the queue orders by
(size class, LAS queue, attained service; the orders themselves are queues.py's).

Quota (QuotaLedger): per group and quota key (a GPU model listed in the group's quotas, else
ANY_MODEL), usage within `guaranteed` is owned; beyond it up to `max` is borrowed (only for
preemptible jobs of groups with borrowing on) and the lender may reclaim it. CPUs and memory
(ResourceQuota): a group-wide hard limit, nothing borrowed or reclaimed. `quota_refusals` says
why a job alone can never be admitted under its group's quotas (the API refuses it at submit).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from corral.scheduler.cluster import RunningTotals
from corral.scheduler.quota_memo import KeptAllowed
from corral.scheduler.types import ANY_MODEL, Group, Job, Reason, RunningJob
from corral.words import plural


def decay_usage(value: float, elapsed_s: float, half_life_s: float) -> float:
    """Usage `elapsed_s` later, halving every `half_life_s` (no decay when half_life_s <= 0)."""
    if half_life_s <= 0 or elapsed_s <= 0:
        return value
    return value * 0.5 ** (elapsed_s / half_life_s)


def runtime_of(job: Job, default_s: float) -> float:
    return job.runtime_estimate if job.runtime_estimate is not None else default_s


SIZE_UNIT_S = 60.0  # GPU-seconds of the smallest size class


def size_class(job: Job, default_runtime_s: float) -> int:
    """Discretised estimated size: the bit length of the job's estimated GPU-time in whole
    GPU-minutes (floor(log2) + 1; 0 under a minute), from its runtime estimate (or
    `default_runtime_s` when unknown) times its GPUs (CPU-only work counts as one GPU). Jobs in
    one class are served by the other keys (user share, age); only the estimate a real platform
    has (the user's limit, the user's history) is read."""
    estimate = job.runtime_estimate
    gpu_s = (default_runtime_s if estimate is None else estimate) * max(job.total_gpus, 1)
    return int(gpu_s // SIZE_UNIT_S).bit_length()


def cpu_only(job: Job) -> bool:
    """No task asks for GPUs (fast path for the common single-task job)."""
    tasks = job.tasks
    if len(tasks) == 1:
        return tasks[0].resources.gpus <= 0
    return all(t.resources.gpus <= 0 for t in tasks)


def las_queue(attained: float, thresholds: tuple[float, ...]) -> int:
    """Index of the LAS queue for this much attained service (0 = highest priority)."""
    q = 0
    for t in thresholds:
        if attained >= t:
            q += 1
    return q


def attained_now(rj: RunningJob, now: float, gpus: int | None = None) -> float:
    """Service before this run (Job.attained_gpu_seconds) plus this run so far."""
    gpus = rj.job.total_gpus if gpus is None else gpus
    return rj.job.attained_gpu_seconds + max(0.0, now - rj.start_time) * gpus


class QuotaLedger:
    """GPUs in use per (group, quota key) and per (group, user), with the limits that apply."""

    def __init__(self, groups: Iterable[Group], kept: KeptAllowed | None = None) -> None:
        self.groups: dict[str, Group] = {g.name: g for g in groups}
        self._kept = kept  # the Scheduler's answers from earlier cycles (quota_memo.py), if any
        self.used: dict[tuple[str, str], int] = {}
        self.user_used: dict[tuple[str, str], int] = {}
        self._keys: dict[tuple[str, str], tuple[str, str]] = {}  # (group, model) -> (group, quota key)
        # allowed_models per group: (models, need, borrow) -> models; a group's entry is dropped
        # when a charge changes what it uses (a preemption search charges and uncharges victims of
        # other groups many times a cycle: they leave this group's answers as they were)
        self._memo: dict[str, dict[tuple[tuple[str, ...], int, bool], frozenset[str]]] = {}
        self._headroom: dict[str, bool] = {}  # group -> headroom(group); dropped on its charge
        # (group, model) -> ((group, quota key), limit without borrowing, limit when borrowing)
        self._limits: dict[tuple[str, str], tuple[tuple[str, str], float, float]] = {}

    def group(self, name: str) -> Group:
        g = self.groups.get(name)
        if g is None:  # a group nobody configured: no guarantee, may borrow
            g = self.groups[name] = Group(name=name)
        return g

    @staticmethod
    def key(group: Group, model: str) -> str:
        if model in group.guaranteed or (group.max is not None and model in group.max):
            return model
        return ANY_MODEL

    @staticmethod
    def guaranteed(group: Group, key: str) -> int:
        return group.guaranteed.get(key, 0)

    @staticmethod
    def limit(group: Group, key: str, borrow: bool) -> float:
        """Most GPUs the group may hold under `key`: its guarantee, or its max when borrowing."""
        floor = group.guaranteed.get(key, 0)
        if not borrow:
            return floor
        if group.max is None:
            return math.inf
        cap = group.max.get(key, group.max.get(ANY_MODEL, math.inf))
        return max(cap, floor)

    def may_borrow(self, job: Job) -> bool:
        if not job.preemptible:
            return False
        g = self.groups.get(job.group)
        return (g if g is not None else self.group(job.group)).borrowing

    def charge(self, job: Job, gpus_by_model: Mapping[str, int], sign: int = 1) -> None:
        name = job.group
        self._memo.pop(name, None)  # what this group may use changed; other groups' did not
        self._headroom.pop(name, None)
        total = 0
        for m, n in gpus_by_model.items():
            k = self._keys.get((name, m))
            if k is None:
                k = self._keys[(name, m)] = (name, self.key(self.group(name), m))
            self.used[k] = self.used.get(k, 0) + sign * n
            total += n
        uk = (name, job.user)
        self.user_used[uk] = self.user_used.get(uk, 0) + sign * total

    def charge_running(self, totals: RunningTotals) -> None:
        """Charge what running work holds (GPUs per (group, model) and per (group, user))."""
        for (name, m), n in totals.by_group_model.items():
            k = (name, self.key(self.group(name), m))
            self.used[k] = self.used.get(k, 0) + n
        for uk, n in totals.by_user.items():
            self.user_used[uk] = self.user_used.get(uk, 0) + n
        self._memo.clear()
        self._headroom.clear()

    def unmarked_excess(self, totals: RunningTotals) -> dict[tuple[str, str], int]:
        """(group, quota key) -> GPUs that running work (charged by `charge_running`) holds beyond
        the group's guarantee and that no job marked borrowed accounts for. Empty while guarantees
        stand: placement marks borrowed whatever goes beyond the guarantee, and the excess only
        shrinks as work ends. Not after a guarantee was cut: the work it no longer covers was
        placed as owned."""
        marked: dict[tuple[str, str], int] = {}
        for (name, m), n in totals.borrowed.items():
            k = (name, self.key(self.group(name), m))
            marked[k] = marked.get(k, 0) + n
        out = {}
        for (name, key), used in self.used.items():
            excess = used - self.guaranteed(self.group(name), key) - marked.get((name, key), 0)
            if excess > 0:
                out[(name, key)] = excess
        return out

    def mark_borrowed(
        self, running: list[tuple[RunningJob, dict[str, int]]], totals: RunningTotals
    ) -> list[tuple[RunningJob, dict[str, int]]]:
        """`running` with the work its groups' guarantees no longer cover marked borrowed (so that a
        group below its guarantee may reclaim it, as it may any borrowed work): per group and quota
        key, the youngest jobs not marked yet, until they hold the `unmarked_excess`. `totals` (the
        cycle's copy) follows. Nothing changes while guarantees stand (no excess is unmarked)."""
        excess = self.unmarked_excess(totals)
        if not excess:
            return running
        out = list(running)
        youngest_first = sorted(range(len(out)), key=lambda i: (-out[i][0].start_time, out[i][0].job.id))
        for i in youngest_first:
            rj, per_model = out[i]
            if rj.borrowed:
                continue
            group = self.group(rj.job.group)
            keys = {(group.name, self.key(group, m)) for m in per_model}
            if not any(excess.get(k, 0) > 0 for k in keys):
                continue
            for m, n in per_model.items():
                k = (group.name, self.key(group, m))
                excess[k] = excess.get(k, 0) - n
            marked = dataclasses.replace(rj, borrowed=True)
            totals.add(rj, per_model, -1)
            totals.add(marked, per_model, 1)
            out[i] = (marked, per_model)
            if all(n <= 0 for n in excess.values()):
                break
        return out

    def allowed_models(
        self, job: Job, models: tuple[str, ...], borrow: bool, need: int | None = None
    ) -> frozenset[str]:
        """Models on which the whole job (`need` GPUs) would stay within the group's limit."""
        need = job.total_gpus if need is None else need
        memo = self._memo.get(job.group)
        if memo is None:
            kept = self._kept
            fresh = {} if kept is None else kept.answers(self.group(job.group), self.used)
            memo = self._memo[job.group] = fresh
        memo_key = (models, need, borrow)
        hit = memo.get(memo_key)
        if hit is None:
            hit = memo[memo_key] = self._allowed(job.group, models, need, borrow)
        return hit

    def _allowed(self, name: str, models: tuple[str, ...], need: int, borrow: bool) -> frozenset[str]:
        used, limits = self.used, self._limits
        out = []
        for m in models:
            found = limits.get((name, m))
            if found is None:
                g = self.group(name)
                k = self.key(g, m)
                found = limits[(name, m)] = ((name, k), self.limit(g, k, False), self.limit(g, k, True))
            used_key, floor, cap = found
            if used.get(used_key, 0) + need <= (cap if borrow else floor):
                out.append(m)
        return frozenset(out)

    def fits(self, job: Job, gpus_by_model: Mapping[str, int], borrow: bool) -> tuple[bool, bool]:
        """(within limits, borrowed) for a concrete placement."""
        g = self.group(job.group)
        per_key: dict[str, int] = {}
        for m, n in gpus_by_model.items():
            key = self.key(g, m)
            per_key[key] = per_key.get(key, 0) + n
        borrowed = False
        for key, n in per_key.items():
            after = self.used.get((g.name, key), 0) + n
            if after > self.limit(g, key, borrow):
                return False, False
            if after > self.guaranteed(g, key):
                borrowed = True
        return True, borrowed

    def headroom(self, name: str) -> bool:
        """Whether the group holds less than its guarantee under some quota key."""
        found = self._headroom.get(name)
        if found is None:
            g = self.group(name)
            used = self.used
            found = self._headroom[name] = any(
                used.get((name, key), 0) < n for key, n in g.guaranteed.items() if n > 0
            )
        return found

    def user_fits(self, job: Job) -> bool:
        cap = self.group(job.group).user_max_gpus
        if cap is None:
            return True
        return self.user_used.get((job.group, job.user), 0) + job.total_gpus <= cap

    def below_guarantee(self, job: Job, models: tuple[str, ...]) -> bool:
        """Could this job run entirely within its group's guarantee on one of `models`?"""
        return bool(self.allowed_models(job, models, borrow=False))


def _gpu_limit_text(group: Group, models: Iterable[str], borrow: bool) -> str:
    """ "2 A100, 0 V100" (one entry per quota key the models fall under)."""
    per_key: dict[str, list[str]] = {}
    for m in models:
        per_key.setdefault(QuotaLedger.key(group, m), []).append(m)
    parts = []
    for key, named in sorted(per_key.items()):
        label = key
        if key == ANY_MODEL:  # named: the models it stands for here ("*" itself: any model)
            few = len(named) < 4 and ANY_MODEL not in named
            label = "|".join(sorted(named)) if few else ""
        limit = QuotaLedger.limit(group, key, borrow)
        parts.append(f"{limit:g} {label}" if label else f"{plural(limit, 'GPU')} of any model")
    return ", ".join(parts)


def quota_refusals(job: Job, group: Group, models: Iterable[str]) -> tuple[Reason, ...]:
    """Why `job` alone can never be admitted under `group`'s quotas as they stand (empty: it can),
    with the numbers. `models` are the GPU models its GPU tasks may use (the cycle passes the
    cluster's). The same rules make the cycle mark such a job unschedulable: the per-user cap, the
    GPU limit (`max` for jobs that may borrow, else the guarantee) on every model it may use, and
    the CPU and memory limits."""
    out: list[Reason] = []
    need = job.total_gpus
    cap = group.user_max_gpus
    if cap is not None and need > cap:
        text = (
            f"it needs {plural(need, 'GPU')}; group {group.name} caps each user at "
            f"{plural(cap, 'GPU')} (user_max_gpus)"
        )
        out.append(Reason("user_cap", "quota:user", text))
    models = tuple(models)
    borrow = job.preemptible and group.borrowing
    limits = [QuotaLedger.limit(group, QuotaLedger.key(group, m), borrow) for m in models]
    if need > 0 and limits and all(need > limit for limit in limits):
        held = _gpu_limit_text(group, models, borrow)
        if borrow:
            why = f"group {group.name} may hold at most {held} (its max)"
        else:
            cause = "the job is not preemptible" if group.borrowing else "borrowing is off for the group"
            why = (
                f"group {group.name} guarantees {held} and {cause}, so it may not borrow beyond the guarantee"
            )
        code = "quota_max" if borrow else "quota_exhausted"
        out.append(Reason(code, "quota", f"it needs {plural(need, 'GPU')}; {why}"))
    out.extend(ResourceQuota.over_limit(job, group))
    return tuple(out)


SOURCE = "quota:cpu_memory"  # the source of the reasons ResourceQuota gives
STORAGE_SOURCE = "quota:storage"


def storage_refusal(group: Group) -> Reason | None:
    """Why a job of `group` waits for storage: its group holds more than its storage quota (bytes
    or files). It waits (never refused outright): freeing space lets it go on."""
    if group.storage_over is None:
        return None
    return Reason(
        "storage_quota", STORAGE_SOURCE, f"its group is over its storage quota: {group.storage_over}"
    )


class ResourceQuota:
    """CPUs and memory held per group (running work, then what the cycle places), against the
    groups' hard limits (`Group.cpus_max`, `Group.memory_max_mib`). Costs nothing when no group
    has such a limit (the simulator's clusters have none)."""

    def __init__(self, groups: Iterable[Group], running: Iterable[RunningJob]) -> None:
        self.groups = {g.name: g for g in groups if g.cpus_max is not None or g.memory_max_mib is not None}
        self.cpus: dict[str, float] = {}
        self.memory_mib: dict[str, int] = {}
        if self.groups:
            for rj in running:
                self.charge(rj.job)

    def charge(self, job: Job) -> None:
        if job.group in self.groups:
            self.cpus[job.group] = self.cpus.get(job.group, 0.0) + job.total_cpus
            self.memory_mib[job.group] = self.memory_mib.get(job.group, 0) + job.total_memory_mib

    def refusal(self, job: Job) -> tuple[Reason, bool] | None:
        """(why it waits, whether it can never fit the limit) when placing the job now would take
        its group over a limit; None when it may go on."""
        group = self.groups.get(job.group) if self.groups else None
        if group is None:
            return None
        never = ResourceQuota.over_limit(job, group)
        if never:
            return never[0], True
        cpus, memory = self.cpus.get(group.name, 0.0), self.memory_mib.get(group.name, 0)
        if group.cpus_max is not None and cpus + job.total_cpus > group.cpus_max:
            text = f"group {group.name} may hold {plural(group.cpus_max, 'CPU')}; it holds {cpus:g}"
            return Reason("cpu_quota", SOURCE, f"{text}; this job needs {job.total_cpus:g}"), False
        if group.memory_max_mib is not None and memory + job.total_memory_mib > group.memory_max_mib:
            text = f"group {group.name} may hold {group.memory_max_mib} MiB of memory; it holds {memory} MiB"
            return Reason("memory_quota", SOURCE, f"{text}; this job needs {job.total_memory_mib} MiB"), False
        return None

    @staticmethod
    def over_limit(job: Job, group: Group) -> list[Reason]:
        """The CPU and memory limits the job alone exceeds."""
        out = []
        if group.cpus_max is not None and job.total_cpus > group.cpus_max:
            text = f"group {group.name} may hold at most {plural(group.cpus_max, 'CPU')} (its max)"
            out.append(Reason("cpu_quota", SOURCE, f"it needs {plural(job.total_cpus, 'CPU')}; {text}"))
        if group.memory_max_mib is not None and job.total_memory_mib > group.memory_max_mib:
            text = f"group {group.name} may hold at most {group.memory_max_mib} MiB (its max)"
            out.append(
                Reason("memory_quota", SOURCE, f"it needs {job.total_memory_mib} MiB of memory; {text}")
            )
        return out
