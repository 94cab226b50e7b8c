"""Who lists which alerts (issue 17: any logged-in member listed every alert, other users' OOM and
idle alerts included): a member sees the alerts about their own jobs and the cluster-wide ones, a
group admin also their group's, an admin everything. The real app over a real SQLite database."""

from __future__ import annotations

import time

from sqlalchemy import select

from corral.db.models import Group, Job, User
from corral.monitor.alerts import record_alert
from corral.services import accounts, auth
from tests.monitor.conftest import Mon


def test_members_see_their_jobs_alerts_group_admins_their_groups_admins_all(mon: Mon) -> None:
    assert_alert_visibility(mon)


def assert_alert_visibility(mon: Mon) -> None:
    """Also run on PostgreSQL (tests/monitor/test_postgres.py): the rule reads JSON labels in SQL."""
    now = time.time()
    with mon.factory() as db:
        users = {
            u.name: u for u in db.scalars(select(User).where(User.name.in_(["user0", "user1", "user2"])))
        }
        groups = {g.name: g for g in db.scalars(select(Group).where(Group.name.in_(["group0", "group1"])))}
        job_a, job_b = db.scalars(select(Job).order_by(Job.id).limit(2))
        job_a.user_id, job_a.group_id = users["user0"].id, groups["group0"].id
        job_b.user_id, job_b.group_id = users["user1"].id, groups["group1"].id
        accounts.add_member(db, groups["group0"], users["user2"], role="admin")  # owns no job
        tokens = {name: auth.create_token(db, user, "alerts")[1] for name, user in users.items()}
        a, b = str(job_a.id), str(job_b.id)
        alerts = {
            "oom_a": {"alertname": "CorralJobOOM", "job_id": a, "user": "user0", "group": "group0"},
            "idle_b": {"alertname": "CorralJobGpuIdle", "job_id": b, "user": "user1", "group": "group1"},
            "node": {"alertname": "CorralNodeLost", "node": "node0000"},  # names no job: cluster-wide
            # the job decides, not a label that disagrees with it
            "gpu_a": {"alertname": "CorralGpuAllocatedIdle", "job_id": a, "user": "user1", "gpu": "0"},
            # a job Corral does not know: the user and group labels decide
            "gone": {"alertname": "CorralJobOOM", "job_id": "999999", "user": "user1", "group": "group1"},
        }
        ids = {
            key: record_alert(
                db, labels=labels, status="firing", now=now, channels=[], source="test"
            ).alert_id
            for key, labels in alerts.items()
        }
        db.commit()

    def listed(token: str | None, **params: str) -> set[str]:
        headers = {"Authorization": f"Bearer {token}"} if token else mon.admin
        body = client.get("/api/v1/alerts", params=params, headers=headers).json()
        assert body["total"] == len(body["items"])
        by_id = {v: k for k, v in ids.items()}
        return {by_id[item["id"]] for item in body["items"]}

    with mon.app_client() as client:
        assert listed(tokens["user0"]) == {"oom_a", "node", "gpu_a"}
        assert listed(tokens["user1"]) == {"idle_b", "node", "gone"}
        assert listed(tokens["user2"]) == {"oom_a", "node", "gpu_a"}  # admin of group0
        assert listed(None) == set(alerts)  # the admin
        assert listed(tokens["user1"], name="CorralJobOOM") == {"gone"}
        assert listed(tokens["user0"], status="resolved") == set()
        assert client.get("/api/v1/alerts").status_code == 401
