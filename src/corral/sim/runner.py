"""Policies by name and one-call replays: `simulate(trace, cluster, "default")`.

A policy is a named Profile of the scheduler library (`corral.scheduler.PROFILES`), optionally with
another placement: `fifo:spread` is FIFO with spread placement. A name ending in `-oracle`
(`sjf-oracle`) gives that policy the trace's true durations as runtime estimates: a labelled bound
no real scheduler reaches (every other replay estimates from history, `estimates.py`). The
simulator never decides anything itself; it asks a `corral.scheduler.Scheduler`, the object the
live control loop keeps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from corral.scheduler import Scheduler
from corral.sim.cluster import ClusterSpec
from corral.sim.errors import PolicyError
from corral.sim.replay import SimConfig, SimResult, Simulator
from corral.sim.trace import Trace

COMPARE_POLICIES = ("default", "fifo", "fifo-backfill", "sjf", "las", "sjf-oracle")
ORACLE_SUFFIX = "-oracle"


def parse_knobs(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`["backfill_depth=500", "las_thresholds=3600,36000"]` -> Profile fields; a clear error
    naming a knob that does not exist or a value that is not a number."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in _knob_names():
            raise PolicyError(f"--knob {item!r}: use NAME=VALUE with NAME one of {', '.join(_knob_names())}")
        out[name] = knob_value(name, raw, f"--knob {item!r}")
    return out


def knob_values(values: Mapping[str, object]) -> dict[str, Any]:
    """A cluster file's `policy_knobs:` as YAML gives them (`{las_thresholds: [3600, 36000],
    starvation_s: 0, cpu_jobs_on_gpu_nodes: true}`) -> Profile fields: the names and checks of
    `--knob`, on the values themselves; an error names the knob."""
    out: dict[str, Any] = {}
    for name, raw in values.items():
        if name not in _knob_names():
            raise PolicyError(f"{name!r} is not a knob: use one of {', '.join(_knob_names())}")
        out[name] = knob_value(name, raw, f"{name}: {raw!r}")
    return out


def _knob_names() -> tuple[str, ...]:
    from corral.scheduler.profiles import BOOL_KNOBS, NUMERIC_KNOBS

    # cpu_jobs_on_gpu_nodes: what the live server sets beyond its profile (the local engine's rule)
    return (*NUMERIC_KNOBS, *BOOL_KNOBS, "cpu_jobs_on_gpu_nodes", "las_thresholds", "eta_roll")


def knob_value(name: str, raw: object, shown: str) -> Any:
    """One knob's value from a `--knob` string or a YAML value (a number, true/false, a list of
    numbers, a word); `shown` names it in the error."""
    from corral.scheduler.profiles import BOOL_KNOBS, ETA_ROLLS

    if name == "eta_roll":
        if str(raw).strip() not in ETA_ROLLS:
            raise PolicyError(f"{shown}: eta_roll is one of {', '.join(ETA_ROLLS)}")
        return str(raw).strip()
    try:
        if name == "las_thresholds":
            parts: Any = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(parts, list | tuple):
                parts = (parts,)  # one threshold
            value: Any = tuple(float(x) for x in parts if not isinstance(x, str) or x.strip())
        elif name in BOOL_KNOBS or name == "cpu_jobs_on_gpu_nodes":  # (no starred tuple: mypyc)
            flag = str(int(raw)) if isinstance(raw, bool | int) else str(raw).strip()
            if flag not in ("0", "1"):
                raise ValueError(raw)
            value = flag == "1"
        else:
            number = float(raw)  # type: ignore[arg-type]
            value = int(number) if number.is_integer() and name not in ("grace_s",) else number
    except (ValueError, TypeError):
        if name == "las_thresholds":
            raise PolicyError(f"{shown}: las_thresholds is a list of numbers, e.g. 3600,36000")
        if name in BOOL_KNOBS or name == "cpu_jobs_on_gpu_nodes":
            raise PolicyError(f"{shown}: {name} is on or off: 1 or 0 (true or false in a cluster file)")
        raise PolicyError(f"{shown}: {raw!r} is not a number")
    if name in _whole_number_knobs() and not isinstance(value, int):
        raise PolicyError(f"{shown}: {name} is a whole number")
    return value


def _whole_number_knobs() -> frozenset[str]:
    """The Profile fields typed `int`: a fraction there is refused here, by name, rather than
    truncated or left to fail later (the compiled scheduler checks field types at run time)."""
    from corral.scheduler.profiles import Profile

    return frozenset(f.name for f in dataclasses.fields(Profile) if f.type in ("int", int))


def resolve_policy(spec: str, knobs: dict[str, Any] | None = None) -> Scheduler:
    """`NAME` or `NAME:PLACEMENT` -> a new Scheduler with that profile (one per replay: it keeps
    its caches for the replay's cycles and shares them with no other), with `knobs` (Profile
    fields: `parse_knobs`) changed."""
    from corral.scheduler import PROFILES
    from corral.scheduler.plugins import PLACEMENTS

    name, _, placement = spec.partition(":")
    name = name.removesuffix(ORACLE_SUFFIX)
    profile = PROFILES.get(name)
    if profile is None:
        raise PolicyError(f"unknown policy {name!r}; use one of {', '.join(PROFILES)}")
    if placement and placement not in PLACEMENTS:  # (the profile's own error shows a Python tuple)
        raise PolicyError(
            f"policy {spec!r}: unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}"
        )
    try:
        if placement:
            profile = dataclasses.replace(profile, placement=placement)
        if knobs:
            profile = dataclasses.replace(profile, **knobs)
    except ValueError as exc:
        raise PolicyError(f"policy {spec!r}: {exc}")
    return Scheduler(profile)


def simulate(
    trace: Trace,
    cluster: ClusterSpec,
    policy: str = "default",
    config: SimConfig | None = None,
    knobs: dict[str, Any] | None = None,
) -> SimResult:
    config = config or SimConfig()
    if policy.partition(":")[0].endswith(ORACLE_SUFFIX):
        config = dataclasses.replace(config, oracle_runtime=True)
    scheduler = resolve_policy(policy, {**(cluster.policy_knobs or {}), **(knobs or {})})
    return Simulator(trace, cluster, scheduler, policy_name=policy, config=config).run()


def private_baseline(
    trace: Trace,
    cluster: ClusterSpec,
    policy: str,
    config: SimConfig | None = None,
    knobs: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each group alone on a private cluster of its guaranteed quota (rounded up to whole nodes):
    its average queueing delay there, to compare with the shared cluster."""
    out: dict[str, dict[str, Any]] = {}
    for group in cluster.groups_for({j.group for j in trace.jobs}):
        jobs = tuple(j for j in trace.jobs if j.group == group.name)
        if not jobs:
            continue
        private = cluster.with_private_quota(group)
        if not private.pools:
            out[group.name] = {"private_gpus": 0, "private_avg_queue_s": None, "private_rejected": len(jobs)}
            continue
        sub = Trace(name=f"{trace.name}-{group.name}", jobs=jobs)
        result = simulate(sub, private, policy, config, knobs)
        waits = [j.waited_s for j in result.jobs if not math.isnan(j.end)]
        out[group.name] = {
            "private_gpus": private.total_gpus,
            "private_avg_queue_s": sum(waits) / len(waits) if waits else None,
            "private_rejected": len(result.rejected),
        }
    return out
