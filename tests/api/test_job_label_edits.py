"""PATCH /jobs/{id}/labels (rough14 #5): a job's labels edited after submit as a JSON merge patch,
as Kubernetes edits labels; the same rules as at submit, the filters and the job's history
following; who may (owner, group admin, admin; others as for a missing job); `corral label`
and the SDK. SQLite and PostgreSQL (the `world` fixture)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from corral.db.audit_models import AuditRecord
from corral.db.models import Job, JobLabel
from corral.sdk import Client, CorralError
from tests.api.conftest import World
from tests.api.test_cli import run, server_url
from tests.api.test_job_labels import JOBS, listed, submit

__all__ = ["server_url"]  # the fixture


def patch(world: World, job: int, labels: dict[str, Any], user: str = "alice") -> Any:
    return world.client.patch(f"{JOBS}/{job}/labels", json={"labels": labels}, headers=world.as_(user))


def label_rows(world: World, job: int) -> dict[str, str]:
    with world.session_factory() as db:
        rows = db.execute(sa.select(JobLabel.key, JobLabel.value).where(JobLabel.job_id == job)).all()
    return dict(rows)  # type: ignore[arg-type]


def test_a_patch_sets_and_removes_labels_and_the_filters_and_history_follow(world: World) -> None:
    job = submit(world, experiment="e1", trial=7, stale="x")
    other = submit(world, experiment="e1", trial=7)
    before = world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()
    r = patch(world, job, {"trial": 8, "best": "yes", "stale": None})
    assert r.status_code == 200, r.text
    want = {"experiment": "e1", "trial": "8", "best": "yes"}
    assert r.json()["labels"] == r.json()["spec"]["labels"] == want
    assert label_rows(world, job) == want
    assert listed(world, label="trial=8") == [job]
    assert listed(world, label="trial=7") == [other]
    assert listed(world, label="stale") == []
    shown = world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()
    assert shown["labels"] == want and shown["updated_at"] == before["updated_at"]  # no state change
    events = world.client.get(f"{JOBS}/{job}/events", headers=world.as_("alice")).json()
    assert [(e["kind"], e["message"]) for e in events if e["kind"] == "labels"] == [
        ("labels", "labels changed by alice: best=yes, trial=8, -stale")
    ]
    assert label_rows(world, other) == {"experiment": "e1", "trial": "7"}
    # the same values again, and a name it does not carry removed: nothing changes, no event
    assert patch(world, job, {"trial": "8", "gone": None}).json()["labels"] == want
    events = world.client.get(f"{JOBS}/{job}/events", headers=world.as_("alice")).json()
    assert len([e for e in events if e["kind"] == "labels"]) == 1


def test_bad_patches_are_refused_naming_the_label_and_change_nothing(world: World) -> None:
    job = submit(world, experiment="e1")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"a b": "x"}, "label name 'a b' must be"),
        ({"flag": True}, "label 'flag': its value True must be text or a number"),
        ({"eq": "a=b"}, "label 'eq': value 'a=b' must be"),
        ({"trial=7": None}, "label name 'trial=7' must be"),  # a removal's name is checked too
        ({"ok": "1", "also bad": "x"}, "label name 'also bad' must be"),
        ({}, "labels"),
        ({f"k{i}": "v" for i in range(16)}, f"job {job} would have 17 labels; at most 16 are allowed"),
    ]
    for labels, said in cases:
        r = patch(world, job, labels)
        assert r.status_code == 422 and said in r.text, (labels, r.text)
    assert label_rows(world, job) == {"experiment": "e1"}
    # making room in the same patch is fine: 16 in the end
    r = patch(world, job, {"experiment": None, **{f"k{i}": "v" for i in range(16)}})
    assert r.status_code == 200 and len(r.json()["labels"]) == 16, r.text


def test_the_owner_a_group_admin_and_an_admin_may_edit_in_any_state_others_see_no_job(world: World) -> None:
    job = submit(world, experiment="e1")
    assert patch(world, job, {"by": "carol"}, user="carol").status_code == 404  # another group's
    assert patch(world, job, {"by": "bob"}, user="bob").status_code == 200  # vision's group admin
    assert world.client.post(f"{JOBS}/{job}/cancel", headers=world.as_("alice")).status_code == 200
    r = patch(world, job, {"by": "admin", "after": "end"}, user="admin")  # ended: still labelled
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert r.json()["labels"] == {"experiment": "e1", "by": "admin", "after": "end"}
    assert patch(world, job, {"by": None}).status_code == 200
    with world.session_factory() as db:
        audited = db.execute(
            sa.select(AuditRecord.actor, AuditRecord.action, AuditRecord.after).order_by(AuditRecord.id)
        ).all()
    labelled = [(actor, after) for actor, action, after in audited if action == "job.labels"]
    assert [actor for actor, _ in labelled] == ["bob", "admin"]  # not the owner's own edit
    assert labelled[0][1] == {"labels": {"experiment": "e1", "by": "bob"}}


def test_edits_made_at_once_each_keep_the_others(world: World) -> None:
    """Two clients labelling one job at the same time: each edit is applied to the labels the
    other left, never to a stale copy (which would drop the other's label)."""
    job = submit(world)
    failures: list[str] = []

    def edit(name: str) -> None:
        for i in range(4):
            r = patch(world, job, {f"{name}{i}": "v"})
            if r.status_code != 200:
                failures.append(r.text)

    threads = [threading.Thread(target=edit, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    want = {f"{name}{i}": "v" for name in "ab" for i in range(4)}
    assert world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()["labels"] == want
    assert label_rows(world, job) == want


def test_corral_label_and_the_sdk(world: World, server_url: str, tmp_path: Path) -> None:
    job = submit(world, experiment="e1", stale="x")
    code, out = run(world, server_url, "alice", "label", str(job), "trial=8", "stale-")
    assert (code, out.strip()) == (0, f"job {job} labels: experiment=e1 trial=8")
    code, out = run(world, server_url, "alice", "label", str(job), "best=yes", "-o", "json")
    assert code == 0 and json.loads(out)["labels"] == {"experiment": "e1", "trial": "8", "best": "yes"}
    for args, said in [
        (["trial"], "'trial': give NAME=VALUE to set a label or NAME- to remove it"),
        (["trial=9", "trial-"], "label 'trial' is named twice"),
        (["bad name=1"], "label name 'bad name' must be"),
    ]:
        code, out = run(world, server_url, "alice", "label", str(job), *args)
        assert code != 0 and said in out, (args, out)
    token = world.as_("alice")["Authorization"].removeprefix("Bearer ")
    with Client(server_url, token=token) as c:
        edited = c.set_labels(job, {"trial": 9}, remove=["best"])
        assert edited["labels"] == {"experiment": "e1", "trial": "9"}
        # one name as a str is that name, not its letters (review112 #4)
        c.set_labels(job, {"s": "1", "t": "2", "stale": "x"})
        edited = c.set_labels(job, remove="stale")
        assert edited["labels"] == {"experiment": "e1", "trial": "9", "s": "1", "t": "2"}
        with pytest.raises(CorralError, match="'trial' is both set and removed"):
            c.set_labels(job, {"trial": 1}, remove=["trial"])


# SQLite only: on PostgreSQL get_job's row lock makes the deleting side wait, so the race this
# test builds cannot happen there.
@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_a_job_deleted_while_its_labels_are_edited_is_a_404_not_a_500(world: World) -> None:
    """review112 #5: on SQLite get_job locks nothing, so a deletion committed between it and the
    edit's first write (corral rm, the retention pass) made the spec's refresh raise: a 500. Here
    the job is deleted from another connection just before that first write."""
    engine = world.session_factory.kw["bind"]
    job = submit(world, experiment="e1")
    deleted: list[int] = []

    def delete_the_job_first(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.startswith("DELETE FROM job_labels") and not deleted:
            deleted.append(job)
            with engine.begin() as other:
                other.execute(sa.delete(Job).where(Job.id == job))

    sa.event.listen(engine, "before_cursor_execute", delete_the_job_first)
    try:
        r = patch(world, job, {"trial": "1"})
    finally:
        sa.event.remove(engine, "before_cursor_execute", delete_the_job_first)
    assert deleted == [job]
    assert r.status_code == 404 and r.json()["detail"] == f"no job with id {job}", r.text
