"""The control loops' view of a stored job spec (`Job.spec`).

`Job.spec` is a `corral.spec.JobSpecV1`, parsed once when its row is read (one instance per
distinct stored text, see corral.db.jsontypes); its `view`, the part the loops use (tasks in rank
order with resources, command and env, the job's env, runtime limit, environment and stop
grace), is computed once per instance. The schedule loop reads every queued job's spec each
cycle, so neither is redone per tick.
"""

from __future__ import annotations

from corral.spec import DEFAULT_STOP_GRACE_S, JobSpecV1, SpecView, TaskView

__all__ = ["DEFAULT_STOP_GRACE_S", "SpecView", "TaskView", "read_spec"]


def read_spec(spec: JobSpecV1) -> SpecView:
    return spec.view
