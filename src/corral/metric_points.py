"""What one metrics point may hold (a line of a job's $CORRAL_OUTPUTS/metrics.jsonl): the rules
the server reads by (corral.services.job_metrics) and the SDK writes by (corral.sdk
report_metrics), in one place, so a point the SDK accepts is never one the server then skips.
Standard library only: the SDK imports it."""

from __future__ import annotations

import math
import re

MAX_NAMES_PER_POINT = 64
MAX_STEP = 2**53  # exact in every JSON reader
METRIC_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,63}$")
METRIC_NAME_WORDS = "1 to 64 letters, digits, '_', '.', '/' or '-', not starting with '.', '/' or '-'"


def point_problem(step: object, values: dict[str, object]) -> str | None:
    """Why `step` and `values` make no point the server reads, in words naming the bad part;
    None when they make one. `step` None: no step."""
    if not values:
        return "a point needs at least one metric, e.g. loss=0.41"
    if len(values) > MAX_NAMES_PER_POINT:
        return f"{len(values)} metrics in one point; at most {MAX_NAMES_PER_POINT}"
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP
    ):
        return f"step {step!r} is not a whole number from 0 to 2**53"
    for name, value in values.items():
        if not METRIC_NAME_RE.fullmatch(name):
            return f"metric name {name!r} must be {METRIC_NAME_WORDS}"
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            shown = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a whole number"
            return f"metric {name!r}: {shown} is not a finite number a float can hold"
    return None


def _finite(value: int | float) -> bool:
    """A finite float, or a whole number a float holds: JSON's integers have no bound, and
    math.isfinite(10**400) raises OverflowError (one such line failed a whole metrics page)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
