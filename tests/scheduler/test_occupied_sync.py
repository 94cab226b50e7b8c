"""Free capacity kept between cycles (`cluster.Occupied`, brought up to date by the difference in
running jobs) equals the free capacity built afresh from the same running jobs, whatever comes and
goes between calls: jobs that end, start, come back as new objects, or appear twice."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler.cluster import ClusterMemo, ClusterState, RunningTotals
from corral.scheduler.types import RunningJob
from tests.scheduler.builders import gpu_node, job, running

NODES = tuple(gpu_node(f"n{i}", gpus=4, model="A100" if i % 2 else "V100M32") for i in range(3))

# (node, first GPU, GPUs, borrowed): overlapping slots occur (a GPU held twice: rebuilt afresh)
SLOTS = st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(1, 2), st.booleans())


def state_of(st_: ClusterState) -> tuple[object, ...]:
    return (
        [{m: list(lst) for m, lst in d.items()} for d in st_.free],
        dict(st_.free_total),
        {m: [list(b) for b in bs] for m, bs in st_.buckets.items()},
        list(st_.free_cpus),
        list(st_.free_mem),
        st_.free_sum,
    )


def assert_kept_equals_fresh(
    memo: ClusterMemo, current: list[RunningJob]
) -> tuple[RunningTotals, RunningTotals]:
    """Occupy `current` with the state kept in `memo` and afresh: the same (job, GPUs per model)
    pairs, free capacity and totals by group and model and by user. Both totals, for more checks."""
    kept = ClusterState(NODES, memo)
    held, totals = kept.occupy_running(tuple(current))
    fresh = ClusterState(NODES, ClusterMemo())
    want_held, want_totals = fresh.occupy_running(tuple(current))
    assert held == want_held
    # each pair carries the very job of `current` at its place (the kept pairs are not stale)
    assert len(held) == len(current) and all(rj is want for (rj, _), want in zip(held, current, strict=True))
    assert state_of(kept) == state_of(fresh)
    assert totals.by_group_model == want_totals.by_group_model
    assert totals.by_user == want_totals.by_user
    return totals, want_totals


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(SLOTS, max_size=6), min_size=1, max_size=6), st.data())
def test_kept_free_capacity_equals_a_fresh_build(rounds: list[list[tuple]], data: st.DataObject) -> None:  # type: ignore[type-arg]
    memo = ClusterMemo()
    current: list[RunningJob] = []
    for n, slots in enumerate(rounds):
        keep = data.draw(st.lists(st.booleans(), min_size=len(current), max_size=len(current)))
        current = [rj for rj, k in zip(current, keep, strict=True) if k]
        for k, (node, first, width, borrowed) in enumerate(slots):
            gpus = tuple(range(first, min(first + width, 4)))
            rj = job(f"r{n}-{k}", gpus=len(gpus), group=data.draw(st.sampled_from(["a", "b"])))
            current.append(running(rj, NODES[node].name, gpus, start=float(n), borrowed=borrowed))
        if current and data.draw(st.booleans()):
            current.append(current[0])  # the same object twice
        totals, want_totals = assert_kept_equals_fresh(memo, current)
        assert totals.preemptible == want_totals.preemptible
        for field in ("ranks", "lenders"):  # counters: a key counted down to 0 may stay
            got, want = getattr(totals, field), getattr(want_totals, field)
            assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}


def test_the_same_running_tuple_again_is_answered_without_a_difference() -> None:
    """A caller that hands the very same tuple again (the simulator, when nothing started, ended or
    stopped since) gets the kept answer; another tuple, or a list changed in place under the same
    identity, is brought up to date by the difference. Every answer equals a fresh build."""
    memo = ClusterMemo()
    a = tuple(running(job(f"r{i}", gpus=1), NODES[i].name, (i,), start=0.0) for i in range(3))
    b = a[1:]
    for current in (a, a, b, a, a):
        kept = ClusterState(NODES, memo)
        held, _ = kept.occupy_running(current)
        fresh = ClusterState(NODES, ClusterMemo())
        assert held == fresh.occupy_running(current)[0]
        assert state_of(kept) == state_of(fresh)
    (occ,) = memo.occupied
    assert occ.last is a  # kept for the next call: the short cut (no difference) is taken then
    assert occ.sync(a) == held and occ.sync(a) is not occ.last_pairs  # a copy: callers may keep it
    changing = list(a)
    occ.sync(changing)
    changing.pop()  # the same list, one job fewer: never taken for the kept answer
    kept = ClusterState(NODES, memo)
    held, _ = kept.occupy_running(changing)
    fresh = ClusterState(NODES, ClusterMemo())
    assert held == fresh.occupy_running(changing)[0]
    assert state_of(kept) == state_of(fresh)


def test_a_list_in_between_is_not_answered_for_the_tuple_kept_before_it() -> None:
    """The tuple kept for the short cut is forgotten once a sync is given anything else: a tuple,
    then a list (not kept), then the first tuple again must be brought up to date by the
    difference, not answered from what was kept for it while the state held the list's jobs."""
    memo = ClusterMemo()
    a = tuple(running(job(f"r{i}", gpus=1), NODES[i].name, (i,), start=0.0) for i in range(3))
    for current in (a, list(a[1:]), a):
        kept = ClusterState(NODES, memo)
        held, _ = kept.occupy_running(current)
        fresh = ClusterState(NODES, ClusterMemo())
        assert held == fresh.occupy_running(current)[0]
        assert state_of(kept) == state_of(fresh)


def reshuffle(items: list[RunningJob], data: st.DataObject) -> list[RunningJob]:
    """Another order of the same jobs, now and then: one moved to the end, or to the front."""
    if len(items) > 1 and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(items) - 1))
        moved = items.pop(i)
        if data.draw(st.booleans()):
            items.append(moved)
        else:
            items.insert(0, moved)
    return items


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(SLOTS, max_size=4), min_size=2, max_size=8), st.data())
def test_kept_free_capacity_follows_tuples_in_any_order(
    rounds: list[list[tuple]], data: st.DataObject
) -> None:  # type: ignore[type-arg]
    """Tuples that are the last with jobs removed and new ones appended take the short
    difference (seqdiff.py); one held job moved to the end or the front, new jobs put anywhere, or
    one appended twice must not: each answer equals a fresh build's."""
    memo = ClusterMemo()
    current: list[RunningJob] = []
    for n, slots in enumerate(rounds):
        keep = data.draw(st.lists(st.booleans(), min_size=len(current), max_size=len(current)))
        current = reshuffle([rj for rj, k in zip(current, keep, strict=True) if k], data)
        for k, (node, first, width, borrowed) in enumerate(slots):
            gpus = tuple(range(first, min(first + width, 4)))
            if data.draw(st.booleans()):  # CPU-only: nothing but the set difference sees it twice
                gpus = ()
            spec = job(f"r{n}-{k}", gpus=len(gpus), cpus=2.0)
            rj = running(spec, NODES[node].name, gpus, start=float(n), borrowed=borrowed)
            current.insert(
                data.draw(st.integers(0, len(current))) if data.draw(st.booleans()) else len(current), rj
            )
        if current and data.draw(st.integers(0, 4)) == 0:
            current.append(data.draw(st.sampled_from(current)))  # the same object twice
        assert_kept_equals_fresh(memo, current)
        if len({id(rj) for rj in current}) < len(current):
            current = list(dict.fromkeys(current))  # the next round from a clean set again
