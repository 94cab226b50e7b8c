"""A read-only view of a stored job spec (the `Job.spec` JSON) for the control loops.

The API validates specs with `corral.spec` before storing them; the loops only need the task list,
resources, command, env and runtime limit. This view reads both spec shapes the API may store
(`tasks` as a mapping role -> task, or as a list of tasks with a `name`/`role`) and both memory forms
(`memory_mib: 2048` or `memory: "2GiB"`), so the loops do not depend on the model's internals.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.scheduler.types import Resources

_UNITS = {
    "": 1 / (1024 * 1024),
    "b": 1 / (1024 * 1024),
    "k": 1 / 1024,
    "kb": 1 / 1024,
    "ki": 1 / 1024,
    "kib": 1 / 1024,
    "m": 1,
    "mb": 1,
    "mi": 1,
    "mib": 1,
    "g": 1024,
    "gb": 1024,
    "gi": 1024,
    "gib": 1024,
    "t": 1024 * 1024,
    "tb": 1024 * 1024,
    "ti": 1024 * 1024,
    "tib": 1024 * 1024,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def memory_mib(value: Any, default: int = 1024) -> int:
    """`2048` (MiB), `"2GiB"`, `"512Mi"` -> MiB."""
    if value is None:
        return default
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read memory size {value!r}; write e.g. 2048 (MiB) or '4GiB'")
    return max(1, int(float(match.group(1)) * _UNITS[match.group(2).lower()]))


def duration_s(value: Any) -> float | None:
    """`3600`, `"6h"`, `"30m"`, `"90s"` -> seconds; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _DURATION_UNITS:
        raise ValueError(f"cannot read duration {value!r}; write e.g. 3600, '90m' or '6h'")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


@dataclass(frozen=True, slots=True)
class TaskView:
    role: str
    instances: int
    resources: Resources
    command: str
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpecView:
    tasks: tuple[TaskView, ...]
    env: Mapping[str, str]
    max_runtime_s: float | None
    environment: str
    stop_grace_s: float

    @property
    def num_instances(self) -> int:
        return sum(t.instances for t in self.tasks)


def _resources(raw: Mapping[str, Any]) -> Resources:
    mem = raw.get("memory_mib", raw.get("memory"))
    model = raw.get("gpu_model")
    return Resources(
        gpus=int(raw.get("gpus", 0) or 0),
        gpu_model=str(model) if model else None,
        cpus=float(raw.get("cpus", 1.0) or 1.0),
        memory_mib=memory_mib(mem),
    )


def _task(role: str, raw: Mapping[str, Any]) -> TaskView:
    env = raw.get("env") or {}
    return TaskView(
        role=role,
        instances=int(raw.get("instances", 1) or 1),
        resources=_resources(raw.get("resources") or {}),
        command=str(raw.get("command", "")),
        env={str(k): str(v) for k, v in env.items()},
    )


def read_spec(spec: Mapping[str, Any]) -> SpecView:
    raw_tasks = spec.get("tasks") or {}
    if isinstance(raw_tasks, Mapping):
        tasks = tuple(_task(str(role), t or {}) for role, t in raw_tasks.items())
    else:
        tasks = tuple(
            _task(str(t.get("role") or t.get("name") or f"task{i}"), t) for i, t in enumerate(raw_tasks)
        )
    env = spec.get("env") or {}
    grace = spec.get("stop_grace", spec.get("stop_grace_s"))
    return SpecView(
        tasks=tasks,
        env={str(k): str(v) for k, v in env.items()},
        max_runtime_s=duration_s(spec.get("max_runtime", spec.get("max_runtime_s"))),
        environment=str(spec.get("environment") or "default"),
        stop_grace_s=duration_s(grace) or 10.0,
    )
