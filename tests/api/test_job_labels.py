"""Job labels over the API (what an AutoML tool tags its trials with): the spec's `labels`
validated with errors naming the label, shown on the job, GET /jobs?label=k=v (AND, any value,
visibility) and ?id=, and POST /jobs/cancel cancelling every visible live job carrying the labels,
per job through the lifecycle (queued: at once; running: asked to stop; ended: left alone)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from corral.db.models import Job, JobLabel
from corral.services import job_sets
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.helpers import add_node, make_running

JOBS = "/api/v1/jobs"


def submit(world: World, user: str = "alice", **labels: Any) -> int:
    r = world.client.post(JOBS, json={**SIMPLE_JOB, "labels": labels}, headers=world.as_(user))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def listed(world: World, user: str = "alice", **params: Any) -> list[int]:
    r = world.client.get(JOBS, params={"sort": "id", "order": "asc", **params}, headers=world.as_(user))
    assert r.status_code == 200, r.text
    return [job["id"] for job in r.json()["items"]]


def test_labels_are_stored_shown_and_numbers_read_as_text(world: World) -> None:
    job = submit(world, experiment="e1", trial=7)
    shown = world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()
    assert shown["labels"] == {"experiment": "e1", "trial": "7"}
    assert shown["spec"]["labels"] == {"experiment": "e1", "trial": "7"}
    page = world.client.get(JOBS, headers=world.as_("alice")).json()
    assert page["items"][0]["labels"] == {"experiment": "e1", "trial": "7"}
    with world.session_factory() as db:
        rows = db.execute(sa.select(JobLabel.key, JobLabel.value).where(JobLabel.job_id == job)).all()
    assert sorted(rows) == [("experiment", "e1"), ("trial", "7")]


def test_a_yaml_spec_with_labels(world: World) -> None:
    text = "name: t\ncommand: 'true'\nlabels: {experiment: e9, trial: 3, lr: 0.01}\n"
    r = world.client.post(
        JOBS, content=text, headers={**world.as_("alice"), "Content-Type": "application/yaml"}
    )
    assert r.status_code == 201, r.text
    assert r.json()["labels"] == {"experiment": "e9", "trial": "3", "lr": "0.01"}


def test_bad_labels_are_refused_naming_the_label(world: World) -> None:
    cases = {
        "a b": ("x", "label name 'a b' must be"),
        "flag": (True, "label 'flag': its value True must be text or a number"),
        "eq": ("a=b", "label 'eq': value 'a=b' must be"),
        "empty": ("", "label 'empty': value '' must be"),
    }
    for key, (value, said) in cases.items():
        r = world.client.post(JOBS, json={**SIMPLE_JOB, "labels": {key: value}}, headers=world.as_("alice"))
        assert r.status_code == 422, r.text
        assert said in r.text, r.text
    many = {f"k{i}": "v" for i in range(17)}
    r = world.client.post(JOBS, json={**SIMPLE_JOB, "labels": many}, headers=world.as_("alice"))
    assert r.status_code == 422 and "17 labels; at most 16" in r.text, r.text
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(Job)) == 0


def test_list_by_labels_ands_them_and_a_bare_name_matches_any_value(world: World) -> None:
    a = submit(world, experiment="e1", trial="1")
    b = submit(world, experiment="e1", trial="2")
    c = submit(world, experiment="e2", trial="1")
    plain = submit(world)
    assert listed(world, label="experiment=e1") == [a, b]
    assert listed(world, label=["experiment=e1", "trial=2"]) == [b]
    assert listed(world, label=["trial=1"]) == [a, c]
    assert listed(world, label="experiment") == [a, b, c]
    assert listed(world, label="experiment=e3") == []
    assert plain not in listed(world, label="trial")
    r = world.client.get(JOBS, params={"label": "experiment=e1"}, headers=world.as_("alice"))
    assert r.json()["total"] == 2


def test_list_by_label_shows_only_jobs_the_caller_may_see(world: World) -> None:
    mine = submit(world, "alice", experiment="shared")
    carols = submit(world, "carol", experiment="shared")
    assert listed(world, "alice", label="experiment=shared") == [mine]
    assert listed(world, "carol", label="experiment=shared") == [carols]
    assert listed(world, "admin", label="experiment=shared") == [mine, carols]
    assert listed(world, "bob", label="experiment=shared") == [mine]  # vision's group admin


def test_list_by_ids(world: World) -> None:
    ids = [submit(world) for _ in range(4)]
    assert listed(world, id=f"{ids[0]},{ids[2]}") == [ids[0], ids[2]]
    assert listed(world, id=[str(ids[1]), str(ids[3])]) == [ids[1], ids[3]]
    carols = submit(world, "carol")
    assert listed(world, "alice", id=f"{ids[0]},{carols}") == [ids[0]]
    assert listed(world, id="0,9999999999") == []  # no job has them: nothing, as for a deleted job


def test_bad_selectors_and_ids_are_refused_naming_them(world: World) -> None:
    r = world.client.get(JOBS, params={"label": "a b=c"}, headers=world.as_("alice"))
    assert r.status_code == 422 and "is not a label selector" in r.text, r.text
    r = world.client.get(JOBS, params={"label": "k=a,b"}, headers=world.as_("alice"))
    assert r.status_code == 422 and "is not a label selector" in r.text, r.text
    r = world.client.get(JOBS, params={"id": "1,x"}, headers=world.as_("alice"))
    assert r.status_code == 422 and "is not a list of job ids" in r.text, r.text
    one_value = ",".join(str(i) for i in range(1, 1002))  # too many in one value: said as such
    r = world.client.get(JOBS, params={"id": one_value}, headers=world.as_("alice"))
    assert r.status_code == 422 and "1001 job ids given; at most 1000" in r.text, r.text
    assert one_value not in r.text  # not echoed back whole
    values = [",".join(str(i) for i in range(1, 601)), ",".join(str(i) for i in range(601, 1002))]
    r = world.client.get(JOBS, params={"id": values}, headers=world.as_("alice"))
    assert r.status_code == 422 and "1001 job ids given; at most 1000" in r.text, r.text
    r = world.client.get(JOBS, params={"label": [f"k{i}=v" for i in range(17)]}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text


def test_cancel_by_labels_acts_per_job(world: World) -> None:
    queued = submit(world, experiment="e1", trial="1")
    running = submit(world, experiment="e1", trial="2")
    ended = submit(world, experiment="e1", trial="3")
    other = submit(world, experiment="e2", trial="1")
    carols = submit(world, "carol", experiment="e1")
    with world.session_factory() as db:
        add_node(db)
        make_running(db, running)
        job = db.get(Job, ended)
        assert job is not None
        job.state = "succeeded"
        db.commit()
    r = world.client.post(f"{JOBS}/cancel", json={"labels": ["experiment=e1"]}, headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["matched"] == 2
    outcomes = {item["id"]: (item["outcome"], item["state"]) for item in body["items"]}
    assert outcomes == {queued: ("cancelled", "cancelled"), running: ("stopping", "running")}

    def state(job_id: int) -> tuple[str, bool]:
        shown = world.client.get(f"{JOBS}/{job_id}", headers=world.as_("admin")).json()
        return shown["state"], shown["cancel_requested"]

    assert state(queued) == ("cancelled", True)
    assert state(running) == ("running", True)  # the reconciler stops it
    assert state(ended) == ("succeeded", False)
    assert state(other) == ("queued", False)
    assert state(carols) == ("queued", False)  # not alice's to see
    again = world.client.post(
        f"{JOBS}/cancel", json={"labels": ["experiment=e1", "trial=2"]}, headers=world.as_("alice")
    ).json()
    assert [(i["id"], i["outcome"]) for i in again["items"]] == [(running, "stopping")]


def test_cancel_by_labels_needs_a_label(world: World) -> None:
    submit(world, experiment="e1")
    for body in ({"labels": []}, {}, {"labels": ["bad label"]}):
        r = world.client.post(f"{JOBS}/cancel", json=body, headers=world.as_("alice"))
        assert r.status_code == 422, r.text
    assert listed(world, state="queued") != []


def test_labels_go_with_the_deleted_job(world: World) -> None:
    job = submit(world, experiment="gone")
    world.client.post(f"{JOBS}/{job}/cancel", headers=world.as_("alice"))
    r = world.client.delete(f"{JOBS}/{job}", headers=world.as_("alice"))
    assert r.status_code == 204, r.text
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(JobLabel)) == 0


def test_a_cancel_says_why_in_the_callers_words(world: World) -> None:
    queued = submit(world, experiment="e1")
    running = submit(world, experiment="e1")
    alone = submit(world)
    with world.session_factory() as db:
        add_node(db)
        make_running(db, running)
        db.commit()
    why = "stopped early: loss 0.9 at step 5 > median 0.4"
    r = world.client.post(f"{JOBS}/{alone}/cancel", json={"reason": why}, headers=world.as_("alice"))
    assert r.status_code == 200 and r.json()["reason"] == f"cancelled by alice: {why}", r.text
    r = world.client.post(
        f"{JOBS}/cancel",
        json={"labels": ["experiment=e1"], "reason": "experiment over"},
        headers=world.as_("alice"),
    )
    assert r.status_code == 200, r.text
    shown = {j: world.client.get(f"{JOBS}/{j}", headers=world.as_("alice")).json() for j in (queued, running)}
    assert shown[queued]["reason"] == "cancelled by alice: experiment over"
    assert shown[running]["reason"] == "cancel requested by alice: experiment over"
    assert shown[running]["events"][-1]["message"] == "cancel requested by alice: experiment over"
    again = submit(world)
    for bad in ("two\nlines", "", "x" * 201):
        r = world.client.post(f"{JOBS}/{again}/cancel", json={"reason": bad}, headers=world.as_("alice"))
        assert r.status_code == 422, r.text
    r = world.client.post(f"{JOBS}/{again}/cancel", json={"reason": "a\tb"}, headers=world.as_("alice"))
    assert r.status_code == 422 and "must be one line of text" in r.text, r.text
    assert world.client.get(f"{JOBS}/{again}", headers=world.as_("alice")).json()["state"] == "queued"


def test_hold_and_release_by_labels_act_per_queued_job(world: World) -> None:
    """POST /jobs/hold and /jobs/release: each visible queued job carrying the labels, through the
    single hold/release (a repeat changes nothing; an admin's hold stays, refused for that job alone)."""
    fresh = submit(world, experiment="e1", trial="1")
    mine = submit(world, experiment="e1", trial="2")
    admins = submit(world, experiment="e1", trial="3")
    running = submit(world, experiment="e1", trial="4")
    other = submit(world, experiment="e2")
    carols = submit(world, "carol", experiment="e1")
    with world.session_factory() as db:
        add_node(db)
        make_running(db, running)
    assert world.client.post(f"{JOBS}/{mine}/hold", headers=world.as_("alice")).status_code == 200
    assert world.client.post(f"{JOBS}/{admins}/hold", headers=world.as_("admin")).status_code == 200

    r = world.client.post(f"{JOBS}/hold", json={"labels": ["experiment=e1"]}, headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["matched"] == 3
    assert [(i["id"], i["outcome"], i["state"], i["held"]) for i in body["items"]] == [
        (fresh, "held", "queued", True),
        (mine, "unchanged", "queued", True),
        (admins, "unchanged", "queued", True),
    ]

    def hold_of(job_id: int) -> Any:
        return world.client.get(f"{JOBS}/{job_id}", headers=world.as_("admin")).json()["hold"]

    assert hold_of(fresh)["by"] == "alice" and hold_of(other) is None and hold_of(carols) is None
    assert hold_of(running) is None

    r = world.client.post(f"{JOBS}/release", json={"labels": ["experiment"]}, headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    items = {i["id"]: i for i in r.json()["items"]}
    assert {k: (v["outcome"], v["held"]) for k, v in items.items()} == {
        fresh: ("released", False),
        mine: ("released", False),
        admins: ("refused", True),
        other: ("unchanged", False),
    }
    assert "only an admin can release it" in items[admins]["message"]
    assert hold_of(fresh) is None and hold_of(mine) is None and hold_of(admins)["by"] == "admin"
    kinds = [e["kind"] for e in world.client.get(f"{JOBS}/{fresh}/events", headers=world.as_("alice")).json()]
    assert kinds.count("hold") == 1 and kinds.count("release") == 1

    # the admin's own jobs only, unless all_users (as for a bulk cancel)
    r = world.client.post(f"{JOBS}/release", json={"labels": ["experiment=e1"]}, headers=world.as_("admin"))
    assert (r.json()["matched"], r.json()["more"]) == (0, False), r.text
    r = world.client.post(
        f"{JOBS}/release", json={"labels": ["experiment=e1"], "all_users": True}, headers=world.as_("admin")
    )
    # the jobs it changes first (oldest first), then those it leaves as they are
    assert [(i["id"], i["outcome"]) for i in r.json()["items"]] == [
        (admins, "released"),
        (fresh, "unchanged"),
        (mine, "unchanged"),
        (carols, "unchanged"),
    ]
    for path in ("hold", "release"):
        for bad in ({"labels": []}, {}, {"labels": ["bad label"]}):
            r = world.client.post(f"{JOBS}/{path}", json=bad, headers=world.as_("alice"))
            assert r.status_code == 422, r.text
    assert hold_of(fresh) is None


def cancel(world: World, caller: str, **body: Any) -> Any:
    return world.client.post(
        f"{JOBS}/cancel", json={"labels": ["experiment=e1"], **body}, headers=world.as_(caller)
    )


def states(world: World, *job_ids: int) -> list[str]:
    return [world.client.get(f"{JOBS}/{j}", headers=world.as_("admin")).json()["state"] for j in job_ids]


def test_a_bulk_cancel_by_label_acts_on_the_callers_own_jobs_unless_asked(world: World) -> None:
    # labels are free text: alice, bob (vision's group admin), carol and the admin all run an e1
    alices, bobs, carols, admins = (
        submit(world, u, experiment="e1") for u in ("alice", "bob", "carol", "admin")
    )
    r = cancel(world, "bob")
    assert r.status_code == 200 and [i["id"] for i in r.json()["items"]] == [bobs], r.text
    r = cancel(world, "admin")
    assert r.status_code == 200 and [i["id"] for i in r.json()["items"]] == [admins], r.text
    assert states(world, alices, carols) == ["queued", "queued"]  # nobody else's, by default
    # others' only when asked for, and only by who may act on them
    r = cancel(world, "alice", user="bob")
    assert r.status_code == 403 and "only admins and group admins act on other users' jobs" in r.text, r.text
    r = cancel(world, "alice", all_users=True)
    assert r.status_code == 403 and "only admins and group admins" in r.text, r.text
    for name in ("carol", "nobody"):  # outside bob's groups, or no such user: the same words
        r = cancel(world, "bob", user=name)
        assert r.status_code == 403, r.text
        assert f"no user named '{name}' is a member of, or has jobs in, a group you administer" in r.text
    r = cancel(world, "admin", user="nobody")
    assert r.status_code == 422 and "no user named 'nobody'" in r.text, r.text
    r = cancel(world, "admin", user="carol", all_users=True)
    assert r.status_code == 422 and "user or all_users, not both" in r.text, r.text
    r = cancel(world, "admin", all_users=1)
    assert r.status_code == 422, r.text
    assert states(world, alices, carols) == ["queued", "queued"]
    r = cancel(world, "bob", user="alice", reason="sweep over")
    assert r.status_code == 200 and [i["id"] for i in r.json()["items"]] == [alices], r.text
    assert world.client.get(f"{JOBS}/{alices}", headers=world.as_("alice")).json()["reason"] == (
        "cancelled by bob: sweep over"
    )
    r = cancel(world, "admin", all_users=True)
    assert r.status_code == 200 and [i["id"] for i in r.json()["items"]] == [carols], r.text
    assert r.json()["more"] is False


def test_a_group_admins_all_users_stays_within_their_groups(world: World) -> None:
    alices, bobs, carols = (submit(world, u, experiment="e1") for u in ("alice", "bob", "carol"))
    r = cancel(world, "bob", all_users=True)
    assert r.status_code == 200 and sorted(i["id"] for i in r.json()["items"]) == [alices, bobs], r.text
    assert states(world, carols) == ["queued"]
    r = cancel(world, "bob", user="bob")  # their own name: their own jobs, as by default
    assert r.status_code == 200 and r.json()["matched"] == 0, r.text


def test_a_group_admin_reaches_a_former_members_jobs_in_the_group_one_job_or_many(world: World) -> None:
    """review #9: a member who left the group (their running job asked to stop on the way out)
    leaves that job in it; its group admin may cancel it alone, and so by labels both with
    `all_users` and with `user=NAME` (refused before, while `all_users` reached it). Outside the
    groups they administer, neither reaches anyone's."""
    alices, carols = submit(world, "alice", experiment="e1"), submit(world, "carol", experiment="e1")
    with world.session_factory() as db:
        add_node(db)
        make_running(db, alices)
        db.commit()
    removed = world.client.delete(
        "/api/v1/groups/vision/members/alice", params={"cancel_jobs": True}, headers=world.as_("admin")
    )
    assert removed.status_code == 204, removed.text
    for body in ({"user": "alice"}, {"all_users": True}):
        r = cancel(world, "bob", **body)
        assert r.status_code == 200, r.text
        assert [(i["id"], i["outcome"]) for i in r.json()["items"]] == [(alices, "stopping")], r.text
    one = world.client.post(f"{JOBS}/{alices}/cancel", json={}, headers=world.as_("bob"))
    assert one.status_code == 200, one.text
    r = cancel(world, "bob", user="carol")
    assert r.status_code == 403 and "no user named 'carol' is a member of, or has jobs in" in r.text, r.text
    assert states(world, carols) == ["queued"]


def test_a_bulk_cancel_acts_on_at_most_so_many_jobs_and_says_more(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_sets, "MAX_BULK_JOBS", 2)
    jobs = [submit(world, experiment="e1") for _ in range(3)]
    first = cancel(world, "alice").json()
    assert (first["matched"], first["more"]) == (2, True)
    assert [i["id"] for i in first["items"]] == jobs[:2]
    second = cancel(world, "alice").json()
    assert (second["matched"], second["more"], second["items"][0]["id"]) == (1, False, jobs[2])


def test_a_repeated_bulk_action_gets_past_the_jobs_it_already_changed(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Oldest first alone picked the same held (or stopping) jobs at every call, with `more` true
    for ever, and the jobs past the bound were never reached (review108 #2)."""
    monkeypatch.setattr(job_sets, "MAX_BULK_JOBS", 2)
    queued = [submit(world, experiment="e1") for _ in range(3)]

    def bulk(verb: str) -> Any:
        r = world.client.post(
            f"{JOBS}/{verb}", json={"labels": ["experiment=e1"]}, headers=world.as_("alice")
        )
        assert r.status_code == 200, r.text
        return r.json()

    first = bulk("hold")
    assert [i["outcome"] for i in first["items"]] == ["held", "held"] and first["more"] is True
    second = bulk("hold")
    assert [(i["id"], i["outcome"]) for i in second["items"]] == [
        (queued[2], "held"),
        (queued[0], "unchanged"),
    ]
    assert second["more"] is False
    assert [bulk("release")["more"], bulk("release")["more"]] == [True, False]
    with world.session_factory() as db:
        add_node(db, gpus=3)
        for index, job_id in enumerate(queued):
            make_running(db, job_id, gpu_indices=(index,))
    stopping = bulk("cancel")
    assert [i["outcome"] for i in stopping["items"]] == ["stopping", "stopping"] and stopping["more"] is True
    assert bulk("cancel")["items"][0]["id"] == queued[2]  # the one not yet asked to stop
