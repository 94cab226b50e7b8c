"""`GET /api/v1/gpus` (corral.monitor.gpu_usage): every GPU's latest reading for a signed-in
caller, the holding job's id only where the caller may see that job and its group only to the
group's members; the portal draws its utilization from it, so it works where `/metrics` needs the
scrape token. The real app over a real SQLite database with a seeded cluster."""

from __future__ import annotations

import time

from sqlalchemy import select

from corral.db.models import Attempt, GpuClaim, Group, Job, User
from corral.db.workspace_models import Workspace
from corral.monitor.models import GpuReading
from corral.services import accounts, auth
from tests.monitor.conftest import Mon


def _claimed_jobs(mon: Mon) -> tuple[Job, Job, dict[str, User], dict[str, Group]]:
    """Two jobs holding GPUs, user0's in group0 and user1's in group1; user2 is group0's admin."""
    with mon.factory() as db:
        held = list(db.scalars(select(GpuClaim.job_id).distinct().order_by(GpuClaim.job_id)))
        assert len(held) >= 2, held
        job_a, job_b = (db.get(Job, i) for i in held[:2])
        assert job_a is not None and job_b is not None
        users = {u.name: u for u in db.scalars(select(User).where(User.name.like("user%")))}
        groups = {g.name: g for g in db.scalars(select(Group).where(Group.name.like("group%")))}
        job_a.user_id, job_a.group_id = users["user0"].id, groups["group0"].id
        job_b.user_id, job_b.group_id = users["user1"].id, groups["group1"].id
        for job_id in held[2:]:  # the rest: user1's in group1, so user0 sees only job_a
            other = db.get(Job, job_id)
            assert other is not None
            other.user_id, other.group_id = users["user1"].id, groups["group1"].id
        accounts.add_member(db, groups["group0"], users["user0"], role="member")
        accounts.add_member(db, groups["group1"], users["user1"], role="member")
        accounts.add_member(db, groups["group0"], users["user2"], role="admin")
        db.commit()
        db.expunge_all()
        return job_a, job_b, users, groups


def test_each_caller_sees_every_gpus_reading_and_only_the_jobs_and_groups_it_may(mon: Mon) -> None:
    job_a, job_b, users, _groups = _claimed_jobs(mon)
    with mon.factory() as db:
        tokens = {name: auth.create_token(db, user, "gpus")[1] for name, user in users.items()}
        claims = {(c.node, c.gpu_index): c.job_id for c in db.scalars(select(GpuClaim))}
        readings = {(r.node, r.gpu_index): r.utilization_percent for r in db.scalars(select(GpuReading))}
        lost = next(iter(sorted(readings)))  # this GPU fell off the bus: no utilization
        db.get(GpuReading, lost).present = False  # type: ignore[union-attr]
        db.commit()

    def gpus(token: str | None) -> list[dict[str, object]]:
        headers = {"Authorization": f"Bearer {token}"} if token else mon.admin
        r = client.get("/api/v1/gpus", headers=headers)
        assert r.status_code == 200, r.text
        return list(r.json()["gpus"])

    with mon.app_client() as client:
        assert client.get("/api/v1/gpus").status_code == 401
        admin = gpus(None)
        assert [(g["node"], g["gpu"]) for g in admin] == sorted(readings)  # every GPU, in order
        for g in admin:
            key = (g["node"], g["gpu"])
            assert g["allocated"] is (key in claims)
            assert g["job_id"] == claims.get(key)  # type: ignore[call-overload]
            if key == lost:
                assert (g["present"], g["utilization_percent"]) == (False, None)
            else:
                assert g["utilization_percent"] == readings[key]  # type: ignore[index]

        def seen(token: str) -> tuple[set[object], set[object], int]:
            rows = gpus(token)
            assert [g["utilization_percent"] for g in rows] == [g["utilization_percent"] for g in admin]
            held = sum(1 for g in rows if g["allocated"])
            return {g["job_id"] for g in rows} - {None}, {g["group"] for g in rows} - {None}, held

        held_total = len(claims)
        assert seen(tokens["user0"]) == ({job_a.id}, {"group0"}, held_total)
        assert seen(tokens["user1"]) == (set(claims.values()) - {job_a.id}, {"group1"}, held_total)
        # group0's admin sees group0's jobs, not its own (it has none) nor group1's
        assert seen(tokens["user2"]) == ({job_a.id}, {"group0"}, held_total)
        assert job_b.id in {g["job_id"] for g in admin}


def test_reclaimed_gpu_hours_are_summed_over_every_groups_workspaces(mon: Mon) -> None:
    with mon.factory() as db:
        user = db.scalar(select(User).where(User.name == "user0"))
        groups = list(db.scalars(select(Group).where(Group.name.like("group%")).order_by(Group.name)))
        assert user is not None and len(groups) == 2
        now = time.time()
        for i, (group, hours) in enumerate(zip(groups, (1.25, 2.5), strict=True)):
            db.add(
                Workspace(
                    name=f"ws{i}", user_id=user.id, group_id=group.id, gpus=1, gpu_model=None, cpus=1.0,
                    memory_mib=1024, environment="default", idle_timeout_s=None, jupyter_token="t",
                    reclaimed_gpu_hours=hours, created_at=now, updated_at=now,
                )
            )  # fmt: skip
        token = auth.create_token(db, user, "gpus")[1]
        db.commit()
    with mon.app_client() as client:
        body = client.get("/api/v1/gpus", headers={"Authorization": f"Bearer {token}"}).json()
    assert body.get("workspace_gpu_hours_reclaimed") == 3.75, body


def test_an_attempt_that_ended_holds_no_gpu_in_the_answer(mon: Mon) -> None:
    with mon.factory() as db:
        claim = db.scalars(select(GpuClaim).order_by(GpuClaim.node, GpuClaim.gpu_index)).first()
        assert claim is not None
        key, attempt_pk = (claim.node, claim.gpu_index), claim.attempt_pk
        db.execute(GpuClaim.__table__.delete().where(GpuClaim.attempt_pk == attempt_pk))
        assert db.get(Attempt, attempt_pk) is not None
        db.commit()
    with mon.app_client() as client:
        rows = client.get("/api/v1/gpus", headers=mon.admin).json()["gpus"]
    row = next(g for g in rows if (g["node"], g["gpu"]) == key)
    assert (row["allocated"], row["job_id"], row["group"]) == (False, None, None)
