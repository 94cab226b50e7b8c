"""Corral's scheduler: a pure library. `schedule(snapshot, now, rng, profile) -> Plan`.

See docs/scheduler.md for the admission model, the placement plugins, diagnosis codes and profiles.
"""

from corral.scheduler.admission import decay_usage
from corral.scheduler.cluster import check_fits_anywhere
from corral.scheduler.core import schedule
from corral.scheduler.plugins import FILTERS, SCORERS
from corral.scheduler.profiles import PROFILES, Profile
from corral.scheduler.types import (
    ANY_MODEL,
    GPU,
    Allocation,
    Assignment,
    Diagnosis,
    Group,
    InstancePlacement,
    Job,
    Node,
    NodeState,
    Plan,
    Preemption,
    Priority,
    Reason,
    Resources,
    RunningJob,
    Snapshot,
    TaskSpec,
    Usage,
    parse_gpu_models,
)

__all__ = [
    "ANY_MODEL",
    "FILTERS",
    "GPU",
    "PROFILES",
    "SCORERS",
    "Allocation",
    "Assignment",
    "Diagnosis",
    "Group",
    "InstancePlacement",
    "Job",
    "Node",
    "NodeState",
    "Plan",
    "Preemption",
    "Priority",
    "Profile",
    "Reason",
    "Resources",
    "RunningJob",
    "Snapshot",
    "TaskSpec",
    "Usage",
    "check_fits_anywhere",
    "decay_usage",
    "parse_gpu_models",
    "schedule",
]
