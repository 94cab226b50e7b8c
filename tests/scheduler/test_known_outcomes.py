"""Outcomes replayed within a cycle (`Scheduler(replay_known=True)`, the default) and single
diagnoses read by id must give exactly what the ordinary path gives: the same plans, preemptions
and diagnoses.

A cycle remembers, per kind of job and state, that a job found too few free GPUs (with nothing to
reserve or preempt), searched for victims in vain, or was admitted and then held off by a backfill
reservation; later jobs of that kind skip the work. The snapshots here are crowded on purpose: many
queued jobs of few kinds, a nearly full cluster, borrowed, lower-priority and draining running
jobs, so every replayed outcome occurs often."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import ANY_MODEL, PROFILES, Job, Plan, Priority, Profile, Scheduler, Snapshot, Usage
from tests.scheduler.builders import apply_plan, gpu_node, group, job, plan_for, running

PROFILE_NAMES = sorted(PROFILES)


def fresh_plan(s: Snapshot, profile: Profile, now: float = 1000.0) -> Plan:
    """Every job worked out afresh: no outcome replayed."""
    return Scheduler(profile, replay_known=False).schedule(s, now, random.Random(0))


def twice(s: Snapshot, profile: Profile) -> tuple[Plan, Plan]:
    """Two cycles of one Scheduler on `s`: the first sees every job for the first time, the second
    knows them all (the per-job memo is kept across its calls)."""
    kept = Scheduler(profile)
    return kept.schedule(s, 1000.0, random.Random(0)), kept.schedule(s, 1000.0, random.Random(0))


@st.composite
def crowded(draw: st.DrawFn) -> Snapshot:
    width = draw(st.sampled_from([4, 8]))
    nodes = [
        gpu_node(f"n{i}", gpus=width, model=draw(st.sampled_from(["A100", "A100", "V100M32"])))
        for i in range(draw(st.integers(1, 4)))
    ]
    groups = [
        group(
            name,
            guaranteed={ANY_MODEL: draw(st.integers(0, 2 * width))},
            max=draw(st.sampled_from([None, {ANY_MODEL: 3 * width}])),
            borrowing=draw(st.booleans()),
        )
        for name in ("a", "b")
    ]
    run = []
    for n, node in enumerate(nodes):  # fill most GPUs with running jobs of one or two GPUs
        g = 0
        while g < width and draw(st.integers(0, 5)) > 0:
            k = min(draw(st.sampled_from([1, 2])), width - g)
            rj = job(
                f"r{n}-{g}",
                gpus=k,
                group=draw(st.sampled_from(["a", "b"])),
                model=node.gpus[0].model,
                priority=draw(st.sampled_from([Priority.LOW, Priority.NORMAL])),
                runtime=draw(st.sampled_from([None, 300.0, 5000.0])),
                preemptible=draw(st.booleans()),
                attained=float(draw(st.sampled_from([0, 50000]))),
            )
            placed = running(
                rj, node.name, tuple(range(g, g + k)), start=float(g), borrowed=draw(st.booleans())
            )
            if draw(st.integers(0, 6)) == 0:  # in its grace period: draining room
                placed = dataclasses.replace(
                    placed, stopping=True, stops_by=draw(st.sampled_from([None, 1020.0]))
                )
            run.append(placed)
            g += k
    kinds = [  # few kinds, many jobs of each; model constraints make several reservations
        (gpus, inst, grp, pri, pre, model)
        for gpus, inst in ((1, 1), (2, 1), (width, 1), (width, 2))
        for grp in ("a", "b")
        for pri in (Priority.NORMAL, Priority.HIGH)
        for pre in (True, False)
        for model in (None, None, "A100", "V100M32")
    ]
    users = draw(st.sampled_from([("x",), ("x", "x", "y")]))  # one user per group: skipped in runs
    queued = []
    for k in range(draw(st.integers(1, 40))):
        gpus, inst, grp, pri, pre, model = draw(st.sampled_from(kinds))
        queued.append(
            job(
                f"j{k}",
                gpus=gpus,
                instances=inst,
                group=grp,
                user=draw(st.sampled_from(users)),
                priority=pri,
                preemptible=pre,
                model=model,
                submit=float(k),
                runtime=draw(st.sampled_from([None, 10.0, 100.0, 10000.0])),
                attained=float(draw(st.sampled_from([0, 5000]))),
            )
        )
    usage = Usage(by_group={"a": float(draw(st.integers(0, 1000))), "b": 500.0})
    return Snapshot(tuple(nodes), tuple(groups), tuple(queued), tuple(run), usage)


@st.composite
def preemption_heavy(draw: st.DrawFn) -> Snapshot:
    """A full cluster of low-priority preemptible work, each node pinned by one job that may not be
    preempted: searches for a whole node fail again and again (replayed), smaller ones succeed."""
    width = draw(st.sampled_from([4, 8]))
    nodes = [gpu_node(f"n{i}", gpus=width) for i in range(draw(st.integers(1, 3)))]
    groups = [group("a", guaranteed={ANY_MODEL: width}), group("b", guaranteed={ANY_MODEL: width})]
    run = []
    for node in nodes:
        pin = job(f"pin-{node.name}", group="a", preemptible=False, runtime=9000.0)
        run.append(running(pin, node.name, (0,), start=0.0))
        for g in range(1, width):
            rj = job(
                f"r-{node.name}-{g}",
                group=draw(st.sampled_from(["a", "b"])),
                priority=Priority.LOW,
                runtime=draw(st.sampled_from([500.0, 5000.0])),
                attained=float(draw(st.sampled_from([0, 50000]))),
            )
            placed = running(rj, node.name, (g,), start=float(g), borrowed=draw(st.booleans()))
            if draw(st.integers(0, 5)) == 0:
                placed = dataclasses.replace(placed, stopping=True)
            run.append(placed)
    queued = []
    for k in range(draw(st.integers(1, 30))):
        gpus = draw(st.sampled_from([width, width, 1, 2]))
        queued.append(
            job(
                f"q{k}",
                gpus=gpus,
                group=draw(st.sampled_from(["a", "b"])),
                priority=draw(st.sampled_from([Priority.HIGH, Priority.HIGH, Priority.NORMAL])),
                submit=float(k),
                runtime=draw(st.sampled_from([None, 100.0])),
            )
        )
    return Snapshot(tuple(nodes), tuple(groups), tuple(queued), tuple(run), Usage())


@settings(max_examples=80, deadline=None)
@given(preemption_heavy(), st.sampled_from(["default", "las"]), st.integers(1, 16))
def test_replayed_failed_searches_spend_attempts_as_real_ones(s: Snapshot, name: str, attempts: int) -> None:
    profile = dataclasses.replace(PROFILES[name], max_preemption_attempts=attempts)
    fresh = fresh_plan(s, profile)
    first, second = twice(s, profile)
    assert_same(first, fresh)
    assert_same(second, fresh)  # every job known: whole runs are skipped


def assert_same(plan: Plan, fresh: Plan) -> None:
    assert plan.assignments == fresh.assignments
    assert plan.preemptions == fresh.preemptions
    assert dict(plan.diagnoses) == dict(fresh.diagnoses)


@settings(max_examples=150, deadline=None)
@given(crowded(), st.sampled_from(PROFILE_NAMES))
def test_replayed_outcomes_equal_the_ordinary_path(s: Snapshot, name: str) -> None:
    profile = PROFILES[name]
    fresh = fresh_plan(s, profile)
    # the first call sees every job for the first time; the second knows them all (the per-job memo
    # is kept across calls), so whole runs of jobs are skipped at once (KnownOutcomes.skip_run)
    first, second = twice(s, profile)
    assert_same(first, fresh)
    assert_same(second, fresh)


@settings(max_examples=60, deadline=None)
@given(crowded(), st.sampled_from(["default", "las", "fifo-backfill"]), st.integers(1, 4))
def test_replayed_outcomes_equal_the_ordinary_path_with_few_attempts(
    s: Snapshot, name: str, attempts: int
) -> None:
    """Few preemption attempts: replayed failed searches must spend them as real ones do."""
    profile = dataclasses.replace(PROFILES[name], max_preemption_attempts=attempts, backfill_depth=5)
    fresh = fresh_plan(s, profile)
    assert_same(plan_for(s, profile), fresh)


@settings(max_examples=40, deadline=None)
@given(crowded(), st.sampled_from(["default", "fifo-backfill", "sjf"]))
def test_replayed_outcomes_over_several_cycles(s: Snapshot, name: str) -> None:
    profile: Profile = PROFILES[name]
    kept = Scheduler(profile)
    for cycle in range(3):
        now = 1000.0 + 100 * cycle
        fresh = fresh_plan(s, profile, now=now)
        plan = kept.schedule(s, now, random.Random(0))
        assert_same(plan, fresh)
        s = apply_plan(s, plan, now)
        if s.running:
            s = dataclasses.replace(s, running=s.running[1:])


@settings(max_examples=80, deadline=None)
@given(crowded(), st.sampled_from(PROFILE_NAMES))
def test_one_diagnosis_read_by_id_equals_the_full_set(s: Snapshot, name: str) -> None:
    profile = PROFILES[name]
    full = dict(plan_for(s, profile).diagnoses)
    for job_id in [j.id for j in s.queued] + ["no-such-job"]:
        plan = plan_for(s, profile)  # a fresh plan: nothing built yet, so only this one is
        assert plan.diagnoses.get(job_id) == full.get(job_id)
        assert (job_id in plan.diagnoses) == (job_id in full)
    plan = plan_for(s, profile)
    first = [plan.diagnoses.get(j.id) for j in s.queued[:3]]  # some by id, then all at once
    assert dict(plan.diagnoses) == full
    assert first == [full.get(j.id) for j in s.queued[:3]]


@st.composite
def crowded_many_users(draw: st.DrawFn) -> Snapshot:
    """`crowded` with each group's jobs spread over several users of different shares: the queue
    interleaves them (no single run to skip), job by job."""
    s = draw(crowded())
    users = ("x", "y", "z", "w")
    queued = tuple(dataclasses.replace(j, user=draw(st.sampled_from(users))) for j in s.queued)
    by_user = {(g, u): float(draw(st.integers(0, 3)) * 100) for g in ("a", "b") for u in users}
    usage = Usage(by_group=dict(s.usage.by_group), by_user=by_user)
    return dataclasses.replace(s, queued=queued, usage=usage)


@settings(max_examples=60, deadline=None)
@given(crowded_many_users(), st.sampled_from(["default", "las"]), st.integers(1, 16), st.integers(0, 2**16))
def test_replayed_outcomes_with_several_users_per_group_over_cycles(
    s: Snapshot, name: str, attempts: int, seed: int
) -> None:
    """Random cycles of one kept Scheduler (jobs start, running jobs end, new jobs arrive) against
    a fresh Scheduler that works every job out: an outcome replayed with a wrong state, user order
    or attempt count changes a plan or a diagnosis."""
    profile = dataclasses.replace(PROFILES[name], max_preemption_attempts=attempts)
    kept = Scheduler(profile)
    rng = random.Random(seed)
    for cycle in range(4):
        now = 1000.0 + 100 * cycle
        plan = kept.schedule(s, now, random.Random(0))
        assert_same(plan, fresh_plan(s, profile, now=now))
        s = apply_plan(s, plan, now)
        running_left = list(s.running)
        if running_left:
            del running_left[rng.randrange(len(running_left))]  # one job ends
        arrivals = tuple(
            dataclasses.replace(j, id=f"{j.id}-c{cycle}", submit_time=now + k)
            for k, j in enumerate(rng.sample(s.queued, min(3, len(s.queued))))
        )
        s = dataclasses.replace(s, running=tuple(running_left), queued=s.queued + arrivals)


@settings(max_examples=40, deadline=None)
@given(crowded(), st.sampled_from(PROFILE_NAMES), st.booleans())
def test_keys_read_off_the_job_info_equal_the_key_methods(s: Snapshot, name: str, borrowing: bool) -> None:
    """`KnownOutcomes.replay` reads the failure, search and admission keys straight off the
    JobInfo under the default policy's settings (`plain`): they must be what the key methods
    give, in either pass, or a replayed outcome would be looked up under another kind's key."""
    from corral.scheduler.core import Cycle

    profile = PROFILES[name]
    for variant in (profile, dataclasses.replace(profile, quotas=not profile.quotas)):
        cycle = Cycle(Scheduler(variant), s, 1000.0, random.Random(0))
        cycle.borrowing = borrowing
        known = cycle.known
        assert known.plain == (variant.quotas and variant.preemption not in ("none", "las"))
        if not known.plain:
            continue
        for j in cycle.waiting:
            info = cycle.infos(j)
            assert known.fail_key(j, info) == info.rank_id
            assert known.search_key(j, info) == info.search_id
            assert known.admit_key(j, info) == 2 * info.admit_id + borrowing


@st.composite
def crowded_capped(draw: st.DrawFn) -> Snapshot:
    """`crowded_many_users` with per-user GPU caps on the groups: a preemption search then reads
    the user's GPUs, with their own victims released (KnownOutcomes.search_key holds the user)."""
    s = draw(crowded_many_users())
    caps = [draw(st.sampled_from([None, 1, 2, 4, 8])) for _ in s.groups]
    groups = tuple(dataclasses.replace(g, user_max_gpus=cap) for g, cap in zip(s.groups, caps, strict=True))
    users = ("x", "y", "z", "w")
    run = tuple(  # the running work spread over the same users: some victims are the user's own
        dataclasses.replace(r, job=dataclasses.replace(r.job, user=draw(st.sampled_from(users))))
        for r in s.running
    )
    return dataclasses.replace(s, groups=groups, running=run)


@settings(max_examples=60, deadline=None)
@given(crowded_capped(), st.sampled_from(["default", "las"]), st.integers(1, 16))
def test_replayed_outcomes_under_per_user_caps(s: Snapshot, name: str, attempts: int) -> None:
    # quotas on for las too: without them no search reads a cap
    profile = dataclasses.replace(PROFILES[name], max_preemption_attempts=attempts, quotas=True)
    fresh = fresh_plan(s, profile)
    first, second = twice(s, profile)
    assert_same(first, fresh)
    assert_same(second, fresh)


def counted_searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the jobs whose preemption search ran (spent an attempt), in order."""
    from corral.scheduler.preemption import Preemptor

    real = Preemptor.try_for
    searches: list[str] = []

    def counting(self: Preemptor, j: Job, *args: object, **kwargs: object) -> object:
        before = self.attempts_left
        room = real(self, j, *args, **kwargs)  # type: ignore[arg-type]
        if self.attempts_left < before:
            searches.append(j.id)
        return room

    monkeypatch.setattr(Preemptor, "try_for", counting)
    return searches


@pytest.mark.pure_scheduler  # it counts searches by wrapping Preemptor.try_for (conftest.py)
@pytest.mark.parametrize("name", ["default", "las"])
def test_a_capped_groups_failed_search_is_replayed_per_user(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group a caps each user at 4 GPUs. Its node is full: 5 GPUs of work that may not be
    preempted (3 of user y, 2 of user w) and 3 of low-priority work. User x, holding nothing,
    queues five 4-GPU jobs: its cap admits each, the free GPUs do not, and each search finds 3
    GPUs where 4 are needed. The first search in a state is real (x0's, and x1's after x0's
    reservation where the profile backfills); x's other jobs are answered from the cache (the key
    holds the user: the cap's admission read them). User w's two jobs of the same kind are
    held by w's cap (2 + 4 > 4): they keep the cap's reason, and each has its own search (the
    held path caches nothing); a key without the user would replay x's failure for them
    (insufficient_gpus with a time, where a fresh search says user_cap)."""
    searches = counted_searches(monkeypatch)
    capped = group("a", guaranteed={ANY_MODEL: 8}, user_max_gpus=4)
    pin = job("pin", gpus=3, group="a", user="y", preemptible=False, runtime=9000.0)
    wpin = job("wpin", gpus=2, group="a", user="w", preemptible=False, runtime=9000.0)
    run = [running(pin, "n0", (0, 1, 2)), running(wpin, "n0", (3, 4))]
    for g in range(5, 8):
        low = job(f"low{g}", group="a", user="v", priority=Priority.LOW, runtime=9000.0, attained=50000.0)
        run.append(running(low, "n0", (g,), start=float(g)))
    queued = [
        job(f"x{k}", gpus=4, group="a", user="x", priority=Priority.HIGH, submit=float(k)) for k in range(5)
    ]
    queued += [
        job(f"w{k}", gpus=4, group="a", user="w", priority=Priority.HIGH, submit=10.0 + k) for k in range(2)
    ]
    s = Snapshot((gpu_node("n0"),), (capped,), tuple(queued), tuple(run), Usage())
    # (las has no quotas: no cap either); attempts enough for every search
    profile = dataclasses.replace(PROFILES[name], quotas=True, max_preemption_attempts=16)
    fresh = fresh_plan(s, profile)
    assert sorted(searches) == ["w0", "w1", "x0", "x1", "x2", "x3", "x4"]  # every job searched
    assert {fresh.diagnoses[f"w{k}"].reasons[0].code for k in range(2)} == {"user_cap"}
    assert fresh.diagnoses["x1"].reasons[0].code == "insufficient_gpus"
    searches.clear()
    plan = Scheduler(profile).schedule(s, 1000.0, random.Random(0))
    assert_same(plan, fresh)
    assert plan.preemptions == ()
    # x0 opens the backfill reservation (a new state: nothing recorded), x1 searches in the state
    # that follows; the rest of x's jobs get the cached failed search
    real = ["x0", "x1"] if profile.backfill else ["x0"]
    assert sorted(searches) == ["w0", "w1", *real]


@pytest.mark.pure_scheduler  # it counts searches by wrapping Preemptor.try_for (conftest.py)
@pytest.mark.parametrize("name", ["default", "las"])
def test_jobs_their_user_cap_holds_search_afresh_each(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Group a caps each user at 4 GPUs. User x holds 2 GPUs that may not be preempted and queues
    five 4-GPU jobs: its cap holds each (quota comes before the free GPUs), and each still looks
    for victims whose end would admit it (the search checks the cap with them gone; user y's
    low-priority work is not x's, so it fails). Nothing of the held path is cached: every x job
    searches, and keeps the cap's reason. User z's job of the same kind passes its cap, searches
    and preempts: no failure of x's is replayed for it."""
    searches = counted_searches(monkeypatch)
    capped = group("a", guaranteed={ANY_MODEL: 8}, user_max_gpus=4)
    held = job("held", gpus=2, group="a", user="x", preemptible=False, runtime=9000.0)
    run = [running(held, "n0", (0, 1))]
    for g in range(2, 8):
        low = job(f"low{g}", group="a", user="y", priority=Priority.LOW, runtime=9000.0, attained=50000.0)
        run.append(running(low, "n0", (g,), start=float(g)))
    queued = [
        job(f"x{k}", gpus=4, group="a", user="x", priority=Priority.HIGH, submit=float(k)) for k in range(5)
    ]
    queued.append(job("z", gpus=4, group="a", user="z", priority=Priority.HIGH, submit=9.0))
    s = Snapshot((gpu_node("n0"),), (capped,), tuple(queued), tuple(run), Usage())
    profile = dataclasses.replace(PROFILES[name], quotas=True, max_preemption_attempts=16)
    fresh = fresh_plan(s, profile)
    assert len(searches) == 6  # every job searched
    assert {fresh.diagnoses[f"x{k}"].reasons[0].code for k in range(5)} == {"user_cap"}
    searches.clear()
    plan = Scheduler(profile).schedule(s, 1000.0, random.Random(0))
    assert_same(plan, fresh)
    assert {p.for_job for p in plan.preemptions} == {"z"}
    assert sorted(searches) == ["x0", "x1", "x2", "x3", "x4", "z"]  # the held path caches nothing


def test_a_job_held_in_the_borrowing_pass_is_no_deferral() -> None:
    """Group b (guarantee 7, maximum 12) holds 5 GPUs and starts two 1-GPU jobs (7). Its three
    8-GPU jobs need borrowed quota: the first pass sends them to the borrowing pass, where its
    maximum holds each (quota_max, no time). The deferred list still holds the first pass's
    deferrals there: the last of them, held in the borrowing pass, was taken for a job just
    deferred (no preemption turn, and a 'deferred' outcome recorded for the borrowing pass that
    the next 8-GPU job replayed: insufficient_gpus with an estimated start)."""
    nodes = tuple(gpu_node(f"n{i}", gpus=4) for i in range(4))
    groups = (
        group("a", guaranteed={ANY_MODEL: 0}, borrowing=False),
        group("b", guaranteed={ANY_MODEL: 7}, max={ANY_MODEL: 12}),
    )
    a_work = [
        ("n0", (0,)),
        ("n0", (1,)),
        ("n1", (0,)),
        ("n1", (1,)),
        ("n1", (2,)),
        ("n1", (3,)),
        ("n2", (2, 3)),
    ]
    run = [
        running(
            job(f"ra{k}", gpus=len(g), group="a", priority=Priority.LOW, preemptible=False, runtime=None),
            n,
            g,
        )
        for k, (n, g) in enumerate(a_work)
    ]
    b_work = [("n3", (0, 1)), ("n3", (2, 3)), ("n0", (2,))]
    run += [
        running(
            job(f"rb{k}", gpus=len(g), group="b", priority=Priority.LOW, preemptible=False, runtime=None),
            n,
            g,
        )
        for k, (n, g) in enumerate(b_work)
    ]
    queued = [job("small0", group="b", submit=1.0), job("small1", group="b", submit=1001.0)]
    queued += [
        job(f"big{k}", gpus=4, instances=2, group="b", submit=3.0 + k, runtime=r)
        for k, r in enumerate([None, 10.0, 10.0])
    ]
    s = Snapshot(nodes, groups, tuple(queued), tuple(run), Usage(by_group={"a": 0.0, "b": 500.0}))
    profile = dataclasses.replace(PROFILES["default"], max_preemption_attempts=1)
    fresh = fresh_plan(s, profile)
    assert sorted(a.job_id for a in fresh.assignments) == ["small0", "small1"]
    assert {fresh.diagnoses[f"big{k}"].reasons[0].code for k in range(3)} == {"quota_max"}
    first, second = twice(s, profile)
    assert_same(first, fresh)
    assert_same(second, fresh)
