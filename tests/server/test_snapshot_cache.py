"""The schedule loop keeps the cluster's shape (nodes, GPUs, groups, quotas, users) between cycles
and checks one digest of those tables each cycle (snapshot.cached_shape): every write to them, by
any writer (an operator's route, the node loop, another server, a bare UPDATE), must reach the
next cycle; an unchanged cluster must cost one statement, not five. SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from corral.db.models import Gpu, Group, GroupQuota, Job, Node, User
from corral.db.session import make_engine
from corral.scheduler.types import Assignment, NodeState
from corral.server import scheduling
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.scheduling import place_assignments, schedule_tick
from corral.server.snapshot import ShapeCache, cached_shape, read_cluster_state, read_shape
from corral.services import nodes as node_service
from corral.services.lifecycle import JobState
from tests.pg import sqlite_or_postgres_url
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant
from tests.server.test_snapshot_queries import selects


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres_url(request, tmp_path, "db.sqlite")


def two_nodes(db_url: str, tmp_path: Path) -> tuple[ServerContext, FakeEngine]:
    fake = FakeEngine([gpu_node("n0", address="10.0.0.1"), gpu_node("n1", address="10.0.0.2")])
    ctx = make_context(make_engine(db_url), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        seed_tenant(session, guaranteed=8)
    return ctx, fake


def _cordon(session: Session) -> None:
    node_service.set_admin_state(session, "n0", "cordon")


def _drain(session: Session) -> None:
    node_service.set_admin_state(session, "n1", "drain")


def _quarantine(session: Session) -> None:
    node_service.set_gpu_health(session, "n0", 2, "quarantine")


def _bare_update_node_down(session: Session) -> None:  # no ORM event, no service: a plain UPDATE
    session.execute(update(Node).where(Node.name == "n1").values(state="down"))


def _gpu_lost(session: Session) -> None:
    session.execute(update(Gpu).where(Gpu.node_name == "n1", Gpu.index == 3).values(health="lost"))


def _quota(session: Session) -> None:
    session.execute(update(GroupQuota).values(guaranteed=2))


def _group_weight(session: Session) -> None:
    session.execute(update(Group).values(weight=3.0))


def _group_cap(session: Session) -> None:
    session.execute(update(Group).values(user_max_gpus=1))


def _new_user(session: Session) -> None:
    session.add(User(name="newcomer", is_admin=False, created_at=time.time(), active=True))


def _node_labels(session: Session) -> None:
    session.execute(update(Node).where(Node.name == "n0").values(labels={"rack": "b"}))


def _gpu_model(session: Session) -> None:
    session.execute(update(Gpu).where(Gpu.node_name == "n0", Gpu.index == 1).values(model="H100"))


def _node_cpus(session: Session) -> None:
    session.execute(update(Node).where(Node.name == "n1").values(cpus=8))


def _group_borrowing(session: Session) -> None:
    session.execute(update(Group).values(borrowing=False))


def _quota_max(session: Session) -> None:
    session.execute(update(GroupQuota).values(max=3))


def _user_renamed(session: Session) -> None:
    session.execute(update(User).where(User.name == "newcomer").values(name="renamed"))


CHANGES: dict[str, Callable[[Session], None]] = {
    "cordon": _cordon,
    "drain": _drain,
    "gpu quarantined": _quarantine,
    "node down by a bare UPDATE": _bare_update_node_down,
    "gpu lost": _gpu_lost,
    "quota": _quota,
    "group weight": _group_weight,
    "per-user cap": _group_cap,
    "new user": _new_user,
    "node labels": _node_labels,
    "gpu model": _gpu_model,
    "node cpus": _node_cpus,
    "group borrowing": _group_borrowing,
    "quota max": _quota_max,
    "user renamed": _user_renamed,
}


def test_every_write_to_the_shape_reaches_the_next_cycle(db_url: str, tmp_path: Path) -> None:
    """After each change (committed through its own session, as another request or server would)
    the cached read equals a full read and differs from the one before: a cache that missed the
    change would return the old shape."""
    ctx, _ = two_nodes(db_url, tmp_path)
    cache = ShapeCache()
    with ctx.session_factory() as session:
        before = cached_shape(session, cache)
        assert cached_shape(session, cache) is before and cache.hits == 1  # unchanged: kept
    for name, change in CHANGES.items():
        with ctx.session_factory() as writer:
            change(writer)
            writer.commit()
        with ctx.session_factory() as session:
            seen = cached_shape(session, cache)
            full = read_shape(session)
        same = ("nodes", "groups", "user_names")
        assert [getattr(seen, f) for f in same] == [getattr(full, f) for f in same], name
        assert [getattr(seen, f) for f in same] != [getattr(before, f) for f in same], name
        before = seen


def test_a_gpu_the_engine_reports_unhealthy_and_a_node_added_or_shrunk_are_seen(
    db_url: str, tmp_path: Path
) -> None:
    """The node loop's own writes (engine reports): GPU health, a new node, a GPU gone."""
    ctx, fake = two_nodes(db_url, tmp_path)
    cache = ShapeCache()

    def nodes_seen() -> dict[str, tuple[tuple[int, bool], ...]]:
        with ctx.session_factory() as session:
            state = read_cluster_state(session, cache)
        return {n.name: tuple((g.index, g.healthy) for g in n.gpus) for n in state.nodes}

    assert nodes_seen()["n0"] == ((0, True), (1, True), (2, True), (3, True))
    n0 = fake.reports[0]
    sick = tuple(dataclasses.replace(g, healthy=g.index != 1) for g in n0.gpus)
    fake.reports[0] = dataclasses.replace(n0, gpus=sick)
    node_tick(ctx, time.time())
    assert nodes_seen()["n0"] == ((0, True), (1, False), (2, True), (3, True))
    fake.reports.append(gpu_node("n2", gpus=2, address="10.0.0.3"))
    fake.reports[1] = gpu_node("n1", gpus=3, address="10.0.0.2")
    node_tick(ctx, time.time())
    seen = nodes_seen()
    assert seen["n2"] == ((0, True), (1, True)) and len(seen["n1"]) == 3


def test_a_cycle_does_not_place_on_a_node_another_server_cordoned(db_url: str, tmp_path: Path) -> None:
    """Two servers on one database: the first caches the shape in a cycle, the second cordons
    both nodes; the first's next cycle leaves the new job queued."""
    ctx, fake = two_nodes(db_url, tmp_path)
    other = make_context(make_engine(db_url), fake, str(tmp_path / "other"))
    with ctx.session_factory() as session:
        gid, uid = session.scalar(select(Group.id)), session.scalar(select(User.id))
        first = add_job(session, gid, uid, gpus=4)
    schedule_tick(ctx, time.time())
    cache = ctx.memory.shape_cache
    assert cache is not None and cache.shape is not None and cache.builds == 1
    with other.session_factory() as session:
        for name in ("n0", "n1"):
            node_service.set_admin_state(session, name, "cordon")
        session.commit()
    with ctx.session_factory() as session:
        second = add_job(session, gid, uid, gpus=4)
    schedule_tick(ctx, time.time())
    with ctx.session_factory() as session:
        states = {row.id: row.state for row in session.execute(select(Job.id, Job.state))}
    assert states[first] == JobState.SCHEDULED.value
    assert states[second] == JobState.QUEUED.value
    # the cycle saw the cordon in its own snapshot (the applier would refuse it anyway)
    assert cache.builds == 2 and cache.shape is not None
    assert {n.name: n.state for n in cache.shape.nodes} == dict.fromkeys(("n0", "n1"), NodeState.CORDONED)


def test_the_apply_refuses_a_gpu_that_went_unhealthy_even_with_a_stale_shape(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Belt and braces: should a cached shape ever be stale (it is rebuilt when the digest moves),
    the plan applier re-checks each GPU's health in fresh rows and leaves the job queued."""
    ctx, _ = two_nodes(db_url, tmp_path)
    with ctx.session_factory() as session:
        healthy = read_shape(session)  # every GPU healthy: read before the quarantine
        for name in ("n0", "n1"):
            node_service.set_gpu_health(session, name, 0, "quarantine")
        session.commit()
        cache = ShapeCache()
        cached_shape(session, cache)
        assert cache.shape is not None
        # the stale shape, paired with the digest of the current rows
        cache.shape = dataclasses.replace(healthy, digest=cache.shape.digest)
        gid, uid = session.scalar(select(Group.id)), session.scalar(select(User.id))
        job = add_job(session, gid, uid, gpus=4)
    with ctx.session_factory() as session:
        assert all(g.healthy for n in read_cluster_state(session, cache).nodes for g in n.gpus)
    ctx.memory.shape_cache = cache
    applied: list[tuple[list[str], int]] = []

    def recording_place(session: Session, assignments: Sequence[Assignment], now: float) -> list[int]:
        placed = place_assignments(session, assignments, now)
        applied.append(([a.job_id for a in assignments], len(placed)))
        return placed

    monkeypatch.setattr(scheduling, "place_assignments", recording_place)
    schedule_tick(ctx, time.time())
    assert applied and applied[0] == ([str(job)], 0)  # proposed from the stale shape, refused
    with ctx.session_factory() as session:
        assert session.get(Job, job).state == JobState.QUEUED.value


def test_heartbeats_and_rewritten_rows_do_not_rebuild_the_shape(db_url: str, tmp_path: Path) -> None:
    """The node loop rewrites every node's row on each report (last_heartbeat, not in the shape),
    which on PostgreSQL moves the row: the digest orders its rows, so the shape is kept."""
    ctx, _ = two_nodes(db_url, tmp_path)
    cache = ShapeCache()
    with ctx.session_factory() as session:
        cached_shape(session, cache)
    for beat in range(3):
        with ctx.session_factory() as writer:
            for name in ("n0", "n1"):
                writer.execute(
                    update(Node).where(Node.name == name).values(last_heartbeat=time.time() + beat)
                )
            writer.execute(update(Gpu).where(Gpu.node_name == "n0", Gpu.index == 0).values(uuid=Gpu.uuid))
            writer.commit()
        with ctx.session_factory() as session:
            cached_shape(session, cache)
    assert (cache.builds, cache.hits) == (1, 3)


def test_an_unchanged_cluster_costs_one_digest_not_five_selects(tmp_path: Path) -> None:
    ctx, _ = two_nodes(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path)
    cache = ShapeCache()
    with ctx.session_factory() as session, selects(ctx) as first:
        read_cluster_state(session, cache)
    with ctx.session_factory() as session, selects(ctx) as second:
        read_cluster_state(session, cache)
    shape_tables = {"nodes", "gpus", "groups", "group_quotas", "users"}
    # built: the digest, the five tables, the digest again (kept only if it did not move)
    assert first.count("digest") == 2 and shape_tables <= set(first)
    # kept: the digest only, then the per-cycle tables
    assert second.count("digest") == 1 and not shape_tables & set(second)
    assert len(first) - len(second) == 6 and cache.hits == 1 and cache.builds == 1
