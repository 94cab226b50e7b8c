"""Discrete-event replay of a trace through Corral's scheduler library.

Events (arrivals, completions, preemption stops, node failures and repairs) are processed in time
order. After all events of one instant are applied, and only if something changed, the simulator
builds the `Snapshot` the live control loop would build and asks its `Scheduler` (the same library
object the live loop keeps) for a plan, which it carries out through the same `apply_plan` as the
live loop: assignments start jobs, preemptions stop jobs after the victim's stop grace. A stopped
job keeps the work up to its last checkpoint and goes back to the queue.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from array import array
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Protocol

from corral.scheduler import apply_plan, check_fits_anywhere
from corral.scheduler.admission import quota_refusals
from corral.scheduler.apply import estimated_starts
from corral.scheduler.eta_calibration import EtaCalibration
from corral.scheduler.runtimes import estimate_from
from corral.scheduler.types import (
    ANY_MODEL,
    Allocation,
    Assignment,
    Diagnosis,
    Group,
    Job,
    Node,
    NodeState,
    Plan,
    Preemption,
    Resources,
    RunningJob,
    Snapshot,
    TaskSpec,
    Usage,
)
from corral.sim.cluster import ClusterSpec
from corral.sim.errors import SimulationError
from corral.sim.estimates import RuntimeHistory
from corral.sim.replay_gc import defer_full_collections, restore_full_collections
from corral.sim.trace import Trace, TraceJob
from corral.words import gpu_noun


class PlanMaker(Protocol):
    """What the simulator asks for plans: a `corral.scheduler.Scheduler` (or a wrapper of one)."""

    def schedule(self, snapshot: Snapshot, now: float, rng: random.Random) -> Plan: ...


class _Ev(IntEnum):  # order matters at equal times: free resources before new demand arrives
    COMPLETE = 0
    STOP = 1
    NODE_FAIL = 2
    NODE_REPAIR = 3
    ARRIVAL = 4
    CYCLE = 5  # a deferred scheduling cycle (cycle_interval_s > 0)


@dataclass(frozen=True, slots=True)
class SimConfig:
    checkpoint_interval_s: float = 1800.0  # 0: no checkpoints, a preempted job restarts from scratch
    # a preempted job saves its work when signalled (within its stop grace), as well as on the
    # periodic checkpoints: it loses nothing
    checkpoint_on_preempt: bool = False
    # True: give the scheduler each job's (remaining) true duration as its estimate (a bound no
    # real scheduler reaches); False: estimates from history and user limits (estimates.py)
    oracle_runtime: bool = False
    # False: no runtime history either (estimates only from user limits): the replay as it was
    # before history estimates, for comparing the ETA error
    runtime_history: bool = True
    # True: runtime estimates as in the previous round (estimates.py, legacy): with the profile's
    # eta_roll="pooled", the ETA baseline of bench/sim_quality.py and bench/sim_replay.py
    legacy_estimates: bool = False
    usage_half_life_s: float = 7 * 86400.0  # decay of historical usage for fair share
    node_mtbf_s: float | None = None  # mean time between failures of one node; None = no failures
    node_repair_s: float = 3600.0
    seed: int = 0
    estimate_starts: bool = True  # read each new job's estimated start (False: skip, ETA metric None)
    # 0: each new job's estimated start is read in its first cycle (what its user sees on
    # submitting: the scored ETA). >0, a speed option: read at most once per this many simulated
    # seconds, for every job that arrived since the last read and has not started; a job's scored
    # ETA is the one shown at the first read after it arrived (up to this much later, so closer to
    # its start), and a job that starts before that read is shown none (docs/simulator.md, Speed)
    eta_interval_s: float = 0.0
    # True: the ETA shown (and scored) is the roll's corrected by the replay's own record of how
    # its past ETAs turned out (scheduler/eta_calibration.py, as the live loop); False: the roll's
    eta_calibration: bool = True
    record_cycles: bool = False  # keep (snapshot, now, plan) of every cycle
    record_events: bool = False  # keep every submit, start, stop and end (SimResult.events)
    cycle_interval_s: float = 0.0  # 0: a cycle at every event time; >0: cycles only on this grid, like
    # the live loop's period (fewer schedule() calls; jobs wait for the next tick)
    frag_samples: int = 2000  # fragmentation is sampled at most this many times over the trace
    # Stop grace of a preempted job whose trace row gives none (None: the profile's grace_s), and
    # the most any job gets (the live platform's CORRAL_MAX_STOP_GRACE_S)
    stop_grace_s: float | None = None
    max_stop_grace_s: float = 300.0


@dataclass(frozen=True, slots=True)
class CycleRecord:
    snapshot: Snapshot
    now: float
    plan: Plan


@dataclass(slots=True)
class SimJob:
    trace: TraceJob
    tasks: tuple[TaskSpec, ...]
    remaining: float
    attained_gpu_s: float = 0.0
    first_start: float = math.nan
    end: float = math.nan
    last_start: float = math.nan
    attempt: int = 0
    eta: float = math.nan  # estimated_start of the first diagnosis that gave one (as shown)
    # the roll's own predicted wait at that diagnosis, before calibration, and when it was read:
    # what the calibration records once the job starts
    eta_predicted_wait_s: float = math.nan
    eta_read_at: float = math.nan
    preemptions: int = 0
    lost_work_s: float = 0.0
    stopping: bool = False
    queued_at: float = math.nan  # when it last joined the queue (arrival or after a stop)
    waited_s: float = 0.0  # every wait in the queue, re-queueing after a stop included


@dataclass
class SimResult:
    trace_name: str
    cluster_name: str
    policy: str
    total_gpus: int
    jobs: list[SimJob]
    rejected: list[tuple[TraceJob, str]]  # jobs that fit no node or no quota, with why
    alloc_t: array[float]  # allocated GPUs over time (step function)
    alloc_gpus: array[float]
    frag_samples: list[tuple[float, int, int]]  # (time, free GPUs, free GPUs no waiting job can use)
    cycles: int
    preemptions: int
    node_failures: int
    wall_s: float
    schedule_s: float  # time spent inside schedule()
    diagnosis_s: float  # time spent computing the (lazy) diagnoses read for ETAs
    records: list[CycleRecord] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    end_time: float = 0.0  # the last event's time: unfinished jobs are censored here
    max_queued: int = 0  # most jobs waiting at once
    # per group with a guarantee: GPU-seconds it was owed (min(guarantee, its demand)) and given
    guarantee_gpu_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    events: list[JobEvent] = field(default_factory=list)  # with SimConfig.record_events


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One line of `--jobs-out`: what happened to a job when, where, and why."""

    time: float
    job_id: str
    event: str  # submit | start | preempt | stop | finish | reject
    nodes: str = ""  # "node-a:0,1;node-b:0,1": where it starts, runs when preempted, stops, ends
    gpus: int = 0
    reason: str = ""


def _where(allocation: Allocation) -> str:
    """ "node-a:0,1;node-b:0,1": the nodes and GPU indices a job holds (the CSV's nodes column)."""
    return ";".join(f"{i.node}:{','.join(map(str, i.gpu_indices))}" for i in allocation.instances)


def _tasks_for(job: TraceJob) -> tuple[TaskSpec, ...]:
    res = Resources(
        gpus=job.gpus_per_instance, gpu_model=job.gpu_model, cpus=job.cpus, memory_mib=job.memory_mib
    )
    return (TaskSpec(role="worker", instances=job.instances, resources=res),)


# The live reason for a CPU-only job on a cluster without CPU nodes names the server's setting
# (CORRAL_CPU_JOBS_ON_GPU_NODES); a replay's is the knob.
NO_CPU_NODES_IN_SIM = (
    "task worker asks for no GPU; this cluster has no CPU nodes, and CPU-only work is not placed on "
    "GPU nodes unless the policy knob cpu_jobs_on_gpu_nodes is on (--knob cpu_jobs_on_gpu_nodes=1, "
    "or policy_knobs: {cpu_jobs_on_gpu_nodes: true} in the cluster file)"
)


def _probe_job(tj: TraceJob) -> Job:
    return Job(id=tj.job_id, group=tj.group, user=tj.user, tasks=_tasks_for(tj), priority=tj.priority)


class _GroupUse:
    """One group's fair-share usage (decayed GPU-seconds) and the GPUs it runs, the GPUs its
    waiting jobs ask for, and GPU-seconds of guarantee owed (min(guarantee, running + waiting))
    and given (min(guarantee, running)), integrated. Fields rather than dicts keyed by group:
    every group's are advanced at every event time (compiled, native floats)."""

    __slots__ = ("given", "guarantee", "name", "owed", "queued", "rate", "usage")

    def __init__(self, name: str, guarantee: int) -> None:
        self.name, self.guarantee = name, guarantee
        self.usage = 0.0
        self.rate = 0.0
        self.queued = 0
        self.owed = 0.0
        self.given = 0.0


class _UserUse:
    """One (group, user)'s fair-share usage and the GPUs it runs (as `_GroupUse`)."""

    __slots__ = ("key", "rate", "usage")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.usage = 0.0
        self.rate = 0.0


class Simulator:
    """One replay. `run()` drives the event loop; `snapshot()` is what each cycle hands the
    scheduler."""

    def __init__(
        self,
        trace: Trace,
        cluster: ClusterSpec,
        scheduler: PlanMaker,
        policy_name: str = "custom",
        config: SimConfig | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.trace, self.cluster, self.scheduler, self.policy_name = (
            trace,
            cluster,
            scheduler,
            policy_name,
        )
        self.rng = random.Random(self.config.seed)
        self.nodes: tuple[Node, ...] = cluster.build_nodes()
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.groups: tuple[Group, ...] = cluster.groups_for({j.group for j in trace.jobs})
        self.gpu_owner: list[list[str | None]] = [[None] * len(n.gpus) for n in self.nodes]
        self.free_gpus = [len(n.gpus) for n in self.nodes]
        self.total_gpus = sum(self.free_gpus)
        self.allocated = 0
        self.jobs: dict[str, SimJob] = {}
        self.queued: dict[str, Job] = {}
        # waiting GPU jobs per (first task's GPU models, GPUs): what the fragmentation samples read
        self.queued_shapes: dict[tuple[frozenset[str] | None, int], int] = {}
        self.running: dict[str, RunningJob] = {}
        # `queued` and `running` as the tuples the last snapshot handed over, while neither changed:
        # the same tuple again lets the scheduler skip its difference over every job (its memos
        # compare by identity); None once a job joined, left, started, ended or was asked to stop
        self._queued_tuple: tuple[Job, ...] | None = None
        self._running_tuple: tuple[RunningJob, ...] | None = None
        # (time, kind, sequence, job id or node name, the job's attempt for a completion or stop)
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        # fair-share usage per group and per (group, user), and per group the GPUs its waiting jobs
        # ask for and GPU-seconds of (owed, given) guarantee (`_GroupUse`), advanced at every event
        self.guarantee = {g.name: sum(g.guaranteed.values()) for g in self.groups}
        self.group_use: dict[str, _GroupUse] = {
            g.name: _GroupUse(g.name, self.guarantee[g.name]) for g in self.groups
        }
        self.user_use: dict[tuple[str, str], _UserUse] = {}
        for j in trace.jobs:
            if (j.group, j.user) not in self.user_use:
                self.user_use[j.group, j.user] = _UserUse((j.group, j.user))
        self._group_uses = list(self.group_use.values())  # iterated at every event time
        self._user_uses = list(self.user_use.values())
        self.usage_time = 0.0
        self.rejected: list[tuple[TraceJob, str]] = []
        self.records: list[CycleRecord] = []
        self.alloc_t: array[float] = array("d")
        self.alloc_gpus: array[float] = array("d")
        self.frag: list[tuple[float, int, int]] = []
        self.cycles = self.preemption_count = self.node_failures = 0
        self.schedule_s = 0.0
        self.new_arrivals: list[str] = []  # arrived since the last cycle: score their first ETA
        self.eta_pending: list[str] = []  # eta_interval_s > 0: arrived since the last ETA read
        self.eta_next_read = 0.0  # eta_interval_s > 0: no ETA read before this time
        self.diagnosis_s = 0.0
        self._deferred_cycle: float | None = None
        self.job_events = 0  # pending job events; node events alone do not keep the replay going
        # pending node repairs: they do while jobs wait (the job a failure stopped, or one that
        # needs the node, would run once it is back; ending first left it "unfinished")
        self.repairs = 0
        self.history = RuntimeHistory(legacy=self.config.legacy_estimates)
        profile = getattr(self.scheduler, "profile", None)  # a plugin scheduler may have none
        calibrates = self.config.eta_calibration and bool(getattr(profile, "eta_calibration", True))
        self.eta_calibration = EtaCalibration() if calibrates else None
        self.log: list[JobEvent] = []
        self.now = 0.0
        self._load_jobs()

    # -- setup ---------------------------------------------------------------------------------
    def _push(self, at: float, kind: _Ev, key: str, attempt: int = 0) -> None:
        self._seq += 1
        if kind < _Ev.NODE_FAIL or kind >= _Ev.ARRIVAL:
            self.job_events += 1
        elif kind == _Ev.NODE_REPAIR:
            self.repairs += 1
        heapq.heappush(self.events, (at, int(kind), self._seq, key, attempt))

    def _cluster_notes(self) -> tuple[str, ...]:
        """Guarantees that add up to more than the cluster are accepted, as on the live platform
        (services/quota.py: nodes come and go), with a note saying so: per GPU model (a quota
        naming a model the cluster lacks, `a100` for `A100`, holds nothing), and all together."""
        notes = []
        have: dict[str, int] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                have[gpu.model] = have.get(gpu.model, 0) + 1
        per_model: dict[str, int] = {}
        for group in self.groups:
            for model, n in group.guaranteed.items():
                if model != ANY_MODEL and n > 0:
                    per_model[model] = per_model.get(model, 0) + n
        spelled = {m.lower(): m for m in have}
        for model, promised in sorted(per_model.items()):
            if promised > have.get(model, 0):
                near = spelled.get(model.lower(), model)  # `a100`: a quota's model is matched as spelt
                hint = f"; a quota names GPU models as the pools spell them: {near}?" if near != model else ""
                notes.append(
                    f"guaranteed {gpu_noun(model)}s of all groups add up to {promised}; the cluster has "
                    f"{have.get(model, 0)} (accepted, as the live platform accepts it){hint}"
                )
        promised = sum(self.guarantee.values())
        if promised > self.total_gpus:
            notes.append(
                f"guaranteed GPUs of all groups add up to {promised}; the cluster has {self.total_gpus} "
                "(accepted, as the live platform accepts it: guarantees are honoured by reclaiming "
                "borrowed GPUs as far as the cluster allows)",
            )
        return tuple(notes)

    def _canonical_model(self, tj: TraceJob) -> TraceJob:
        """The trace's GPU-model names in the cluster's spelling: names match case-insensitively
        (`a100` is the cluster's `A100`); a name the cluster lacks stays as written (rejected)."""
        if tj.gpu_model is None:
            return tj
        spelled = "|".join(self.model_case.get(m.strip().lower(), m.strip()) for m in tj.gpu_model.split("|"))
        return tj if spelled == tj.gpu_model else replace(tj, gpu_model=spelled)

    def _load_jobs(self) -> None:
        """Refuse at submit what the live platform refuses: a job no node can ever hold, and (for
        a policy with quotas) a job its group's quotas can never admit (services/quota.py)."""
        verdicts: dict[tuple[object, ...], str] = {}  # shape -> "" (fits) or why not; few shapes
        profile = getattr(self.scheduler, "profile", None)
        quotas = bool(getattr(profile, "quotas", False))
        cpu_on_gpu = bool(getattr(profile, "cpu_jobs_on_gpu_nodes", False))  # as the schedule() would
        groups = {g.name: g for g in self.groups}
        models = sorted({g.model for n in self.nodes for g in n.gpus})
        self.model_case = {m.lower(): m for m in models}
        for tj in map(self._canonical_model, self.trace.jobs):
            shape = (tj.gpus_per_instance, tj.gpu_model, tj.cpus, tj.memory_mib, tj.instances)
            why = verdicts.get(shape)
            if why is None:
                reasons = check_fits_anywhere(_probe_job(tj), self.nodes, cpu_jobs_on_gpu_nodes=cpu_on_gpu)
                why = verdicts[shape] = "; ".join(
                    NO_CPU_NODES_IN_SIM if r.code == "no_cpu_nodes" else r.message for r in reasons
                )
            if not why and quotas and tj.num_gpus:
                qkey = ("quota", tj.group, tj.num_gpus, tj.gpu_model, tj.user)
                why = verdicts.get(qkey)
                if why is None:
                    probe = _probe_job(tj)
                    allowed = probe.tasks[0].resources.gpu_models
                    usable = [m for m in models if allowed is None or m in allowed]
                    found = quota_refusals(probe, groups[tj.group], usable)
                    why = "; ".join(r.message for r in found)
                    # cached with its prefix: every job of the shape gets the one wording (review110 #7)
                    why = verdicts[qkey] = f"its group's quota can never admit it: {why}" if why else ""
            if why:
                self.rejected.append((tj, why))
                if self.config.record_events:
                    self.log.append(
                        JobEvent(tj.submit_time, tj.job_id, "reject", gpus=tj.num_gpus, reason=why)
                    )
                continue
            self.jobs[tj.job_id] = SimJob(trace=tj, tasks=_tasks_for(tj), remaining=tj.duration)
            self._push(tj.submit_time, _Ev.ARRIVAL, tj.job_id)
        if self.config.node_mtbf_s:
            for node in self.nodes:
                self._push(self.rng.expovariate(1.0 / self.config.node_mtbf_s), _Ev.NODE_FAIL, node.name)

    # -- state -> snapshot ------------------------------------------------------------------------
    def _advance_usage(self, now: float) -> None:
        dt = now - self.usage_time
        if dt <= 0:
            return
        decay = 0.5 ** (dt / self.config.usage_half_life_s)
        for group in self._group_uses:
            rate = group.rate
            group.usage = group.usage * decay + rate * dt
            g = group.guarantee
            if g:
                group.owed += min(g, rate + group.queued) * dt
                group.given += min(g, rate) * dt
        for user in self._user_uses:
            user.usage = user.usage * decay + user.rate * dt
        self.usage_time = now

    def snapshot(self) -> Snapshot:
        """The simulator's state as the Snapshot the live loop would hand to schedule()."""
        queued, running = self._queued_tuple, self._running_tuple
        if queued is None:
            queued = self._queued_tuple = tuple(self.queued.values())
        if running is None:
            running = self._running_tuple = tuple(self.running.values())
        return Snapshot(
            nodes=self.nodes,
            groups=self.groups,
            queued=queued,
            running=running,
            usage=Usage(
                by_group={g.name: g.usage for g in self._group_uses},
                by_user={u.key: u.usage for u in self._user_uses},
            ),
        )

    def _estimate(self, sj: SimJob) -> tuple[float | None, tuple[float, float] | None, bool]:
        """The runtime the scheduler is told, its spread (estimates.py) and whether it is the job's
        own limit: the true remaining time with the oracle, else what history and the user's limit
        say, less the work already kept (what is left of a resumed job's estimate is no limit)."""
        if self.config.oracle_runtime:
            return sj.remaining, None, False
        if not self.config.runtime_history:
            found = estimate_from([], sj.trace.max_runtime_s)  # the user's limit, if any
        else:
            found = self.history.estimate(sj.trace)
        if found is None:
            return None, None, False
        done = sj.trace.duration - sj.remaining  # kept work: the platform saw it run and save
        if done <= 0:
            is_limit = found.basis == "limit"
            spread = None if is_limit or self.history.legacy else (found.low_s, found.high_s)
            return found.seconds, spread, is_limit
        return max(found.seconds - done, min(found.seconds, 60.0)), None, False

    def _queue(self, sj: SimJob, now: float) -> None:
        tj = sj.trace
        sj.queued_at = now
        self.group_use[tj.group].queued += tj.num_gpus
        estimate, spread, is_limit = self._estimate(sj)
        self._queued_tuple = None
        job = self.queued[tj.job_id] = Job(
            id=tj.job_id,
            group=tj.group,
            user=tj.user,
            tasks=sj.tasks,
            priority=tj.priority,
            submit_time=tj.submit_time,
            runtime_estimate=estimate,
            runtime_spread=spread,
            runtime_is_limit=is_limit,
            attained_gpu_seconds=sj.attained_gpu_s,
            stop_grace_s=self._stop_grace(tj),
            preemptions=sj.preemptions,
        )
        self._count_shape(job, 1)

    def _count_shape(self, job: Job, sign: int) -> None:
        """Keep `queued_shapes` in step with `queued` (a job joining: 1, leaving: -1)."""
        res = job.tasks[0].resources
        if not res.gpus:
            return
        key = (res.gpu_models, res.gpus)
        n = self.queued_shapes.get(key, 0) + sign
        if n:
            self.queued_shapes[key] = n
        else:
            del self.queued_shapes[key]

    def _stop_grace(self, tj: TraceJob) -> float | None:
        """The job's own stop grace (the trace's, else the configured default), bounded by the
        maximum; None leaves the profile's grace_s."""
        grace = tj.stop_grace_s if tj.stop_grace_s is not None else self.config.stop_grace_s
        return None if grace is None else min(grace, self.config.max_stop_grace_s)

    # -- applying a plan ------------------------------------------------------------------------
    def _start(self, now: float, job: Job, allocation: Allocation, borrowed: bool) -> None:
        for inst in allocation.instances:
            ni = self.node_index.get(inst.node)
            if ni is None:
                raise SimulationError(f"plan places {job.id} on unknown node {inst.node}")
            owners = self.gpu_owner[ni]
            for g in inst.gpu_indices:
                if owners[g] is not None:
                    raise SimulationError(f"plan places {job.id} on {inst.node} GPU {g}, held by {owners[g]}")
                owners[g] = job.id
            self.free_gpus[ni] -= len(inst.gpu_indices)
        sj = self.jobs[job.id]
        gpus = job.total_gpus
        self.allocated += gpus
        self.group_use[job.group].rate += gpus
        self.user_use[job.group, job.user].rate += gpus
        sj.attempt += 1
        sj.last_start = now
        sj.waited_s += now - sj.queued_at
        if math.isnan(sj.first_start):
            sj.first_start = now
            if self.eta_calibration is not None and not math.isnan(sj.eta_read_at):
                self.eta_calibration.record(gpus, sj.eta_predicted_wait_s, now - sj.eta_read_at)
        if self.config.record_events:
            why = "borrowed quota" if borrowed else ""
            self.log.append(JobEvent(now, job.id, "start", _where(allocation), gpus, why))
        self.running[job.id] = RunningJob(job=job, allocation=allocation, start_time=now, borrowed=borrowed)
        self._running_tuple = None
        self._push(now + sj.remaining, _Ev.COMPLETE, job.id, sj.attempt)

    def _release(self, job_id: str) -> RunningJob:
        rj = self.running.pop(job_id)
        self._running_tuple = None
        for inst in rj.allocation.instances:
            ni = self.node_index[inst.node]
            owners = self.gpu_owner[ni]
            for g in inst.gpu_indices:
                owners[g] = None
            self.free_gpus[ni] += len(inst.gpu_indices)
        gpus = rj.job.total_gpus
        self.allocated -= gpus
        self.group_use[rj.job.group].rate -= gpus
        self.user_use[rj.job.group, rj.job.user].rate -= gpus
        return rj

    def _interrupt(self, now: float, job_id: str, why: str) -> None:
        """Stop a running job (preempted or its node failed); it keeps work up to its last
        checkpoint, or all of it when preempted with checkpoint-on-preempt."""
        rj = self._release(job_id)
        sj = self.jobs[job_id]
        ran = now - sj.last_start
        interval = self.config.checkpoint_interval_s
        if why == "preempted" and self.config.checkpoint_on_preempt:
            kept = min(sj.remaining, ran)
        else:
            kept = min(sj.remaining, math.floor(ran / interval) * interval) if interval > 0 else 0.0
        sj.lost_work_s += ran - kept
        sj.remaining -= kept
        sj.attained_gpu_s += ran * rj.job.total_gpus
        sj.stopping = False
        sj.attempt += 1  # invalidates the pending completion event
        if self.config.record_events:
            lost = f"; lost {ran - kept:.0f} s of work" if ran > kept else ""
            where = _where(rj.allocation)
            self.log.append(JobEvent(now, job_id, "stop", where, rj.job.total_gpus, why + lost))
        self._queue(sj, now)

    def _apply(self, now: float, plan: Plan) -> None:
        apply_plan(plan, _SimSink(self, now))
        self.new_arrivals.clear()

    # -- events ---------------------------------------------------------------------------------
    def _cycle_or_defer(self, now: float) -> None:
        interval = self.config.cycle_interval_s
        tick = math.ceil(now / interval) * interval if interval > 0 else now
        if tick <= now:  # on the grid (a deferred CYCLE event lands here too)
            self._cycle(now)
        elif self._deferred_cycle is None:
            self._deferred_cycle = tick
            self._push(tick, _Ev.CYCLE, "")

    def _handle(self, now: float, kind: int, key: str, attempt: int) -> bool:
        """Apply one event; True when it changed what the scheduler would see."""
        if kind == _Ev.CYCLE:
            self._deferred_cycle = None
            return True
        if kind == _Ev.ARRIVAL:
            self._queue(self.jobs[key], now)
            self.new_arrivals.append(key)
            if self.config.record_events:
                self.log.append(JobEvent(now, key, "submit", gpus=self.jobs[key].trace.num_gpus))
            return True
        if kind in (_Ev.COMPLETE, _Ev.STOP):
            job_id = key
            sj = self.jobs[job_id]
            if attempt != sj.attempt or job_id not in self.running:
                return False  # stale: the attempt was already stopped or finished
            if kind == _Ev.COMPLETE:
                rj = self._release(job_id)
                sj.remaining = 0.0
                sj.end = now
                self.history.record(sj.trace, sj.trace.duration)
                if self.config.record_events:
                    where = _where(rj.allocation)
                    self.log.append(JobEvent(now, job_id, "finish", where, sj.trace.num_gpus))
            else:
                self._interrupt(now, job_id, "preempted")
            return True
        return self._node_event(now, kind, key)

    def _node_event(self, now: float, kind: int, name: str) -> bool:
        ni = self.node_index[name]
        node = self.nodes[ni]
        if kind == _Ev.NODE_FAIL:
            self.node_failures += 1
            victims = {owner for owner in self.gpu_owner[ni] if owner is not None}
            victims |= {
                jid
                for jid, rj in self.running.items()
                if not rj.job.total_gpus and name in rj.allocation.nodes
            }
            for job_id in sorted(victims):
                self._interrupt(now, job_id, f"node {name} failed")
            state = NodeState.DOWN
            self._push(now + self.config.node_repair_s, _Ev.NODE_REPAIR, name)
        else:
            state = NodeState.READY
            assert self.config.node_mtbf_s
            self._push(now + self.rng.expovariate(1.0 / self.config.node_mtbf_s), _Ev.NODE_FAIL, name)
        nodes = list(self.nodes)
        nodes[ni] = replace(node, state=state)  # keeps any field added to Node later
        self.nodes = tuple(nodes)
        return True

    def _cycle(self, now: float) -> None:
        self._advance_usage(now)
        snap = self.snapshot()
        started = time.perf_counter()
        plan = self.scheduler.schedule(snap, now, self.rng)
        self.schedule_s += time.perf_counter() - started
        self.cycles += 1
        if self.config.record_cycles:
            self.records.append(CycleRecord(snapshot=snap, now=now, plan=plan))
        self._apply(now, plan)

    def _sample_fragmentation(self, now: float) -> None:
        """Free GPUs on ready nodes that no waiting job's instance could use (size and model)."""
        need: dict[frozenset[str] | None, int] = {}
        # the keys, (GPU models, GPUs): per shape, not per waiting job (thousands when deep); the
        # counts only keep a shape listed while a job of it waits
        for models, gpus in self.queued_shapes:
            need[models] = min(need.get(models, gpus), gpus)
        free = unusable = 0
        for ni, node in enumerate(self.nodes):
            f = self.free_gpus[ni]
            if not f or node.state is not NodeState.READY:
                continue
            free += f
            model = node.gpus[0].model
            if not any(g <= f and (models is None or model in models) for models, g in need.items()):
                unusable += f
        self.frag.append((now, free, unusable))

    def run(self) -> SimResult:
        defer_full_collections()
        try:
            return self._run()
        finally:
            restore_full_collections()

    def _run(self) -> SimResult:
        started = time.perf_counter()
        events, handle = self.events, self._handle
        first = events[0][0] if events else 0.0
        self.usage_time = first
        span = (self.trace.jobs[-1].submit_time - first) if self.trace.jobs else 0.0
        frag_every = max(span / max(self.config.frag_samples, 1), 1e-9)
        next_frag = first
        now = first
        max_queued = 0
        while events and (self.job_events or (self.repairs and self.queued)):
            now = events[0][0]
            changed = False
            while events and events[0][0] == now:
                _, kind, _, key, attempt = heapq.heappop(events)
                if kind < _Ev.NODE_FAIL or kind >= _Ev.ARRIVAL:
                    self.job_events -= 1
                elif kind == _Ev.NODE_REPAIR:
                    self.repairs -= 1
                self._advance_usage(now)
                changed = handle(now, kind, key, attempt) or changed
            if changed and self.queued:
                self._cycle_or_defer(now)
                if len(self.queued) > max_queued:
                    max_queued = len(self.queued)
            if self.queued and now >= next_frag:
                self._sample_fragmentation(now)
                next_frag = now + frag_every
            if not self.alloc_t or self.alloc_gpus[-1] != self.allocated:
                self.alloc_t.append(now)
                self.alloc_gpus.append(self.allocated)
        return SimResult(
            trace_name=self.trace.name,
            cluster_name=self.cluster.name,
            policy=self.policy_name,
            total_gpus=self.total_gpus,
            jobs=list(self.jobs.values()),
            rejected=self.rejected,
            alloc_t=self.alloc_t,
            alloc_gpus=self.alloc_gpus,
            frag_samples=self.frag,
            cycles=self.cycles,
            preemptions=self.preemption_count,
            node_failures=self.node_failures,
            wall_s=time.perf_counter() - started,
            schedule_s=self.schedule_s,
            diagnosis_s=self.diagnosis_s,
            records=self.records,
            notes=(*self.trace.notes, *self._cluster_notes()),
            end_time=now,
            max_queued=max_queued,
            events=self.log,
            guarantee_gpu_s={g.name: (g.owed, g.given) for g in self._group_uses},
        )


class _SimSink:
    """The simulator's side of `apply_plan`: its in-memory cluster at one instant."""

    def __init__(self, sim: Simulator, now: float) -> None:
        self.sim, self.now = sim, now

    def assign(self, assignments: Sequence[Assignment]) -> int:
        sim = self.sim
        for a in assignments:
            job = sim.queued.pop(a.job_id, None)
            sim._queued_tuple = None
            if job is None:
                raise SimulationError(f"plan assigns {a.job_id}, which is not waiting")
            sim.group_use[job.group].queued -= job.total_gpus
            sim._count_shape(job, -1)
            sim._start(self.now, job, a.allocation, a.borrowed)
        return len(assignments)

    def preempt(self, p: Preemption) -> bool:
        sim = self.sim
        sj = sim.jobs.get(p.job_id)
        if sj is None or p.job_id not in sim.running or sj.stopping:
            return False
        sj.stopping = True
        sj.preemptions += 1
        sim.preemption_count += 1
        if sim.config.record_events:
            rj = sim.running[p.job_id]
            sim.log.append(
                JobEvent(self.now, p.job_id, "preempt", _where(rj.allocation), rj.job.total_gpus, p.reason)
            )
        stops_by = self.now + max(0.0, p.grace_s)  # the victim's own grace
        # Still running until its grace ends; the scheduler must not pick it as a victim again.
        sim.running[p.job_id] = replace(sim.running[p.job_id], stopping=True, stops_by=stops_by)
        sim._running_tuple = None
        sim._push(stops_by, _Ev.STOP, p.job_id, sj.attempt)
        return True

    def diagnose(self, diagnoses: Mapping[str, Diagnosis], planned: Set[str]) -> None:
        """The estimate a job is given in its first cycle (what its user sees on submitting) is the
        one scored. Diagnoses are computed lazily by the library, and only the estimates are read,
        so cycles without new waiting jobs never pay for them. With `eta_interval_s`, new jobs
        are read together at most once per interval (`_due_for_eta`)."""
        sim = self.sim
        if not sim.config.estimate_starts:
            return
        if sim.config.eta_interval_s > 0:
            due = self._due_for_eta(planned)
        elif sim.new_arrivals:
            due = [j for j in sim.new_arrivals if j in sim.queued and j not in planned]
        else:
            return
        started = time.perf_counter()
        calibration, now = sim.eta_calibration, self.now
        for job_id, eta in estimated_starts(diagnoses, due).items():
            if eta is not None:
                sj = sim.jobs[job_id]
                sj.eta_predicted_wait_s, sj.eta_read_at = eta - now, now
                size = sj.trace.num_gpus
                sj.eta = eta if calibration is None else calibration.corrected_start(now, size, eta)
        sim.diagnosis_s += time.perf_counter() - started

    def _due_for_eta(self, planned: Set[str]) -> list[str]:
        """The jobs whose estimate is read this cycle under `eta_interval_s`: none before the next
        read's time (the new ones wait for it); then every job that arrived since the last read
        and has not started (one still waiting and not placed by this plan)."""
        sim = self.sim
        pending = sim.eta_pending
        pending.extend(sim.new_arrivals)
        if not pending or self.now < sim.eta_next_read:
            return []
        sim.eta_next_read = self.now + sim.config.eta_interval_s
        jobs, queued = sim.jobs, sim.queued
        due = [j for j in pending if j in queued and j not in planned and math.isnan(jobs[j].first_start)]
        pending.clear()
        return due
