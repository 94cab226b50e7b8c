"""A read-only view of a stored job spec (the `Job.spec` JSON) for the control loops.

The API stores specs it validated with `corral.spec.JobSpecV1`; the loops re-read them through
the same model (one parser for sizes and durations) and keep only what they need: the tasks in
rank order with their resources, command and env, the job's env, runtime limit, environment and
stop grace. Views are cached by the spec's JSON text, since a stored spec never changes and the
schedule loop reads every queued job's spec each cycle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from corral.scheduler.types import Resources
from corral.spec import JobSpecV1, parse_duration_s

DEFAULT_STOP_GRACE_S = 10.0


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


def read_spec(spec: Mapping[str, Any]) -> SpecView:
    return _view(json.dumps(spec))  # key order kept: task order is rank order


@lru_cache(maxsize=8192)
def _view(spec_json: str) -> SpecView:
    model = JobSpecV1.model_validate_json(spec_json)
    tasks = tuple(
        TaskView(
            role=role,
            instances=task.instances,
            resources=task.resources.to_scheduler(),
            command=task.command,
            env=dict(task.env),
        )
        for role, task in model.tasks.items()
    )
    grace = parse_duration_s(model.stop_grace) if model.stop_grace else DEFAULT_STOP_GRACE_S
    return SpecView(
        tasks=tasks,
        env=dict(model.env),
        max_runtime_s=model.max_runtime_s,
        environment=model.environment,
        stop_grace_s=grace,
    )
