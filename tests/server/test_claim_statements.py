"""What the launch claim reads per batch (issue 19, ninth pass): the scheduled jobs with their
live attempts, environment builds and workspace credentials in one read, each user's groups
with the uid and gids given so far in another, whatever the batch's size; and nothing of it kept
between claims (a storage identity changed or given since is what the next launch gets). Real SQLite (and
PostgreSQL for the new statements) and the real claim over the fake engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, update

from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import Group, Job, Membership, User
from corral.db.session import make_engine
from corral.db.storage_models import StorageIdentity
from corral.db.workspace_models import Workspace
from corral.engine.base import AttemptLaunch
from corral.environments import interpreter
from corral.environments.mounts import BUILD_TOOLS
from corral.server.context import ServerContext
from corral.server.dispatch import prepare_launches
from corral.server.nodes import node_tick
from corral.server.scheduling import schedule_tick
from corral.services.workspaces import TOKEN_ENV
from tests.pg import sqlite_or_postgres_url
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant
from tests.server.test_tick_statements import statements


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres_url(request, tmp_path, "db.sqlite")


def placed(ctx: ServerContext, jobs: int, gid: int, uid: int) -> list[int]:
    """`jobs` 1-GPU jobs of user `uid` placed (scheduled, not launched); their ids."""
    with ctx.session_factory() as session:
        ids = [add_job(session, gid, uid) for _ in range(jobs)]
    schedule_tick(ctx, time.time())
    return ids


def claim(ctx: ServerContext, skip: set[int] | None = None) -> dict[int, AttemptLaunch]:
    """One claim batch (`skip`: the jobs the launch pool has in flight, as dispatch passes them)."""
    with ctx.session_factory() as session:
        launches = prepare_launches(ctx, session, time.time(), skip=skip)
    return {int(launch.job_id): launch for launch in launches}


def cluster(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ServerContext, int, int]:
    """Two 4-GPU nodes, one tenant; the schedule loop places without launching: (ctx, gid, uid)."""
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    fake = FakeEngine([gpu_node(f"n{i}", address=f"10.0.0.{i}") for i in range(2)])
    ctx = make_context(make_engine(db_url), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=8)
    return ctx, gid, uid


def test_a_claim_batch_runs_four_statements_whatever_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduled jobs (with their live attempts, builds and credentials), their nodes, the
    users' groups with their ids, the claim's UPDATE: 9 before (the attempts, the memberships, the
    uids, the gids, the builds and the credentials were a read each)."""
    ctx, gid, uid = cluster(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path, monkeypatch)
    in_flight = set(placed(ctx, 1, gid, uid))
    assert set(claim(ctx)) == in_flight  # the first claim gives the user's and group's ids (writes)
    counts = []
    for n in (2, 5):
        ids = placed(ctx, n, gid, uid)
        with statements(ctx) as seen:
            assert set(claim(ctx, in_flight)) == set(ids)
        in_flight.update(ids)
        counts.append(len(seen))
    assert counts == [4, 4], seen


def test_builds_credentials_and_ids_reach_the_batchs_launches(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One batch: a build job gets its version's interpreter and the build tools, a workspace job
    its credential, a plain job neither; a user in two groups gets both gids, a user in none a
    uid and no gid. On PostgreSQL too (the correlated reads, the outer joins)."""
    ctx, gid, uid = cluster(db_url, tmp_path, monkeypatch)
    Path(ctx.settings.storage_path, "env").mkdir(parents=True)  # where the build tools are kept
    now = time.time()
    with ctx.session_factory() as session:
        other = Group(name="g2", created_at=now, weight=1.0, borrowing=True)
        session.add(other)
        session.flush()
        session.add(Membership(user_id=uid, group_id=other.id, role="member"))
        loner = User(name="loner", is_admin=False, default_group_id=gid, created_at=now, active=True)
        session.add(loner)
        session.commit()
        loner_id, other_id = loner.id, other.id
    build, workspace, plain = placed(ctx, 3, gid, uid)
    (alone,) = placed(ctx, 1, gid, loner_id)
    python = "/opt/corral-test-python/bin/python3"
    with ctx.session_factory() as session:
        env = Environment(name="e", owner_id=uid, group_id=None, visibility="private", created_at=now)
        session.add(env)
        session.flush()
        session.add(
            EnvironmentVersion(
                environment_id=env.id,
                version=1,
                state="building",
                source_kind="requirements",
                source="",
                python="3.11",
                interpreter=python,
                build_job_id=build,
                created_by="u",
                created_at=now,
            )
        )
        session.add(
            Workspace(
                name="ws",
                user_id=uid,
                group_id=gid,
                gpus=1,
                gpu_model=None,
                cpus=1.0,
                memory_mib=1024,
                environment="default",
                idle_timeout_s=None,
                current_job_id=workspace,
                jupyter_token="t0ken",
                created_at=now,
                updated_at=now,
            )
        )
        session.commit()
    launches = claim(ctx)
    assert set(launches) == {build, workspace, plain, alone}
    assert launches[build].environment_bin == BUILD_TOOLS
    assert launches[build].environment_paths == interpreter.sandbox_paths(python)
    assert BUILD_TOOLS in {m.target for m in launches[build].mounts}
    for job in (workspace, plain, alone):
        assert launches[job].environment_bin == ""
    assert [(s.env, s.value) for s in launches[workspace].secrets] == [(TOKEN_ENV, b"t0ken")]
    assert launches[build].secrets == launches[plain].secrets == ()
    with ctx.session_factory() as session:
        ids = {(r.kind, r.subject_id): r.number for r in session.scalars(select(StorageIdentity))}
    assert launches[plain].uid == ids[("user", uid)]
    assert launches[plain].gids == tuple(sorted((ids[("group", gid)], ids[("group", other_id)])))
    assert launches[alone].uid == ids[("user", loner_id)] != launches[plain].uid
    assert launches[alone].gids == ()


def test_a_changed_or_rolled_back_identity_is_what_the_next_claim_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing read by a claim is kept for the next: a uid changed in the table since (another
    server, an admin's repair) is the next launch's, and the ids a claim allocated in a
    transaction that rolled back are allocated again, not served from memory."""
    ctx, gid, uid = cluster(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path, monkeypatch)
    (first,) = placed(ctx, 1, gid, uid)
    with ctx.session_factory() as session:
        launches = prepare_launches(ctx, session, time.time())  # allocates, then commits
    given = launches[0].uid
    with ctx.session_factory() as session:
        session.execute(update(Job).where(Job.id == first).values(lease_owner=None))
        session.execute(
            update(StorageIdentity)
            .where(StorageIdentity.kind == "user", StorageIdentity.subject_id == uid)
            .values(number=given + 7)
        )
        session.commit()
    (second,) = placed(ctx, 1, gid, uid)
    assert claim(ctx)[second].uid == given + 7


@pytest.fixture(params=["postgresql"])
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres_url(request, tmp_path, "db.sqlite")


def test_ids_allocated_by_a_claim_that_rolled_back_are_never_served(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim allocates the user's and group's ids, then fails before its commit: those numbers
    were never given. Another subject takes the first uid meanwhile; the next claim allocates the
    user the next one, which is what its launch gets (a kept copy would give the first).
    PostgreSQL only: on SQLite, pysqlite commits an allocation's SAVEPOINT when it is released
    outside a transaction of its own, so the numbers were given at once (and kept, as given
    numbers are)."""
    ctx, gid, uid = cluster(pg_url, tmp_path, monkeypatch)
    placed(ctx, 1, gid, uid)

    def fail(*args: object) -> set[int]:
        raise RuntimeError("database gone")

    monkeypatch.setattr("corral.server.dispatch.claim_jobs", fail)
    with pytest.raises(RuntimeError), ctx.session_factory() as session:
        prepare_launches(ctx, session, time.time())
    monkeypatch.undo()
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    low = int(ctx.settings.uid_range.split("-")[0])
    with ctx.session_factory() as session:
        assert session.scalars(select(StorageIdentity)).all() == []  # rolled back
        session.add(
            StorageIdentity(
                kind="user",
                subject_id=999,
                subject_created_at=0.0,
                subject_name="other",
                number=low,
                created_at=time.time(),
            )
        )
        session.commit()
    (launch,) = claim(ctx).values()
    assert launch.uid == low + 1
