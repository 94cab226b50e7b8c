"""What an AutoML tool uses, through the SDK and the CLI against a real server: trials listed and
cancelled by label, `wait_any`/`wait_all` with one list request per poll (ids or labels), a job's
`report_metrics` read back by `metrics`, and `corral ls -l`, `show`, `cancel -l`, `metrics`."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.config import Settings
from corral.db.models import Job
from corral.sdk import Client, CorralError, report_metrics
from corral.storage.layout import outputs_dir
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.helpers import add_node, make_running
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture


@pytest.fixture
def alice(world: World, server_url: str) -> Iterator[Client]:
    with Client(server_url, world.as_("alice")["Authorization"].split()[1]) as client:
        yield client


def trials(client: Client, count: int, experiment: str = "e1") -> list[int]:
    return [
        client.submit({**SIMPLE_JOB, "labels": {"experiment": experiment, "trial": n}})["id"]
        for n in range(count)
    ]


def end(world: World, job_ids: list[int], state: str = "succeeded") -> None:
    with world.session_factory() as db:
        for job_id in job_ids:
            job = db.get(Job, job_id)
            assert job is not None
            job.state, job.finished_at = state, time.time()
        db.commit()


def counted(client: Client) -> list[str]:
    """The requests `client` sends from now on, as 'METHOD path?query'."""
    sent: list[str] = []
    client._http.event_hooks["request"].append(lambda r: sent.append(f"{r.method} {r.url.path}"))
    return sent


def test_list_and_cancel_by_labels(world: World, alice: Client) -> None:
    e1, e2 = trials(alice, 3), trials(alice, 2, "e2")
    page = alice.jobs(labels={"experiment": "e1"}, sort="id", order="asc")
    assert [j["id"] for j in page["items"]] == e1 and page["items"][1]["labels"]["trial"] == "1"
    assert [j["id"] for j in alice.jobs(labels={"experiment": None, "trial": 0})["items"]] == sorted(
        [e1[0], e2[0]], reverse=True
    )
    assert [j["id"] for j in alice.jobs(ids=[e2[1], e1[0]], sort="id", order="asc")["items"]] == [
        e1[0],
        e2[1],
    ]
    done = alice.cancel_by_labels({"experiment": "e1"})
    assert done["matched"] == 3 and {i["outcome"] for i in done["items"]} == {"cancelled"}
    states = {j["id"]: j["state"] for j in alice.jobs(limit=10)["items"]}
    assert [states[i] for i in e1] == ["cancelled"] * 3 and [states[i] for i in e2] == ["queued"] * 2
    with pytest.raises(CorralError, match="at least one label"):
        alice.cancel_by_labels({})


def test_wait_any_and_wait_all_make_one_request_per_poll(world: World, alice: Client) -> None:
    ids = trials(alice, 150)
    sent = counted(alice)
    with pytest.raises(TimeoutError, match="none of the 150 jobs has ended"):
        alice.wait_any(ids, timeout_s=0)
    # the count that all 150 are there, one poll, and (none ended) the count that none is gone
    assert len(sent) == 3, sent
    sent.clear()
    with pytest.raises(TimeoutError, match="150 of the jobs are still queued or running"):
        alice.wait_all(ids, timeout_s=0)
    assert len(sent) == 2, sent  # the count that all 150 are there, then one poll
    sent.clear()
    with pytest.raises(TimeoutError, match="150 of the jobs"):
        alice.wait_all(labels={"experiment": "e1"}, timeout_s=0)
    # who alice is (her jobs only: asked once per client), one count to see the labels match, one poll
    assert len(sent) == 3, sent


def test_wait_any_returns_the_ended_and_wait_all_waits_for_every_one(world: World, alice: Client) -> None:
    ids = trials(alice, 4)
    end(world, [ids[2]], "failed")
    ended = alice.wait_any(ids, timeout_s=5, poll_s=0.05)
    assert [(j["id"], j["state"]) for j in ended] == [(ids[2], "failed")]
    later = threading.Timer(0.3, end, (world, [ids[0], ids[1], ids[3]]))
    later.start()
    try:
        every = alice.wait_all(labels={"experiment": "e1"}, timeout_s=10, poll_s=0.05)
    finally:
        later.join()
    assert [j["id"] for j in every] == ids
    assert [j["state"] for j in every] == ["succeeded", "succeeded", "failed", "succeeded"]


def test_waiting_for_jobs_that_are_not_there_says_so(world: World, alice: Client) -> None:
    carols = world.client.post("/api/v1/jobs", json=SIMPLE_JOB, headers=world.as_("carol")).json()["id"]
    mine = trials(alice, 1)
    with pytest.raises(CorralError, match=f"no job with id {carols}"):
        alice.wait_all([*mine, carols], timeout_s=1)
    with pytest.raises(CorralError, match="no job of alice you can see carries the labels experiment=nope"):
        alice.wait_all(labels={"experiment": "nope"}, timeout_s=1)
    with pytest.raises(CorralError, match="by job_ids or by labels, one of them"):
        alice.wait_all()


def test_report_metrics_is_read_back(
    world: World, alice: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    (job,) = trials(alice, 1)
    outputs = outputs_dir(settings.storage_path, job)
    outputs.mkdir(parents=True)
    monkeypatch.setenv("CORRAL_OUTPUTS", str(outputs))  # as inside the job
    assert alice.metrics(job)["points"] == []
    report_metrics(step=1, loss=0.9)
    report_metrics(step=2, loss=0.5, accuracy=0.75)
    body = alice.metrics(job)
    assert body["latest"] == {"loss": 0.5, "accuracy": 0.75} and len(body["points"]) == 2
    with pytest.raises(CorralError, match="'loss': nan is not a finite number"):
        report_metrics(loss=float("nan"))
    with pytest.raises(CorralError, match="step -1 is not a whole number"):
        report_metrics(step=-1, loss=1.0)
    # what the server would skip is refused where it is written, naming what is wrong
    with pytest.raises(
        CorralError, match=r"step 1152921504606846976 is not a whole number from 0 to 2\*\*53"
    ):
        report_metrics(step=2**60, loss=0.1)
    with pytest.raises(CorralError, match="metric name 'val loss' must be 1 to 64 letters"):
        report_metrics(**{"val loss": 0.2})
    with pytest.raises(CorralError, match="metric name 'aaaa"):
        report_metrics(**{"a" * 65: 0.2})
    with pytest.raises(CorralError, match="'loss': a whole number is not a finite number a float can hold"):
        report_metrics(loss=10**400)  # math.isfinite raised OverflowError (review108 #1)
    with pytest.raises(CorralError, match="70 metrics in one point; at most 64"):
        report_metrics(**{f"m{i}": 1.0 for i in range(70)})
    assert len(alice.metrics(job)["points"]) == 2 and alice.metrics(job)["skipped"] == 0
    monkeypatch.delenv("CORRAL_OUTPUTS")
    with pytest.raises(CorralError, match="CORRAL_OUTPUTS is not set"):
        report_metrics(loss=1.0)


def test_cli_lists_shows_cancels_by_label_and_prints_metrics(
    world: World, server_url: str, alice: Client, settings: Settings
) -> None:
    ids = trials(alice, 2)
    other = trials(alice, 1, "e2")
    with world.session_factory() as db:
        add_node(db)
        make_running(db, ids[1])
        db.commit()
    code, out = run(world, server_url, "alice", "ls", "-l", "experiment=e1")
    assert code == 0 and "2 of 2 jobs" in out, out
    assert re.search(rf"^\s*{ids[0]}\s+hello\s+queued .* trial=0\s*$", out, re.M), out  # not experiment=
    code, out = run(world, server_url, "alice", "ls")
    assert re.search(rf"^\s*{other[0]}\s+hello\s+queued .*experiment=e2", out, re.M), out
    assert "experiment=e2,trial=0" in "".join(out.split()), out  # folded at 80 columns, never cut
    code, out = run(world, server_url, "alice", "ls", "-l", "experiment=e1", "-l", "trial=1", "-o", "json")
    assert [j["id"] for j in json.loads(out)["items"]] == [ids[1]]
    code, out = run(world, server_url, "alice", "ls", "-l", "trial=1", "-l", "trial=2")
    assert code == 1 and "label 'trial' is given twice" in out, out
    code, out = run(world, server_url, "alice", "ls", "-l", "bad label")
    assert code == 1 and "is not a label selector" in out, out
    code, out = run(world, server_url, "alice", "show", str(ids[0]))
    assert "labels experiment=e1,trial=0" in out, out
    (outputs := outputs_dir(settings.storage_path, ids[1])).mkdir(parents=True)
    (outputs / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n')
    code, out = run(world, server_url, "alice", "metrics", str(ids[1]))
    assert code == 0 and "loss" in out and "0.25" in out and "2 points" in out, out
    code, out = run(world, server_url, "alice", "metrics", str(ids[1]), "--points")
    assert [line.split() for line in out.splitlines()[1:3]] == [["1", "0.5"], ["2", "0.25"]], out
    code, out = run(world, server_url, "alice", "metrics", str(ids[0]))
    assert code == 0 and f"job {ids[0]} has reported no metrics" in out, out
    code, out = run(world, server_url, "alice", "cancel", "-l", "experiment=e1", "--reason", "search over")
    assert code == 0, out
    assert alice.job(ids[0])["reason"] == "cancelled by alice: search over"
    assert f"job {ids[0]} cancelled" in out and f"job {ids[1]} is running; it is being stopped" in out
    assert "2 live jobs of yours with experiment=e1" in out, out
    code, out = run(world, server_url, "alice", "cancel")
    assert code == 1 and "give a job id or labels" in out, out
    assert alice.job(other[0])["state"] == "queued"


def test_the_sdk_refuses_bad_label_names_with_the_servers_words(alice: Client) -> None:
    with pytest.raises(CorralError, match="is not a label selector"):
        alice.jobs(labels={"a b": "c"})
    with pytest.raises(CorralError, match="label name 'a b'"):
        alice.submit({**SIMPLE_JOB, "labels": {"a b": "c"}})


def test_metrics_of_many_trials_and_the_cli_table(
    world: World, server_url: str, alice: Client, settings: Settings
) -> None:
    ids = trials(alice, 3)
    for n, job in enumerate(ids[:2]):
        (outputs := outputs_dir(settings.storage_path, job)).mkdir(parents=True)
        (outputs / "metrics.jsonl").write_text(f'{{"step": 4, "loss": 0.{n + 1}}}\n')
    sent = counted(alice)
    items = alice.metrics_of(labels={"experiment": "e1"})
    assert len(sent) == 2, sent  # who alice is (her jobs only), then one page
    assert [(i["job_id"], i["latest"]) for i in items] == [
        (ids[0], {"loss": 0.1}),
        (ids[1], {"loss": 0.2}),
        (ids[2], {}),
    ]
    assert [i["job_id"] for i in alice.metrics_of(ids[1:])] == ids[1:]
    code, out = run(world, server_url, "alice", "metrics", "-l", "experiment=e1")
    assert code == 0 and "3 jobs" in out, out
    assert re.search(rf"^\s*{ids[1]}\s+queued\s+trial=1\s+4\s+0\.2\s*$", out, re.M), out


def test_iter_jobs_pages_through_every_trial(world: World, alice: Client) -> None:
    ids = trials(alice, 105)
    other = trials(alice, 2, "e2")
    sent = counted(alice)
    assert [j["id"] for j in alice.iter_jobs(labels={"experiment": "e1"})] == ids
    assert len(sent) == 2, sent  # pages of 100
    assert [j["id"] for j in alice.iter_jobs(labels={"experiment": "e2"}, state="queued")] == other


def test_labels_added_at_submit_by_the_sdk_and_the_cli(
    world: World, server_url: str, alice: Client, tmp_path: Path
) -> None:
    job = alice.submit(
        {**SIMPLE_JOB, "labels": {"experiment": "e1", "trial": 1}}, labels={"trial": 2, "lr": 0.1}
    )
    assert job["labels"] == {"experiment": "e1", "trial": "2", "lr": "0.1"}
    copy = alice.submit_from_job(job["id"], labels={"trial": 3})
    assert copy["labels"] == {"experiment": "e1", "trial": "3", "lr": "0.1"}
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: sweep\ncommand: 'true'\nresources: {memory: 256MiB}\nlabels: {experiment: s1}\n")
    code, out = run(
        world, server_url, "alice", "submit", str(spec), "-l", "lr=0.01", "-l", "trial=4", "-o", "json"
    )
    assert code == 0 and json.loads(out)["labels"] == {"experiment": "s1", "lr": "0.01", "trial": "4"}, out
    code, out = run(
        world, server_url, "alice", "submit", "--from-job", str(job["id"]), "-l", "trial=5", "-o", "json"
    )
    assert code == 0 and json.loads(out)["labels"]["trial"] == "5", out
    code, out = run(world, server_url, "alice", "submit", str(spec), "-l", "trial")
    assert code == 1 and "label 'trial' has no value: give -l trial=VALUE" in out, out
    code, out = run(world, server_url, "alice", "submit", str(spec), "-l", "lr=a b")
    assert code == 1 and "label 'lr': value 'a b' must be" in out, out


def delete_row(world: World, job_id: int) -> None:
    """The job gone as a purge leaves it (a deleted job's id lists nothing)."""
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        db.delete(job)
        db.commit()


def test_waiting_on_a_job_deleted_meanwhile_says_so(world: World, alice: Client) -> None:
    ids = trials(alice, 2)
    later = threading.Timer(0.3, delete_row, (world, ids[0]))
    later.start()
    try:
        with pytest.raises(CorralError, match=f"job {ids[0]} was deleted while waited on"):
            alice.wait_any(ids, timeout_s=10, poll_s=0.05)  # was: waited on until the timeout
    finally:
        later.join()
    end(world, [ids[1]])
    more = trials(alice, 2, "e2")
    end(world, more)
    delete_row(world, more[0])
    with pytest.raises(CorralError, match=f"no job with id {more[0]}"):
        alice.wait_all(more, timeout_s=1)

    def end_and_delete() -> None:
        end(world, [third])
        delete_row(world, third)

    third, fourth = trials(alice, 2, "e3")
    end(world, [fourth])
    later = threading.Timer(0.3, end_and_delete)
    later.start()
    try:
        with pytest.raises(CorralError, match=f"job {third} was deleted while waited on"):
            alice.wait_all([third, fourth], timeout_s=10, poll_s=0.05)  # was: [fourth] alone
    finally:
        later.join()


def test_sets_by_label_are_the_callers_own_unless_asked(
    world: World, server_url: str, alice: Client, settings: Settings
) -> None:
    mine = trials(alice, 1)
    with Client(server_url, world.as_("bob")["Authorization"].split()[1]) as bob:  # vision's admin
        bobs = trials(bob, 1)
        assert [i["job_id"] for i in bob.metrics_of(labels={"experiment": "e1"})] == bobs
        assert [i["job_id"] for i in bob.metrics_of(labels={"experiment": "e1"}, user="alice")] == mine
        every = bob.metrics_of(labels={"experiment": "e1"}, all_users=True)
        assert [i["job_id"] for i in every] == [*mine, *bobs]
        end(world, bobs)
        assert [j["id"] for j in bob.wait_all(labels={"experiment": "e1"}, timeout_s=1)] == bobs
        with pytest.raises(TimeoutError, match="1 of the jobs"):
            bob.wait_all(labels={"experiment": "e1"}, all_users=True, timeout_s=0)
        with pytest.raises(CorralError, match="user or all_users, not both"):
            bob.metrics_of(labels={"experiment": "e1"}, user="alice", all_users=True)
        with pytest.raises(CorralError, match="user and all_users go with labels"):
            bob.wait_all(mine, user="alice")
        assert bob.cancel_by_labels({"experiment": "e1"})["matched"] == 0  # his own has ended
        assert alice.job(mine[0])["state"] == "queued"
        done = bob.cancel_by_labels({"experiment": "e1"}, user="alice")
        assert [i["id"] for i in done["items"]] == mine and done["more"] is False
    code, out = run(world, server_url, "alice", "cancel", "-l", "experiment=e1", "--all-users")
    assert code == 1 and "only admins and group admins act on other users' jobs" in out, out
    code, out = run(world, server_url, "alice", "cancel", "1", "--user", "bob")
    assert code == 1 and "--user and --all-users go with -l" in out, out
    carols = world.client.post(
        "/api/v1/jobs", json={**SIMPLE_JOB, "labels": {"experiment": "e1"}}, headers=world.as_("carol")
    ).json()["id"]
    code, out = run(world, server_url, "bob", "cancel", "-l", "experiment=e1", "--all-users")
    assert code == 0 and "0 live jobs (every user's) with experiment=e1" in out, out
    code, out = run(world, server_url, "admin", "cancel", "-l", "experiment=e1", "--user", "carol")
    assert code == 0 and f"job {carols} cancelled" in out and "1 live job of carol" in out, out
    code, out = run(world, server_url, "admin", "metrics", "-l", "experiment=e1", "--all-users")
    assert code == 0 and "3 jobs" in out, out


def test_a_members_reads_by_label_widen_only_to_the_jobs_they_can_see(
    world: World, server_url: str, alice: Client
) -> None:
    """README "AutoML tools": for `metrics_of`, `wait_all` and `corral metrics -l`, `user=` and
    `all_users=` only widen the filter to what the caller can see, as a listing does; nobody is
    refused (cancel, hold and release by label are: 403). A member (alice) sees her own jobs
    only, so her `all_users` is them and her `user="bob"` is no job."""
    mine = trials(alice, 1)
    others = {}
    for name in ("bob", "carol"):  # vision's admin; an nlp member
        with Client(server_url, world.as_(name)["Authorization"].split()[1]) as client:
            others[name] = trials(client, 1)[0]
    every = alice.metrics_of(labels={"experiment": "e1"}, all_users=True)
    assert [i["job_id"] for i in every] == mine
    assert alice.metrics_of(labels={"experiment": "e1"}, user="bob") == []
    end(world, mine)  # bob's and carol's stay queued: a wait for them would time out
    waited = alice.wait_all(labels={"experiment": "e1"}, all_users=True, timeout_s=1)
    assert [j["id"] for j in waited] == mine
    with pytest.raises(CorralError, match="no job of bob you can see carries the labels"):
        alice.wait_all(labels={"experiment": "e1"}, user="bob", timeout_s=0)
    code, out = run(world, server_url, "alice", "metrics", "-l", "experiment=e1", "--all-users")
    assert code == 0 and "1 job" in out and str(mine[0]) in out, out
    assert not {str(i) for i in others.values()} & set(out.split()), out
    code, out = run(world, server_url, "alice", "metrics", "-l", "experiment=e1", "--user", "carol")
    assert code == 0 and "0 jobs" in out, out
