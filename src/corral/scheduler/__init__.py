"""Corral's scheduler: a pure library. `Scheduler(profile).schedule(snapshot, now, rng) -> Plan`
(or the one-off `schedule(snapshot, now, rng, profile)`), and `apply_plan(plan, sink)` to carry a
plan out.

See docs/scheduler.md for the admission model, the placement plugins, diagnosis codes and profiles.
"""

# First, before any submodule is imported: use the mypyc-compiled modules if they were built from
# exactly these sources, else every module is pure Python (compiled_build.py).
from corral.scheduler.compiled_build import activate as _activate_compiled_build

_activate_compiled_build("scheduler", __path__)

from corral.scheduler.admission import decay_usage
from corral.scheduler.apply import Applied, PlanSink, apply_plan
from corral.scheduler.cluster import check_fits_anywhere
from corral.scheduler.core import Scheduler, schedule
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
    "Applied",
    "Assignment",
    "Diagnosis",
    "Group",
    "InstancePlacement",
    "Job",
    "Node",
    "NodeState",
    "Plan",
    "PlanSink",
    "Preemption",
    "Priority",
    "Profile",
    "Reason",
    "Resources",
    "RunningJob",
    "Scheduler",
    "Snapshot",
    "TaskSpec",
    "Usage",
    "apply_plan",
    "check_fits_anywhere",
    "decay_usage",
    "parse_gpu_models",
    "schedule",
]
