"""Value types of the scheduler library.

These are the snapshot the scheduler reads and the plan it returns. They are plain frozen
dataclasses so that the live control loop, the trace simulator and the tests can build them
cheaply and compare them exactly. Nothing here does I/O or reads a clock.

Other packages build on these names; add fields with defaults, never rename or remove.

The classes built per job or per cycle spell out their `__init__` (a field added to one needs it
there too; tests/scheduler/test_dataclass_inits.py checks every such `__init__` against the
fields): mypyc compiles the methods written in a class body, while those `@dataclass` generates
stay interpreted Python, and a replay builds millions of these objects. Each field is set with
`object.__setattr__(self, "name", value)`, which mypyc compiles to a direct store and which in
pure Python is what the generated `__init__` of a frozen dataclass does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from types import MappingProxyType
from typing import Final

ANY_MODEL = "*"
"""Quota key meaning "GPUs of any model"; also used for CPU-only capacity accounting."""


class NodeState(StrEnum):
    READY = "ready"
    CORDONED = "cordoned"  # runs what it has, takes nothing new
    DRAINING = "draining"  # like cordoned; operators expect it to empty
    DOWN = "down"
    UNKNOWN = "unknown"  # engine cannot tell (e.g. Slurm unreachable); treated like down for placement


class Priority(IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        if isinstance(value, Priority):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[value.upper()]
        except KeyError as exc:
            raise ValueError(f"unknown priority {value!r}; use low, normal or high") from exc


@dataclass(frozen=True, slots=True)
class GPU:
    index: int
    uuid: str
    model: str
    memory_mib: int = 0
    topology_group: int | None = None  # GPUs with the same group share an NVLink/PCIe island
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpus: float
    memory_mib: int
    gpus: tuple[GPU, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    state: NodeState = NodeState.READY

    @property
    def is_gpu_node(self) -> bool:
        return bool(self.gpus)

    @property
    def schedulable(self) -> bool:
        return self.state is NodeState.READY


def parse_gpu_models(constraint: str | None) -> frozenset[str] | None:
    """`"V100M16|V100M32"` -> {"V100M16", "V100M32"}; None or "" means any model."""
    if not constraint:
        return None
    models = frozenset(m.strip() for m in constraint.split("|") if m.strip())
    return models or None


@dataclass(frozen=True, slots=True)
class Resources:
    """What ONE instance of a task needs."""

    gpus: int = 0
    gpu_model: str | None = None  # constraint: "A100" or "V100M16|V100M32"; None = any
    cpus: float = 1.0
    memory_mib: int = 1024

    def __init__(
        self, gpus: int = 0, gpu_model: str | None = None, cpus: float = 1.0, memory_mib: int = 1024
    ) -> None:
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "gpu_model", gpu_model)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "memory_mib", memory_mib)

    @property
    def gpu_models(self) -> frozenset[str] | None:
        return parse_gpu_models(self.gpu_model)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    role: str
    instances: int
    resources: Resources

    def __init__(self, role: str, instances: int, resources: Resources) -> None:
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "instances", instances)
        object.__setattr__(self, "resources", resources)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    group: str
    user: str
    tasks: tuple[TaskSpec, ...]
    priority: Priority = Priority.NORMAL
    preemptible: bool = True
    submit_time: float = 0.0
    runtime_estimate: float | None = None  # seconds; None = unknown
    # (25th, 75th percentile) of the past runs `runtime_estimate` is the median of (runtimes.py);
    # None: no spread known (a user's limit, or no estimate). Estimated starts read it.
    runtime_spread: tuple[float, float] | None = None
    # `runtime_estimate` is the job's own time limit (max_runtime, no history: basis "limit"): the
    # platform stops it there, so a running job's remaining time ends there (eta.remaining_s)
    runtime_is_limit: bool = False
    attained_gpu_seconds: float = 0.0  # service received so far (for least-attained-service policies)
    # SIGTERM-to-kill time it asks for when preempted (the caller bounds it by its admin maximum);
    # None: the profile's grace_s
    stop_grace_s: float | None = None
    # Where the job must not run (a hardware failure's retry): (node, GPU index), or (node, None)
    # for the whole node. Sorted, so equal exclusions give equal jobs.
    avoid: tuple[tuple[str, int | None], ...] = ()
    # Times it was preempted so far: a job at the profile's max_preemptions is no longer a victim
    preemptions: int = 0

    def __init__(
        self,
        id: str,
        group: str,
        user: str,
        tasks: tuple[TaskSpec, ...],
        priority: Priority = Priority.NORMAL,
        preemptible: bool = True,
        submit_time: float = 0.0,
        runtime_estimate: float | None = None,
        runtime_spread: tuple[float, float] | None = None,
        runtime_is_limit: bool = False,
        attained_gpu_seconds: float = 0.0,
        stop_grace_s: float | None = None,
        avoid: tuple[tuple[str, int | None], ...] = (),
        preemptions: int = 0,
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "user", user)
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "preemptible", preemptible)
        object.__setattr__(self, "submit_time", submit_time)
        object.__setattr__(self, "runtime_estimate", runtime_estimate)
        object.__setattr__(self, "runtime_spread", runtime_spread)
        object.__setattr__(self, "runtime_is_limit", runtime_is_limit)
        object.__setattr__(self, "attained_gpu_seconds", attained_gpu_seconds)
        object.__setattr__(self, "stop_grace_s", stop_grace_s)
        object.__setattr__(self, "avoid", avoid)
        object.__setattr__(self, "preemptions", preemptions)

    @property
    def total_gpus(self) -> int:
        tasks = self.tasks
        if len(tasks) == 1:  # the common single-task job, without a generator (read very often)
            task = tasks[0]
            return task.instances * task.resources.gpus
        return sum(t.instances * t.resources.gpus for t in tasks)

    @property
    def total_instances(self) -> int:
        return sum(t.instances for t in self.tasks)

    @property
    def total_cpus(self) -> float:
        return sum(t.instances * t.resources.cpus for t in self.tasks)

    @property
    def total_memory_mib(self) -> int:
        return sum(t.instances * t.resources.memory_mib for t in self.tasks)


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """Where one task instance runs: one node, the GPU indices on it, and its CPU/memory share."""

    role: str
    index: int
    node: str
    gpu_indices: tuple[int, ...]
    cpus: float
    memory_mib: int

    def __init__(
        self, role: str, index: int, node: str, gpu_indices: tuple[int, ...], cpus: float, memory_mib: int
    ) -> None:
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "gpu_indices", gpu_indices)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "memory_mib", memory_mib)


@dataclass(frozen=True, slots=True)
class Allocation:
    job_id: str
    instances: tuple[InstancePlacement, ...]

    def __init__(self, job_id: str, instances: tuple[InstancePlacement, ...]) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "instances", instances)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.node for p in self.instances))


@dataclass(frozen=True, slots=True)
class RunningJob:
    job: Job
    allocation: Allocation
    start_time: float
    borrowed: bool = False  # charged beyond its group's guarantee: the lender may reclaim it
    # Already asked to stop (preempted, in its grace period): never picked as a victim again; its
    # resources count as free from `stops_by` (same time base as `now`; None: now + the job's grace).
    stopping: bool = False
    stops_by: float | None = None

    def __init__(
        self,
        job: Job,
        allocation: Allocation,
        start_time: float,
        borrowed: bool = False,
        stopping: bool = False,
        stops_by: float | None = None,
    ) -> None:
        object.__setattr__(self, "job", job)
        object.__setattr__(self, "allocation", allocation)
        object.__setattr__(self, "start_time", start_time)
        object.__setattr__(self, "borrowed", borrowed)
        object.__setattr__(self, "stopping", stopping)
        object.__setattr__(self, "stops_by", stops_by)


@dataclass(frozen=True, slots=True)
class Group:
    """A tenant. GPU quotas are GPUs per GPU model (the key ANY_MODEL covers models not listed);
    CPUs and memory have a group-wide hard limit only (their guarantees live in the platform)."""

    name: str
    guaranteed: Mapping[str, int] = field(default_factory=dict)
    max: Mapping[str, int] | None = None  # borrowing limit per model; None = no limit beyond the cluster
    user_max_gpus: int | None = None  # per-user cap inside the group; None = no cap
    weight: float = 1.0  # fair-share weight
    borrowing: bool = True  # may this group borrow idle quota of others
    # Hard limits on the CPUs and memory the group's running work holds in all; None = no limit.
    cpus_max: float | None = None
    memory_max_mib: int | None = None
    # Why the group is over its storage quota (bytes or files), None when it is not: its new jobs
    # wait (admission.storage_refusal). Filled by the platform's snapshot; the simulator has none.
    storage_over: str | None = None


# The written-out __init__s' "left out" defaults (review127 #8): private objects, compared by
# identity, standing for the default factory's fresh value as None did; unlike None each is of the
# field's own type, so no caller can pass one and the parameters' annotations are the fields'.
_FRESH_BY_GROUP: Final[Mapping[str, float]] = MappingProxyType({})
_FRESH_BY_USER: Final[Mapping[tuple[str, str], float]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Usage:
    """Decayed historical usage in GPU-seconds (the caller applies the half-life)."""

    by_group: Mapping[str, float] = field(default_factory=dict)
    by_user: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (group, user) -> gpu-s

    # left out: a new empty dict each, as the fields' default factories give (a private sentinel,
    # not None, so the parameters keep the fields' types: None is no usage, review127 #8)
    def __init__(
        self,
        by_group: Mapping[str, float] = _FRESH_BY_GROUP,
        by_user: Mapping[tuple[str, str], float] = _FRESH_BY_USER,
    ) -> None:
        object.__setattr__(self, "by_group", {} if by_group is _FRESH_BY_GROUP else by_group)
        object.__setattr__(self, "by_user", {} if by_user is _FRESH_BY_USER else by_user)


# Snapshot's default usage, told apart by identity: a new empty Usage is made for each snapshot
_FRESH_USAGE: Final[Usage] = Usage()


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[Node, ...]
    groups: tuple[Group, ...]
    queued: tuple[Job, ...]
    running: tuple[RunningJob, ...] = ()
    usage: Usage = field(default_factory=Usage)

    def __init__(
        self,
        nodes: tuple[Node, ...],
        groups: tuple[Group, ...],
        queued: tuple[Job, ...],
        running: tuple[RunningJob, ...] = (),
        usage: Usage = _FRESH_USAGE,  # left out: a new empty Usage, as the field's default factory gives
    ) -> None:
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "queued", queued)
        object.__setattr__(self, "running", running)
        object.__setattr__(self, "usage", Usage() if usage is _FRESH_USAGE else usage)


@dataclass(frozen=True, slots=True)
class Assignment:
    job_id: str
    allocation: Allocation
    borrowed: bool = False

    def __init__(self, job_id: str, allocation: Allocation, borrowed: bool = False) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "allocation", allocation)
        object.__setattr__(self, "borrowed", borrowed)


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    grace_s: float
    reason: str  # human sentence: "reclaimed by group vision for job j-42"
    for_job: str | None = None

    def __init__(self, job_id: str, grace_s: float, reason: str, for_job: str | None = None) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "grace_s", grace_s)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "for_job", for_job)


@dataclass(frozen=True, slots=True)
class Reason:
    code: str  # stable machine code, e.g. "gpu_fragmented", "quota_exhausted"
    source: str  # plugin or admission stage that gave it, e.g. "filter:gpu_model", "quota"
    message: str  # plain sentence for the user

    def __init__(self, code: str, source: str, message: str) -> None:
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "message", message)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    job_id: str
    reasons: tuple[Reason, ...]
    queue_position: int  # 1-based position among the waiting jobs of its group
    estimated_start: float | None  # same time base as `now`; None = cannot tell
    unschedulable: bool = False  # can never fit on this cluster as it stands
    # (early, late) estimated start with runtimes at their history's 25th and 75th percentiles;
    # None: no estimate, or no spread known
    start_range: tuple[float, float] | None = None

    def __init__(  # one per waiting job at every tick of the live loop
        self,
        job_id: str,
        reasons: tuple[Reason, ...],
        queue_position: int,
        estimated_start: float | None,
        unschedulable: bool = False,
        start_range: tuple[float, float] | None = None,
    ) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "reasons", reasons)
        object.__setattr__(self, "queue_position", queue_position)
        object.__setattr__(self, "estimated_start", estimated_start)
        object.__setattr__(self, "unschedulable", unschedulable)
        object.__setattr__(self, "start_range", start_range)


@dataclass(frozen=True, slots=True)
class Plan:
    assignments: tuple[Assignment, ...]
    preemptions: tuple[Preemption, ...]
    diagnoses: Mapping[str, Diagnosis]

    def __init__(
        self,
        assignments: tuple[Assignment, ...],
        preemptions: tuple[Preemption, ...],
        diagnoses: Mapping[str, Diagnosis],
    ) -> None:
        object.__setattr__(self, "assignments", assignments)
        object.__setattr__(self, "preemptions", preemptions)
        object.__setattr__(self, "diagnoses", diagnoses)
