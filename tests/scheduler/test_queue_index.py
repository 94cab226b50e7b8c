"""The queue kept in order between cycles (queue_index.py) equals the queue sorted afresh."""

from __future__ import annotations

from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler.admission import size_class
from corral.scheduler.core import waiting_jobs
from corral.scheduler.queue_index import QueueIndex
from corral.scheduler.queues import split_by_user
from corral.scheduler.seqdiff import DiffMemo
from corral.scheduler.types import Job, Priority, RunningJob
from tests.scheduler.builders import job, running, snap

# (id, group, user, priority, submit time, GPUs): few values, so equal keys and duplicate ids occur
JOBS = st.tuples(
    st.sampled_from("abcdefghij"),
    st.sampled_from(["g", "h"]),
    st.sampled_from(["u", "v", "w"]),
    st.sampled_from(list(Priority)),
    st.integers(0, 3),
    st.integers(0, 2),
)


def make(spec: tuple[str, str, str, Priority, int, int]) -> Job:
    job_id, group, user, priority, submit, gpus = spec
    return job(job_id, gpus=gpus, group=group, user=user, priority=priority, submit=float(submit))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(JOBS, max_size=8), min_size=1, max_size=6), st.data())
def test_index_equals_the_queue_sorted_afresh(rounds: list[list[tuple]], data: st.DataObject) -> None:  # type: ignore[type-arg]
    size_of = partial(size_class, default_runtime_s=3600.0)  # classes differ by GPUs here
    index = QueueIndex(size_of)
    queued: list[Job] = []
    for new in rounds:
        # some jobs leave (started), some arrive, one may be queued twice or also running
        keep = data.draw(st.lists(st.booleans(), min_size=len(queued), max_size=len(queued)))
        queued = [j for j, k in zip(queued, keep, strict=True) if k] + [make(s) for s in new]
        if queued and data.draw(st.booleans()):
            queued.append(queued[0])  # the same object twice
        run = []
        if queued and data.draw(st.booleans()):
            run = [running(job(queued[-1].id), "n", (0,))]
        s = snap([], tuple(queued), run=tuple(run))
        got = index.sync(s.queued, s.running)
        ids = [j.id for j in queued]
        clean = len(set(ids)) == len(ids) and not run
        if not clean:
            assert got is None
            continue
        want = waiting_jobs(s)
        assert got == want
        by_group: dict[str, list[Job]] = {}
        for j in want:
            by_group.setdefault(j.group, []).append(j)
        per_user, cpu_ids = split_by_user(by_group)
        assert index.per_user() == per_user
        assert index.cpu_ids == cpu_ids
        # each user's fair-share order (queues.FairShareQueue._job_key) and every job's class
        in_size_order = {
            g: {
                u: sorted(js, key=lambda j: (-int(j.priority), size_of(j), j.submit_time, j.id))
                for u, js in us.items()
            }
            for g, us in per_user.items()
        }
        assert index.per_user_sized() == in_size_order
        assert index.sizes == {j.id: size_of(j) for j in want}


def test_the_same_queued_tuple_again_skips_the_difference_but_not_the_running_check() -> None:
    """The very same queued tuple again (the simulator's, when no job joined or left) is answered
    from the index as it is; with another running tuple the check that no waiting job also runs
    is still made; a list changed in place under the same identity is diffed afresh."""
    index = QueueIndex(partial(size_class, default_runtime_s=3600.0))
    queued = tuple(make((i, "g", "u", Priority.NORMAL, n, n % 3)) for n, i in enumerate("abc"))
    want = waiting_jobs(snap([], queued))
    assert index.sync(queued, ()) == want
    assert index.last_queued is queued  # kept: the next call with it takes the short cut
    version = index.version
    assert index.sync(queued, ()) == want
    also_running = (running(job("b"), "n", (0,)),)
    assert index.sync(queued, also_running) is None  # "b" waits and runs: sorted afresh
    assert index.sync(queued, (running(job("z"), "n", (0,)),)) == want
    assert index.version == version  # the queue did not change
    changing = list(queued)
    assert index.sync(changing, ()) == want
    changing.pop()  # the same list, one job fewer
    assert index.sync(changing, ()) == waiting_jobs(snap([], tuple(changing)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(JOBS, max_size=4), min_size=2, max_size=10), st.data())
def test_index_follows_tuples_in_any_order(rounds: list[list[tuple]], data: st.DataObject) -> None:  # type: ignore[type-arg]
    """Tuples that are the last with jobs removed and new ones appended take the short
    difference (seqdiff.py), and the check against the running ids looks only at what is new on
    either side; one waiting job moved to the end or the front, new jobs put anywhere, one
    appended twice, a waiting and a running job with one id (either side new, or kept from a
    round that already clashed), the same queued tuple again: every answer equals the queue
    sorted afresh, or None where core.waiting_jobs must sort it. The running tuples' difference
    is worked out in a memo shared with another user (as a Scheduler's free capacity shares it),
    which now and then asks it for another pair of running tuples first."""
    memo = DiffMemo()
    index = QueueIndex(partial(size_class, default_runtime_s=3600.0), memo)
    queued: list[Job] = []
    queued_tuple: tuple[Job, ...] = ()
    run: list[RunningJob] = []
    run_tuple: tuple[RunningJob, ...] = ()
    seen_runs: list[tuple[RunningJob, ...]] = [()]
    serial = 0
    for new in rounds:
        if not queued_tuple or data.draw(st.integers(0, 3)) > 0:  # else: the same queued tuple
            keep = data.draw(st.lists(st.booleans(), min_size=len(queued), max_size=len(queued)))
            queued = list(dict.fromkeys(j for j, k in zip(queued, keep, strict=True) if k))
            if len(queued) > 1 and data.draw(st.booleans()):
                moved = queued.pop(data.draw(st.integers(0, len(queued) - 1)))
                queued.insert(len(queued) if data.draw(st.booleans()) else 0, moved)
            for spec in new:
                serial += 1  # unique ids, but now and then a running job's
                job_id = f"{spec[0]}{serial}"
                if run and data.draw(st.integers(0, 5)) == 0:
                    job_id = data.draw(st.sampled_from(run)).job.id
                at = data.draw(st.integers(0, len(queued))) if data.draw(st.booleans()) else len(queued)
                queued.insert(at, make((job_id, *spec[1:])))
            if queued and data.draw(st.integers(0, 4)) == 0:
                queued.append(data.draw(st.sampled_from(queued)))  # the same object twice
            queued_tuple = tuple(queued)
        if data.draw(st.booleans()):  # else: the same running tuple
            keep = data.draw(st.lists(st.booleans(), min_size=len(run), max_size=len(run)))
            run = [rj for rj, k in zip(run, keep, strict=True) if k]
            for _ in range(data.draw(st.integers(0, 2))):
                serial += 1
                run.append(running(job(f"run{serial}"), "n", (0,)))
            if queued and data.draw(st.integers(0, 3)) == 0:  # a running job with a waiting id
                clash = data.draw(st.sampled_from(queued))
                run.insert(data.draw(st.integers(0, len(run))), running(job(clash.id), "n", (0,)))
            run_tuple = tuple(run)
            seen_runs.append(run_tuple)
        if data.draw(st.booleans()):  # the other user of the memo diffs some other pair first
            memo.diff(data.draw(st.sampled_from(seen_runs)), data.draw(st.sampled_from(seen_runs)))
        s = snap([], queued_tuple, run=run_tuple)
        got = index.sync(s.queued, s.running)
        ids = [j.id for j in queued_tuple]
        if len(set(ids)) < len(ids) or set(ids) & {rj.job.id for rj in run_tuple}:
            assert got is None
        else:
            assert got == waiting_jobs(s)
