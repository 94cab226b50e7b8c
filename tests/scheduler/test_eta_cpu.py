"""Estimated starts of jobs that wait for CPUs or memory, not GPUs: never "now" while no node that
could take them has the CPUs and memory free; the time running work on such a node is expected to
give them back (eta_cpu.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import PROFILES, Snapshot
from corral.scheduler.apply import estimated_starts
from corral.scheduler.cluster import ClusterMemo, ClusterState
from corral.scheduler.eta_cpu import CpuMemoryFloors
from corral.scheduler.types import NodeState, Resources
from tests.scheduler.builders import cpu_node, gpu_node, group, job, plan_for, running, snap

DEFAULT = PROFILES["default"]


def test_a_cpu_job_behind_a_cpu_hungry_running_job_starts_when_that_job_is_expected_to_end() -> None:
    """The reported walk: one node, all its CPUs held by a running job estimated at 1000 s that
    has run 100 s; a 0-GPU job needing 4 CPUs waits. It was told "now"."""
    hog = running(job("hog", gpus=0, cpus=32, runtime=1000.0), "c", (), start=0.0)
    s = snap([cpu_node("c", cpus=32)], [job("nb", gpus=0, cpus=4)], [group("g")], run=[hog])
    d = plan_for(s, DEFAULT, now=100.0).diagnoses["nb"]
    assert [r.code for r in d.reasons] == ["insufficient_cpu_memory"]
    assert d.estimated_start == 1000.0  # the hog's estimated end, not now (100.0)


def test_a_gpu_job_whose_node_has_free_gpus_but_no_cpus_waits_for_the_cpus() -> None:
    hog = running(job("hog", gpus=1, cpus=64, runtime=600.0), "n", (0,), start=0.0)
    s = snap([gpu_node("n", gpus=8, cpus=64)], [job("w", gpus=1, cpus=8)], [group("g")], run=[hog])
    d = plan_for(s, DEFAULT, now=100.0).diagnoses["w"]
    assert [r.code for r in d.reasons] == ["insufficient_cpu_memory"]
    assert d.estimated_start == 600.0


def test_memory_binds_as_cpus_do() -> None:
    hog = running(job("hog", gpus=0, cpus=1, memory_mib=128 * 1024, runtime=800.0), "c", (), start=0.0)
    s = snap([cpu_node("c", cpus=32)], [job("nb", gpus=0, cpus=1, memory_mib=4096)], [group("g")], run=[hog])
    d = plan_for(s, DEFAULT, now=100.0).diagnoses["nb"]
    assert d.estimated_start == 800.0


def test_the_earliest_node_that_frees_enough_wins_and_too_little_freed_does_not_count() -> None:
    """Node a frees 2 CPUs at 300 s (too few for 4) and the rest at 2000 s; node b frees all at
    900 s: the job's start is 900 s."""
    run = [
        running(job("a1", gpus=0, cpus=2, runtime=300.0), "a", (), start=0.0),
        running(job("a2", gpus=0, cpus=30, runtime=2000.0), "a", (), start=0.0),
        running(job("b1", gpus=0, cpus=32, runtime=900.0), "b", (), start=0.0),
    ]
    nodes = [cpu_node("a", cpus=32), cpu_node("b", cpus=32)]
    s = snap(nodes, [job("nb", gpus=0, cpus=4)], [group("g")], run=run)
    assert plan_for(s, DEFAULT, now=100.0).diagnoses["nb"].estimated_start == 900.0


def test_a_job_that_fits_now_keeps_its_estimate() -> None:
    hog = running(job("hog", gpus=0, cpus=16, runtime=1000.0), "c", (), start=0.0)
    s = snap([cpu_node("c", cpus=32)], [job("nb", gpus=0, cpus=4)], [group("g")], run=[hog])
    plan = plan_for(s, DEFAULT, now=100.0)
    assert [a.job_id for a in plan.assignments] == ["nb"]  # it starts, nothing to diagnose


@st.composite
def cpu_bound(draw: st.DrawFn) -> tuple[Snapshot, dict[str, list[tuple[float, float]]]]:
    """CPU nodes with running CPU-only work and CPU-only jobs waiting; per node, its running
    work's (end, CPUs) with ends as the roll computes them (no spread: start + estimate)."""
    nodes = [
        cpu_node(f"c{i}", cpus=draw(st.sampled_from([4, 8, 16]))) for i in range(draw(st.integers(1, 3)))
    ]
    run, ends = [], {}
    for k in range(draw(st.integers(0, 6))):
        node = draw(st.sampled_from(nodes))
        cpus = float(draw(st.integers(1, int(node.cpus))))
        runtime = float(draw(st.sampled_from([200, 500, 1500, 4000])))
        start = float(draw(st.integers(0, 900)))
        run.append(running(job(f"r{k}", gpus=0, cpus=cpus, runtime=runtime), node.name, (), start=start))
        ends.setdefault(node.name, []).append((max(NOW, start + runtime), cpus))
    queued = [
        job(f"w{k}", gpus=0, cpus=draw(st.integers(1, 16)), submit=k) for k in range(draw(st.integers(1, 5)))
    ]
    return snap(nodes, queued, [group("g")], run=run), ends


NOW = 1000.0


@given(cpu_bound())
@settings(max_examples=150, deadline=None)
def test_no_cpu_job_is_expected_before_a_node_could_have_its_cpus_free(
    case: tuple[Snapshot, dict[str, list[tuple[float, float]]]],
) -> None:
    """Counted from the running work alone (an over-subscribed node: the over-committed CPUs come
    back first): no waiting job's estimate is earlier than the first time some node has its CPUs
    free, however the jobs ahead of it and the ones started this cycle take theirs."""
    s, ends = case
    plan = plan_for(s, DEFAULT, now=NOW)
    for job_id, d in plan.diagnoses.items():
        need = next(j for j in s.queued if j.id == job_id).tasks[0].resources.cpus
        free_by = []
        for node in s.nodes:
            held = sorted(ends.get(node.name, []))
            times = [NOW] + [end for end, _ in held]
            fits = [t for t in times if node.cpus - sum(c for end, c in held if end > t) >= need]
            if fits:
                free_by.append(min(fits))
        if d.estimated_start is None:
            continue
        assert free_by, f"{job_id} needs {need} CPUs, no node ever has them, yet it got a time"
        assert d.estimated_start >= min(free_by)


@given(cpu_bound(), st.data())
@settings(max_examples=100, deadline=None)
def test_targeted_estimates_of_cpu_bound_jobs_equal_the_full_roll(
    case: tuple[Snapshot, dict[str, list[tuple[float, float]]]], data: st.DataObject
) -> None:
    """A targeted roll (the simulator's read of its new jobs) raises only its targets to their CPU
    and memory floors: each still gets exactly the estimate the full diagnoses give it."""
    s, _ = case
    ids = [j.id for j in s.queued]
    wanted = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
    got = estimated_starts(plan_for(s, DEFAULT, now=NOW).diagnoses, wanted)
    full = plan_for(s, DEFAULT, now=NOW).diagnoses
    assert got == {j: full[j].estimated_start if j in full else None for j in wanted}


@st.composite
def requests(draw: st.DrawFn) -> Resources:
    return Resources(
        gpus=draw(st.integers(0, 4)),
        gpu_model=draw(st.sampled_from([None, "A100", "V100", "A100|V100", "H100"])),
        cpus=float(draw(st.sampled_from([1, 4, 16, 48, 64]))),
        memory_mib=draw(st.sampled_from([1024, 64 * 1024, 256 * 1024, 600 * 1024])),
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["A100", "V100", None]),
            st.sampled_from([16, 64]),
            st.sampled_from([128 * 1024, 512 * 1024]),
            st.sampled_from([NodeState.READY, NodeState.DOWN]),
        ),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.tuples(requests(), st.booleans()), min_size=1, max_size=12),
)
@settings(max_examples=150, deadline=None)
def test_candidate_nodes_kept_with_the_node_table_equal_a_fresh_search(
    shapes: list[tuple[str | None, int, int, NodeState]], asked: list[tuple[Resources, bool]]
) -> None:
    """The nodes that could ever take a request are kept on the node table (shared by the cycles of
    one nodes tuple) per request shape and profile flag: each answer equals a search over a fresh
    table, whichever requests came before (a key missing one field gives another shape's nodes)."""
    nodes = tuple(
        cpu_node(f"n{i}", cpus=cpus, memory_mib=mem, state=state)
        if model is None
        else gpu_node(f"n{i}", gpus=4, model=model, cpus=cpus, memory_mib=mem, state=state)
        for i, (model, cpus, mem, state) in enumerate(shapes)
    )
    memo = ClusterMemo()
    for r, cpu_on_gpu in asked:
        kept = CpuMemoryFloors(ClusterState(nodes, memo), cpu_on_gpu, NOW, list)._candidates(r)
        fresh = CpuMemoryFloors(ClusterState(nodes), cpu_on_gpu, NOW, list)._find_candidates(r)
        assert list(kept) == fresh
