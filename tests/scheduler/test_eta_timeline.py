"""The backfill roll's timeline search (eta.Timeline) against a plain reading of its definition:
the first time, not before a floor, from which enough GPUs stay free for the whole runtime; the
candidates are the floor itself and every later breakpoint. The search checks the first runs of
room one by one (read from a list, or from bytes on a long timeline: both checked), then skips
ahead by runs of room (one vector pass), stops once a bound (a start another model offers) is
passed, and does not mark the floor; all must give exactly the plain answer."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import eta
from corral.scheduler.eta import Timeline, remaining_s


def free_at(line: Timeline, t: float) -> int:
    """Free GPUs at time `t` (>= the first breakpoint)."""
    k = line.size
    i = max(j for j in range(k) if line.times[j] <= t)
    return int(line.free[i])


def plain_earliest(line: Timeline, need: int, runtime: float, not_before: float) -> float | None:
    k = line.size
    times = [float(x) for x in line.times[:k]]
    start0 = max(not_before, times[0])
    for t in [start0, *(x for x in times if x > start0)]:
        inside = [t, *(x for x in times if t < x < t + runtime)]  # every change within the stretch
        if all(free_at(line, x) >= need for x in inside):
            return t
    return None


rolls = st.lists(
    st.tuples(
        st.integers(1, 8),  # need
        st.sampled_from([1.0, 5.0, 30.0, 100.0, 250.0]),  # runtime
        st.sampled_from([0.0, 3.0, 40.0, 120.0]),  # floor offset (strict FIFO rolls raise it)
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("list_scan_max", [eta.LIST_SCAN_MAX, 0])  # the first runs from a list; from bytes
@settings(max_examples=150, deadline=None)
@given(
    free_now=st.integers(0, 8),
    returns=st.lists(
        st.tuples(st.sampled_from([5.0, 10.0, 40.0, 60.0, 200.0]), st.integers(1, 4)), max_size=8
    ),
    jobs=rolls,
)
def test_earliest_is_the_first_start_with_room_for_the_whole_runtime(
    list_scan_max: int, free_now: int, returns: list[tuple[float, int]], jobs: list[tuple[int, float, float]]
) -> None:
    kept = eta.LIST_SCAN_MAX
    eta.LIST_SCAN_MAX = list_scan_max
    try:
        _check_earliest(free_now, returns, jobs)
    finally:
        eta.LIST_SCAN_MAX = kept


def _check_earliest(
    free_now: int, returns: list[tuple[float, int]], jobs: list[tuple[int, float, float]]
) -> None:
    line = Timeline(0.0, free_now, sorted(returns))
    twin = Timeline(0.0, free_now, sorted(returns))  # rolled by hold_earliest: search and take in one
    twin_all = Timeline(0.0, free_now, sorted(returns))  # the same, through the all-runs pass
    for need, runtime, offset in jobs:
        plain = plain_earliest(line, need, runtime, offset)
        assert twin.hold_earliest(need, runtime, offset) == plain
        first_runs = eta.FIRST_RUNS
        try:
            eta.FIRST_RUNS = 1
            assert twin_all.hold_earliest(need, runtime, offset) == plain
        finally:
            eta.FIRST_RUNS = first_runs
        want = plain_earliest(line, need, runtime, offset)
        got = line.earliest(need, runtime, offset)
        assert got == want, (need, runtime, offset)
        first_runs = eta.FIRST_RUNS
        try:  # the all-runs pass from the second run of room on (few runs here: else rarely reached)
            eta.FIRST_RUNS = 1
            assert line.earliest(need, runtime, offset) == want, (need, runtime, offset)
        finally:
            eta.FIRST_RUNS = first_runs
        for bound in (10.0, 60.0):  # another model offers a start at `bound`: only earlier ones
            earlier = want if want is not None and want < bound else None
            assert line.earliest(need, runtime, offset, bound) == earlier, (need, runtime, offset, bound)
        if got is not None:
            before = [free_at(line, x) for x in (got, got + runtime - 0.5)]
            line.take(got, need, runtime)
            assert free_at(line, got) == before[0] - need
            assert free_at(line, got + runtime - 0.5) == before[1] - need
            assert free_at(line, got + runtime) >= 0
        k = line.size  # the twins hold exactly what earliest then take left
        for other in (twin, twin_all):
            assert other.size == k
            assert list(other.times[:k]) == list(line.times[:k])
            assert list(other.free[:k]) == list(line.free[:k])


def test_remaining_s_matches_the_log_normal_it_describes() -> None:
    """The closed form with math.erf (no NormalDist call) still gives the conditional median:
    a job at its median has run as long as half its kind, and is expected to run about as long
    again (the median of D given D > median is the 75th percentile of D, for q = 0.5)."""
    estimate, spread = 1000.0, (500.0, 2000.0)
    at_median = remaining_s(estimate, spread, estimate)
    sigma = (math.log(2000.0) - math.log(500.0)) / 1.3489795
    p75 = math.exp(math.log(estimate) + sigma * 0.6744897501960817)
    assert math.isclose(at_median + estimate, p75, rel_tol=1e-9)
    assert remaining_s(estimate, spread, 0.0) == estimate
    assert remaining_s(estimate, None, 300.0) == 700.0


def test_remaining_s_far_in_its_kinds_tail_is_at_least_half_what_it_ran() -> None:
    """Past its kind's 99th percentile the log-normal's thin tail gives a job a small part of what
    it ran (a 1 s kind's `sleep 600`: seconds); the tail rule keeps at least TAIL_FACTOR x
    elapsed, x q / (1 - q) at a range's ends. Before that quantile the log-normal alone."""
    estimate, spread = 1.0, (0.5, 2.0)  # a kind of ~1 s runs
    sigma = (math.log(2.0) - math.log(0.5)) / 1.3489795
    p99 = math.exp(sigma * 2.3263478740408408)
    assert (eta.TAIL_SURVIVE, eta.TAIL_FACTOR) == (0.01, 0.5)
    before = 0.9 * p99
    survive = 1.0 - statistics.NormalDist().cdf(math.log(before) / sigma)
    median_left = math.exp(sigma * statistics.NormalDist().inv_cdf(1.0 - survive / 2)) - before
    assert math.isclose(remaining_s(estimate, spread, before), median_left, rel_tol=1e-9)
    for elapsed in (1.1 * p99, 60.0, 600.0):
        assert remaining_s(estimate, spread, elapsed) == 0.5 * elapsed
        assert remaining_s(estimate, spread, elapsed, 0.75) == 1.5 * elapsed
        assert remaining_s(estimate, spread, elapsed, 0.25) == pytest.approx(elapsed / 6)
    assert remaining_s(estimate, spread, 1e9) == 1e9  # P(D > elapsed) <= 1e-12: as long again


def test_inverse_normal_called_directly_is_the_method_bit_for_bit() -> None:
    """remaining_s calls statistics' inverse normal CDF without NormalDist's method: the same
    floats (the replays' per-job hashes depend on them)."""
    from statistics import NormalDist

    for p in (1e-9, 0.01, 0.25, 0.3, 0.5, 0.75, 0.9999999, 1.0 - 2.5e-13):
        assert eta._inv_cdf_at(p, 0.0, 1.0) == NormalDist().inv_cdf(p)


def plain_backfill_starts(
    now: float,
    free_by_model: dict[str, int],
    capacity_by_model: dict[str, int],
    events: list[tuple[float, dict[str, int]]],
    waiting: list[tuple[str, int, tuple[str, ...], float | None]],
    default_runtime_s: float,
    in_order: bool,
) -> dict[str, float | None]:
    """backfill_starts as defined: job by job, each searched on every model then held."""
    models = {m for w in waiting for m in w[2]}
    lines = {
        m: Timeline(
            now,
            free_by_model.get(m, 0),
            [(t, pm[m]) for t, pm in sorted(events, key=lambda e: e[0]) if pm.get(m)],
        )
        for m in models
    }
    out: dict[str, float | None] = {}
    floor = now
    for job_id, need, allowed, runtime in waiting:
        if need <= 0:
            out[job_id] = floor
            continue
        hold = default_runtime_s if runtime is None else max(runtime, 1.0)
        best: tuple[float, Timeline] | None = None
        for m in allowed:
            if need > capacity_by_model.get(m, 0):
                continue
            at = lines[m].earliest(need, hold, floor)
            if at is not None and (best is None or at < best[0]):
                best = (at, lines[m])
        out[job_id] = None if best is None else best[0]
        if best is not None:
            best[1].take(best[0], need, hold)
            if in_order:
                floor = best[0]
    return out


kinds = st.tuples(
    st.integers(1, 6),  # need
    st.sampled_from([("a",), ("b",), ("a", "b")]),
    st.sampled_from([None, 5.0, 30.0, 100.0]),
)


@settings(max_examples=150, deadline=None)
@given(
    free_a=st.integers(0, 8),
    free_b=st.integers(0, 4),
    returns=st.lists(
        st.tuples(st.sampled_from([5.0, 10.0, 40.0, 60.0]), st.sampled_from(["a", "b"]), st.integers(1, 4)),
        max_size=6,
    ),
    runs=st.lists(st.tuples(kinds, st.integers(1, 6)), min_size=1, max_size=8),
    in_order=st.booleans(),
)
def test_backfill_starts_places_runs_of_alike_jobs_as_one_by_one(
    free_a: int,
    free_b: int,
    returns: list[tuple[float, str, int]],
    runs: list[tuple[tuple[int, tuple[str, ...], float | None], int]],
    in_order: bool,
) -> None:
    """Runs of jobs that ask for the same (GPUs, models, runtime) are placed together where the
    stretch the first took still has room (or all get no time): the same starts as placing them
    one by one (some jobs never fit: more GPUs than a model has)."""
    events = [(t, {m: n}) for t, m, n in returns]
    capacity = {
        m: free + sum(n for _, r, n in returns if r == m) for m, free in (("a", free_a), ("b", free_b))
    }
    waiting = [
        (f"j{k}-{r}", need, models, runtime)
        for k, ((need, models, runtime), repeat) in enumerate(runs)
        for r in range(repeat)
    ]
    free = {"a": free_a, "b": free_b}
    want = plain_backfill_starts(0.0, free, capacity, events, waiting, 50.0, in_order)
    assert eta.backfill_starts(0.0, free, capacity, events, waiting, 50.0, in_order) == want


@settings(max_examples=120, deadline=None)
@given(
    free_now=st.integers(0, 6),
    returns=st.lists(
        st.tuples(st.sampled_from([3.0, 10.0, 25.0, 40.0, 90.0]), st.integers(1, 5)), max_size=10
    ),
    runs=st.lists(
        st.tuples(st.integers(1, 4), st.sampled_from([None, 7.0, 30.0, 60.0]), st.integers(2, 12)),
        min_size=1,
        max_size=5,
    ),
    in_order=st.booleans(),
)
def test_long_runs_along_the_last_run_of_room_start_as_one_by_one(
    free_now: int,
    returns: list[tuple[float, int]],
    runs: list[tuple[int, float | None, int]],
    in_order: bool,
) -> None:
    """Long runs of alike jobs on one model, most of them past every return (the last run of
    room, where a run's later jobs are placed without searches, `_place_along_last_run`): each
    start as placing the jobs one by one, strict FIFO's raised floor included; the fast path is
    taken in some of these rolls."""
    events = [(t, {"a": n}) for t, n in returns]
    capacity = {"a": max(8, free_now + sum(n for _, n in returns))}
    waiting = [
        (f"j{k}-{r}", need, ("a",), runtime)
        for k, (need, runtime, repeat) in enumerate(runs)
        for r in range(repeat)
    ]
    free = {"a": free_now}
    want = plain_backfill_starts(0.0, free, capacity, events, waiting, 50.0, in_order)
    assert eta.backfill_starts(0.0, free, capacity, events, waiting, 50.0, in_order) == want


@pytest.mark.pure_scheduler  # it counts calls by replacing eta._place_along_last_run (conftest.py)
def test_the_last_run_path_is_taken_and_agrees() -> None:
    """A fixed roll that goes through `_place_along_last_run` several times (8 one-GPU jobs on
    4 GPUs free from 10 s on, each for 20 s: starts 10, 10, 10, 10, 30, 30, 30, 30)."""
    events = [(10.0, {"a": 4})]
    waiting = [(f"j{k}", 1, ("a",), 20.0) for k in range(8)]
    calls = []
    real = eta._place_along_last_run

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    eta._place_along_last_run = counted  # type: ignore[assignment]
    try:
        got = eta.backfill_starts(0.0, {"a": 0}, {"a": 4}, events, waiting, 50.0)
    finally:
        eta._place_along_last_run = real
    assert calls
    assert got == plain_backfill_starts(0.0, {"a": 0}, {"a": 4}, events, waiting, 50.0, False)
    assert [got[f"j{k}"] for k in range(8)] == [10.0] * 4 + [30.0] * 4


@settings(max_examples=150, deadline=None)
@given(
    free_a=st.integers(0, 8),
    returns=st.lists(
        st.tuples(
            st.sampled_from([0.0, 5.0, 10.0, 40.0]),  # 0.0: at `now` (a victim gone by now)
            st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 4), max_size=3),
        ),
        max_size=10,
    ),
)
def test_a_rolls_timelines_are_those_built_from_each_models_returns(
    free_a: int, returns: list[tuple[float, dict[str, int]]]
) -> None:
    """BackfillRoll builds each model's breakpoints straight from the events (no (time, GPUs) pair
    per event and model): the same times and free GPUs, to the bit, as a Timeline built from that
    model's returns in time order (events in any order, several models each, GPUs 0 left out, ties
    in time merged)."""
    now = 0.0
    free = {"a": free_a, "b": 2}  # "c": no free GPUs now
    roll = eta.BackfillRoll(now, free, {"a": 99, "b": 99, "c": 99}, returns, 50.0)
    roll._add_lines([("x", 1, ("a", "b", "c"), 5.0)])  # the timelines as built, nothing placed
    ordered = sorted(returns, key=lambda e: e[0])
    for m in ("a", "b", "c"):
        want = Timeline(now, free.get(m, 0), [(t, pm[m]) for t, pm in ordered if pm.get(m)])
        got = roll.lines[m]
        assert got.size == want.size
        assert [x.hex() for x in got.times[: got.size].tolist()] == [
            x.hex() for x in want.times[: want.size].tolist()
        ]
        assert got.free[: got.size].tolist() == want.free[: want.size].tolist()
        assert len(got.times) == len(want.times) and len(got.room) == len(want.room)
