"""Diagnosis: coded reasons with their source, queue positions, estimated starts, bad input."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import PROFILES, Scheduler, Snapshot, check_fits_anywhere
from corral.scheduler.apply import estimated_starts
from corral.scheduler.eta import LIMIT_STOP_S, remaining_s
from corral.scheduler.types import Usage
from tests.scheduler.builders import gpu_node, group, job, plan_for, running, snap
from tests.scheduler.strategies import snapshots

FIFO_BF = PROFILES["fifo-backfill"]


def test_fragmented_reason_names_largest_block() -> None:
    nodes = [gpu_node("a", gpus=8), gpu_node("b", gpus=8)]
    run = [running(job("x", gpus=4), "a", (0, 1, 2, 3)), running(job("y", gpus=4), "b", (0, 1, 2, 3))]
    plan = plan_for(snap(nodes, [job("w", gpus=8)], run=run), FIFO_BF)
    (reason,) = plan.diagnoses["w"].reasons
    assert reason.code == "gpu_fragmented"
    assert reason.source == "filter:gpu_free"
    assert "needs 8 A100 GPUs on one node; largest free block is 4" in reason.message


def test_every_waiting_job_gets_a_diagnosis_with_its_place_in_the_schedulers_order() -> None:
    queued = [job(f"a{i}", group="a", submit=i, gpus=8) for i in range(3)] + [job("b0", group="b", gpus=8)]
    plan = plan_for(snap([gpu_node("n", gpus=4)], queued, [group("a"), group("b")]), PROFILES["default"])
    assert set(plan.diagnoses) == {"a0", "a1", "a2", "b0"}
    # equal shares: group a (first by name) is taken first, and stays first while nothing is placed
    assert [plan.diagnoses[j].queue_position for j in ("a0", "a1", "a2", "b0")] == [1, 2, 3, 4]
    assert all(d.unschedulable for d in plan.diagnoses.values())


def test_queue_position_follows_fair_share_not_the_group_order() -> None:
    """Group a has used the cluster a lot, group b not at all: b's later job is taken first, and
    the position (and the estimate) say so, as the start order will."""
    run = [running(job("r", runtime=1000.0), "n", (0, 1), start=0.0)]
    queued = [job(f"a{i}", group="a", submit=i, gpus=2) for i in range(2)]
    queued.append(job("b0", group="b", submit=5, gpus=2))
    usage = Usage(by_group={"a": 1e9}, by_user={("a", "u"): 1e9})
    s = snap([gpu_node("n", gpus=2)], queued, [group("a"), group("b")], run=run, usage=usage)
    d = plan_for(s, PROFILES["default"], now=10.0).diagnoses
    assert [d[j].queue_position for j in ("b0", "a0", "a1")] == [1, 2, 3]
    eta = {j: d[j].estimated_start for j in ("b0", "a0", "a1")}
    assert eta["b0"] is not None and eta["a0"] is not None and eta["a1"] is not None
    assert eta["b0"] < eta["a0"] < eta["a1"]


def test_a_job_held_by_its_user_cap_says_so_and_gets_no_time() -> None:
    run = [running(job("r", runtime=500.0, user="ann"), "n", (0, 1), start=0.0)]
    queued = [job("q", gpus=2, user="ann")]
    s = snap([gpu_node("n", gpus=8)], queued, [group("g", user_max_gpus=2)], run=run)
    plan = plan_for(s, PROFILES["default"], now=10.0)
    d = plan.diagnoses["q"]
    assert d.estimated_start is None and d.start_range is None and not d.unschedulable
    (reason,) = d.reasons
    assert reason.code == "user_cap"
    assert "waits for the per-user cap: ann may hold 2 GPUs in group g and holds 2; this job needs 2" in (
        reason.message
    )
    assert estimated_starts(plan.diagnoses, ["q"]) == {"q": None}  # what the simulator reads


def test_a_job_held_by_its_groups_storage_quota_gets_no_time() -> None:
    """A job of a group over its storage quota waits whatever GPUs are free, until the group frees
    storage, which nothing here can foresee: like a job held by its GPU quota or user cap, a reason
    and no estimated start (it was told it would start now, the GPUs being free)."""
    over = replace(group("g"), storage_over="group g holds 2.0 KiB of storage, over its quota of 1.0 KiB")
    plan = plan_for(snap([gpu_node("n", gpus=8)], [job("q", gpus=2)], [over]), PROFILES["default"], now=10.0)
    d = plan.diagnoses["q"]
    assert (d.estimated_start, d.start_range, d.unschedulable) == (None, None, False)
    (reason,) = d.reasons
    assert reason.code == "storage_quota" and "over its quota of 1.0 KiB" in reason.message
    assert estimated_starts(plan.diagnoses, ["q"]) == {"q": None}  # what the simulator reads


def test_a_job_held_by_its_groups_quota_says_how_much_is_free() -> None:
    run = [running(job("r", gpus=4, runtime=500.0, preemptible=False), "n", (0, 1, 2, 3), start=0.0)]
    queued = [job("q", gpus=8, preemptible=False)]
    s = snap([gpu_node("n", gpus=16)], queued, [group("g", guaranteed={"*": 8})], run=run)
    d = plan_for(s, PROFILES["default"], now=10.0).diagnoses["q"]
    assert d.estimated_start is None
    (reason,) = d.reasons
    assert reason.code == "quota_exhausted"
    assert "waits for group g's guaranteed quota: needs 8 GPUs, 4 free in its quota" in reason.message
    assert "not preemptible" in reason.message


def test_backfill_roll_does_not_make_every_later_job_wait_for_a_large_one() -> None:
    """A job that waits long for its A100s does not hold back the V100 job behind it, whose GPUs
    come back soon (the earlier pooled walk made every later job at least as late as it)."""
    run = [
        running(job("ra", gpus=4, model="A100", runtime=1000.0), "a", (0, 1, 2, 3), start=0.0),
        running(job("rv", gpus=4, model="V100", runtime=50.0), "v", (0, 1, 2, 3), start=0.0),
    ]
    queued = [job("big", gpus=4, model="A100", submit=0), job("small", gpus=4, model="V100", submit=1)]
    nodes = [gpu_node("a", gpus=4, model="A100"), gpu_node("v", gpus=4, model="V100")]
    d = plan_for(snap(nodes, queued, run=run), FIFO_BF, now=10.0).diagnoses
    assert (d["big"].estimated_start, d["small"].estimated_start) == (1000.0, 50.0)
    pooled = replace(FIFO_BF, eta_roll="pooled")
    d = plan_for(snap(nodes, queued, run=run), pooled, now=10.0).diagnoses
    assert (d["big"].estimated_start, d["small"].estimated_start) == (1000.0, 1000.0)
    # strict FIFO: nothing passes the head job, so nothing is expected to start before it
    d = plan_for(snap(nodes, queued, run=run), PROFILES["fifo"], now=10.0).diagnoses
    assert (d["big"].estimated_start, d["small"].estimated_start) == (1000.0, 1000.0)


def test_estimate_range_comes_from_the_runtime_spread() -> None:
    spread_job = replace(job("r", gpus=1, runtime=1000.0), runtime_spread=(500.0, 2000.0))
    run = [running(spread_job, "n", (0,), start=0.0)]
    s = snap([gpu_node("n", gpus=1)], [job("q", runtime=100.0)], run=run)
    d = plan_for(s, PROFILES["fifo"], now=10.0).diagnoses["q"]
    assert d.estimated_start is not None and d.start_range is not None
    early, late = d.start_range
    assert early < d.estimated_start < late


def test_remaining_time_of_an_overdue_job_grows_with_what_it_ran() -> None:
    spread = (600.0, 2400.0)
    assert remaining_s(1200.0, spread, 0.0) == 1200.0
    assert remaining_s(1200.0, None, 5000.0) == 0.0  # no spread, a point guess: the old rule, ends now
    assert remaining_s(1200.0, None, 5000.0, is_limit=True) == LIMIT_STOP_S  # its limit: being stopped
    assert remaining_s(1200.0, None, 200.0, is_limit=True) == 1000.0  # before it: stopped there
    assert remaining_s(0.0, (0.0, 0.0), 5000.0) == 5000.0  # runs of 0 s: as long again
    assert remaining_s(0.0, None, 5000.0) == 5000.0
    assert remaining_s(0.0, (0.0, 0.0), 0.0) == 0.0  # not started yet: its runs' 0 s
    overdue = [remaining_s(1200.0, spread, t) for t in (2400.0, 4800.0, 9600.0)]
    assert 0 < overdue[0] < overdue[1] < overdue[2]


def test_estimated_start_rolls_forward_running_and_queued_work() -> None:
    nodes = [gpu_node("n", gpus=2)]
    run = [
        running(job("r1", runtime=100.0), "n", (0,), start=0.0),  # ends 100
        running(job("r2", runtime=300.0), "n", (1,), start=0.0),  # ends 300
    ]
    queued = [
        job("q1", submit=0, runtime=500.0),
        job("q2", submit=1, runtime=50.0),
        job("q3", gpus=2, submit=2),
    ]
    plan = plan_for(snap(nodes, queued, run=run), PROFILES["fifo"], now=10.0)
    eta = {k: d.estimated_start for k, d in plan.diagnoses.items()}
    assert eta == {"q1": 100.0, "q2": 300.0, "q3": 600.0}


def test_jobs_without_estimate_use_profile_default() -> None:
    nodes = [gpu_node("n", gpus=1)]
    run = [running(job("r", runtime=None), "n", (0,), start=0.0)]
    plan = plan_for(snap(nodes, [job("q")], run=run), PROFILES["fifo"], now=10.0)
    assert plan.diagnoses["q"].estimated_start == PROFILES["fifo"].default_runtime_s


def test_unknown_model_and_too_large_instance_are_unschedulable() -> None:
    nodes = [gpu_node("n", gpus=8, model="A100")]
    bad_model = job("h100", model="H100")
    too_big = job("sixteen", gpus=16)
    plan = plan_for(snap(nodes, [bad_model, too_big]), FIFO_BF)
    for jid, code in (("h100", "unknown_gpu_model"), ("sixteen", "instance_too_large")):
        d = plan.diagnoses[jid]
        assert d.unschedulable and d.reasons[0].code == code and d.estimated_start is None
    assert check_fits_anywhere(bad_model, nodes)[0].code == "unknown_gpu_model"
    (reason,) = check_fits_anywhere(too_big, nodes)
    assert "largest node has 8" in reason.message
    assert check_fits_anywhere(job("ok", gpus=8), nodes) == ()


def test_unschedulable_job_does_not_block_fifo() -> None:
    nodes = [gpu_node("n", gpus=8)]
    plan = plan_for(snap(nodes, [job("huge", gpus=16, submit=0), job("fine", submit=1)]), PROFILES["fifo"])
    assert [a.job_id for a in plan.assignments] == ["fine"]


def test_cpu_job_and_gang_size_checked_against_cluster() -> None:
    from tests.scheduler.builders import cpu_node

    nodes = [gpu_node("n", gpus=8), cpu_node("c", cpus=4)]
    (reason,) = check_fits_anywhere(job("wide", gpus=0, cpus=16), nodes)
    assert reason.code == "instance_too_large"
    (reason,) = check_fits_anywhere(job("gang", gpus=8, instances=2), nodes)
    assert reason.code == "cluster_too_small"


def test_a_job_past_its_time_limit_is_expected_to_end_once_stopped() -> None:
    """An estimate that is the job's own limit (max_runtime, no history): the platform stops the
    job there, so past it the job is expected gone after the stop (LIMIT_STOP_S), not "now"."""
    assert LIMIT_STOP_S == 30.0
    limited = replace(job("r", runtime=100.0), runtime_is_limit=True)
    etas = []
    for now in (5.0, 90.0, 500.0):
        run = [running(limited, "n", (0,), start=0.0)]
        plan = plan_for(snap([gpu_node("n", gpus=1)], [job("q")], run=run), PROFILES["fifo"], now=now)
        etas.append(plan.diagnoses["q"].estimated_start)
    assert etas == [100.0, 120.0, 530.0]  # its limit; within the stop's 30 s of it; past it


def test_overdue_running_job_is_expected_to_end_now() -> None:
    """A point guess without a spread (here the job's own estimate; also a default): the old rule
    (the tail rule for it was measured and not kept: docs/simulator.md "Round 5")."""
    run = [running(job("r", runtime=10.0), "n", (0,), start=0.0)]
    plan = plan_for(snap([gpu_node("n", gpus=1)], [job("q")], run=run), PROFILES["fifo"], now=500.0)
    assert plan.diagnoses["q"].estimated_start == 500.0


def test_a_job_running_past_its_kinds_zero_second_runs_does_not_make_the_next_start_now() -> None:
    """The demo's `sleep 600` behind a name whose runs all ended at once (estimate 0 s): the job
    waiting for its GPU was told "now" at every cycle while it ran. A job that has run past every
    run of its kind is expected to run about as long again: the ETA lies ahead and moves forward
    with time."""
    zero = replace(job("r", runtime=0.0), runtime_spread=(0.0, 0.0))
    etas = []
    for now in (300.0, 600.0):
        run = [running(zero, "n", (0,), start=0.0)]
        plan = plan_for(snap([gpu_node("n", gpus=1)], [job("q")], run=run), PROFILES["default"], now=now)
        etas.append(plan.diagnoses["q"].estimated_start)
    assert etas == [600.0, 1200.0]  # now + what it has run


def test_eta_limit_bounds_estimates() -> None:
    import dataclasses

    queued = [job(f"q{i}", submit=float(i)) for i in range(5)]
    run = [running(job("r"), "n", (0,))]
    profile = dataclasses.replace(PROFILES["fifo-backfill"], eta_limit=2)
    plan = plan_for(snap([gpu_node("n", gpus=1)], queued, run=run), profile)
    etas = [plan.diagnoses[f"q{i}"].estimated_start for i in range(5)]
    assert etas[:2] == [1000.0, 1100.0] and etas[2:] == [None, None, None]  # r is overdue: ends now


def test_backfill_depth_reason_for_untried_jobs() -> None:
    import dataclasses

    queued = [job("big", gpus=2, submit=0)] + [job(f"s{i}", submit=1 + i, runtime=1e6) for i in range(4)]
    run = [running(job("r", runtime=100.0), "n", (0,))]
    profile = dataclasses.replace(PROFILES["fifo-backfill"], backfill_depth=1)
    plan = plan_for(snap([gpu_node("n", gpus=2)], queued, run=run), profile, now=10.0)
    assert plan.diagnoses["s0"].reasons[0].code == "backfill_would_delay"
    assert plan.diagnoses["s3"].reasons[0].code == "backfill_depth"


def test_cordoned_node_is_reported_as_cordoned() -> None:
    """The filters' own refusals make the reason: a node that is cordoned says so (it was reported
    as `insufficient_cpu_memory` for CPU work and `insufficient_gpus` for GPU work)."""
    from corral.scheduler import NodeState
    from tests.scheduler.builders import cpu_node

    cordoned = [cpu_node("c", state=NodeState.CORDONED), gpu_node("g", state=NodeState.CORDONED)]
    plan = plan_for(snap(cordoned, [job("cpu", gpus=0), job("gpu", gpus=1)]), FIFO_BF)
    for jid in ("cpu", "gpu"):
        (reason,) = plan.diagnoses[jid].reasons
        assert reason.code == "node_not_ready", (jid, reason)
        assert reason.source == "filter:node_state"
        assert "1 node cordoned" in reason.message, reason.message


def test_reason_comes_from_the_filter_that_refused_the_nodes_that_got_furthest() -> None:
    """One cordoned node with free GPUs and one ready node that is full: the job waits for GPUs,
    and the message counts the cordoned node too."""
    from corral.scheduler import NodeState

    nodes = [gpu_node("a", gpus=2, state=NodeState.CORDONED), gpu_node("b", gpus=2)]
    run = [running(job("x", gpus=2), "b", (0, 1))]
    plan = plan_for(snap(nodes, [job("w", gpus=1)], run=run), FIFO_BF)
    (reason,) = plan.diagnoses["w"].reasons
    assert reason.code == "insufficient_gpus"
    assert "needs 1 A100 GPU; 0 are free now" in reason.message
    assert "1 node cordoned" in reason.message


def test_gpus_free_but_cpus_taken_says_cpu_memory() -> None:
    """A node with free GPUs but no free CPUs: the cpu_memory filter refused it, so the reason
    is `insufficient_cpu_memory` (not a gang `no_fit`)."""
    nodes = [gpu_node("a", gpus=2, cpus=4)]
    run = [running(job("x", gpus=1, cpus=4), "a", (0,))]
    plan = plan_for(snap(nodes, [job("w", gpus=1, cpus=2)], run=run), FIFO_BF)
    (reason,) = plan.diagnoses["w"].reasons
    assert reason.code == "insufficient_cpu_memory"
    assert reason.source == "filter:cpu_memory"


@settings(max_examples=60, deadline=None)
@given(snapshots(), st.sampled_from(sorted(PROFILES)), st.data())
def test_targeted_estimates_equal_the_full_roll(s: Snapshot, name: str, data: st.DataObject) -> None:
    """Rolling forward only as far as a few jobs (what the simulator asks for its arrivals) gives
    them exactly the estimates of the full diagnoses."""
    ids = [j.id for j in s.queued]
    wanted = data.draw(st.lists(st.sampled_from(ids), max_size=4, unique=True)) if ids else []
    rng = random.Random(0)
    partial = Scheduler(PROFILES[name]).schedule(s, 100.0, rng)
    got = estimated_starts(partial.diagnoses, wanted)
    full = Scheduler(PROFILES[name]).schedule(s, 100.0, random.Random(0)).diagnoses
    assert got == {j: full[j].estimated_start if j in full else None for j in wanted}
    # the partial roll leaves the lazy diagnoses whole: every later read agrees with a fresh plan
    assert {k: d.estimated_start for k, d in partial.diagnoses.items()} == {
        k: d.estimated_start for k, d in full.items()
    }
