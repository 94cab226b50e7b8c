"""Workspaces through the API (SQLite and PostgreSQL): create starts a job of kind `workspace`
through the normal job path; stop/start/rm; bad input answers a clear 4xx and leaves nothing
behind; POST /jobs refuses the kind; the JupyterLab credential is never in an answer."""

from __future__ import annotations

import html
import time

import asyncssh
import pytest
import sqlalchemy as sa

from corral.config import Settings
from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import Job, User
from corral.db.workspace_models import Workspace
from corral.diagnosis.exitspec import Facts, load_exit_spec
from corral.diagnosis.record import record, retry_rule
from corral.environments.service import lock_packages
from corral.server.context import ServerContext
from corral.server.finish import end_attempt
from corral.services import accounts, workspaces
from corral.services.auth import load_principal
from corral.services.lifecycle import AttemptState, settle_failure
from corral.workspaces import proxy
from tests.api.conftest import World
from tests.api.helpers import add_node, make_running
from tests.api.test_cli import run, server_url
from tests.server.fakes import FakeEngine
from tests.server.test_snapshot_queries import statements

__all__ = ["server_url"]
API = "/api/v1/workspaces"


def counts(world: World) -> tuple[int, int]:
    with world.session_factory() as db:
        return db.scalar(sa.select(sa.func.count(Workspace.id))) or 0, db.scalar(
            sa.select(sa.func.count(Job.id))
        ) or 0


def test_a_workspace_over_its_groups_guarantee_is_refused_saying_what_to_change(world: World) -> None:
    """A workspace in a group that guarantees no GPUs was refused with the quota check's words
    for jobs: "this job can never run ... the job is not preemptible", naming no workspace and
    no way out (the README's `corral ws create nb --gpus 1` did this for the demo's admin)."""
    with world.session_factory() as db:
        add_node(db, gpus=2, model="A100")
        db.commit()
    before = counts(world)
    r = world.client.post(API, json={"name": "nb", "gpus": 1}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body"]  # not the field `tasks` of a job spec nobody wrote
    assert error["msg"].startswith("workspace 'nb' can never run under group vision's quota: it needs 1 GPU")
    assert "not preemptible" in error["msg"]
    assert error["msg"].endswith(
        "A workspace is never preemptible: its GPUs must be ones its group guarantees. "
        "Pick a group that guarantees them (--group) or ask for fewer (--gpus)"
    )
    assert counts(world) == before


def test_a_stopped_workspace_that_could_never_start_is_refused_at_create(world: World) -> None:
    """Created stopped (`corral ws create --stopped`), a workspace larger than its group's quota
    could ever admit, or than any node, was accepted and refused only at each start: create
    applies the submit-time fit check a start applies, with the same words."""
    with world.session_factory() as db:
        add_node(db, gpus=2, model="A100")
        db.commit()
    before = counts(world)
    for body, says in (
        ({"gpus": 1}, "workspace 'nb' can never run under group vision's quota: it needs 1 GPU"),
        ({"gpus": 4}, "workspace 'nb' can never run on this cluster: "),
    ):
        started = world.client.post(API, json={"name": "nb", **body}, headers=world.as_("alice"))
        stopped = world.client.post(
            API, json={"name": "nb", **body, "start": False}, headers=world.as_("alice")
        )
        assert stopped.status_code == 422, stopped.text
        assert stopped.json()["detail"] == started.json()["detail"], (started.text, stopped.text)
        [error] = stopped.json()["detail"]
        assert error["loc"] == ["body"] and error["msg"].startswith(says), error
    assert counts(world) == before
    ok = world.client.post(API, json={"name": "nb", "start": False}, headers=world.as_("alice"))
    assert ok.status_code == 201 and ok.json()["state"] == "stopped", ok.text  # no GPU: fits


def test_a_removed_workspaces_id_is_never_given_to_another(world: World) -> None:
    """On SQLite the next workspace took max(id)+1, so after alice's `ws rm` bob's new workspace
    had her old id: her JupyterLab URL (/ws/<id>/lab), her jobs' base URL and her audit entries
    then named his (migration 0033_workspace_ids)."""
    c = world.client
    first = c.post(API, json={"name": "nb", "start": False}, headers=world.as_("alice"))
    assert first.status_code == 201, first.text
    assert c.delete(f"{API}/nb", headers=world.as_("alice")).status_code in (200, 204)
    second = c.post(API, json={"name": "nb", "start": False}, headers=world.as_("carol"))
    assert second.status_code == 201, second.text
    assert second.json()["id"] > first.json()["id"]
    assert second.json()["url"] != first.json()["url"]


def test_workspace_lifecycle_and_bad_input(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, gpus=2, model="A100")
        db.commit()
    c, alice = world.client, world.as_("alice")
    # Not preemptible: a workspace needs the group's guarantee, like any non-preemptible job.
    quota = {"gpu_model": "*", "guaranteed": 1}
    assert c.put("/api/v1/groups/vision/quota", json=quota, headers=world.as_("admin")).status_code == 200
    r = c.post(API, json={"name": "nb", "gpus": 1, "memory": "2GiB", "idle_timeout": "30m"}, headers=alice)
    assert r.status_code == 201, r.text
    ws = r.json()
    assert ws["state"] == "pending" and ws["job_id"] and ws["url"] == f"/ws/{ws['id']}/lab"
    assert ws["ssh_user"] == "alice+nb" and ws["ssh_port"] == 2222 and ws["idle_timeout_s"] == 1800
    with world.session_factory() as db:
        job = db.get(Job, ws["job_id"])
        token = db.scalar(sa.select(Workspace.jupyter_token).where(Workspace.id == ws["id"]))
        assert job is not None and job.spec.kind == "workspace" and not job.preemptible
        assert job.spec.view.tasks[0].resources.gpus == 1 and job.spec.idle_gpu is not None
        assert workspaces.current_job_id(db, "alice", "nb") is None  # queued, not running
    job_json = c.get(f"/api/v1/jobs/{ws['job_id']}", headers=alice).text
    assert token and token not in job_json and token not in r.text

    # Duplicate name, unknown, does not fit, bad fields: 4xx naming it, nothing half-created.
    before = counts(world)
    dup = c.post(API, json={"name": "nb"}, headers=alice)
    assert dup.status_code == 409 and "already have a workspace named 'nb'" in dup.json()["detail"]
    big = c.post(API, json={"name": "big", "gpus": 8}, headers=alice)
    assert big.status_code == 422 and "never run" in str(big.json()["detail"])
    bad = c.post(API, json={"name": "x", "idle_timeout": "soon"}, headers=alice)
    assert bad.status_code == 422 and "idle_timeout" in str(bad.json()["detail"])
    env = c.post(API, json={"name": "e", "environment": "nope"}, headers=alice)  # as POST /jobs
    assert env.status_code == 422 and "environment 'nope' does not exist" in env.text, env.text
    assert counts(world) == before
    assert c.get(f"{API}/nope", headers=alice).status_code == 404
    assert c.get(f"{API}/nb", headers=world.as_("carol")).status_code == 404  # carol's own: none
    assert c.get(f"{API}/nb", params={"user": "alice"}, headers=world.as_("carol")).status_code == 403
    assert c.get(f"{API}/nb", params={"user": "alice"}, headers=world.as_("admin")).status_code == 200
    kind = c.post("/api/v1/jobs", json={"name": "j", "command": "true", "kind": "workspace"}, headers=alice)
    assert kind.status_code == 422 and "corral ws start" in str(kind.json()["detail"])

    # Start while pending: 409; stop cancels the job; stop again: 409; start makes a new job.
    assert c.post(f"{API}/nb/start", headers=alice).status_code == 409
    stopped = c.post(f"{API}/nb/stop", headers=alice)
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert c.post(f"{API}/nb/stop", headers=alice).status_code == 409
    again = c.post(f"{API}/nb/start", headers=alice).json()
    assert again["job_id"] != ws["job_id"] and again["state"] == "pending"
    assert [w["name"] for w in c.get(API, headers=alice).json()] == ["nb"]

    # The group maximum caps the idle timeout; a longer one is refused.
    pol = c.put(f"{API}/policies/vision", json={"max_idle_timeout": "1h"}, headers=world.as_("admin"))
    assert pol.status_code == 200 and pol.json()["max_idle_timeout_s"] == 3600
    assert c.put(f"{API}/policies/vision", json={"max_idle_timeout": "1h"}, headers=alice).status_code == 403
    long = c.post(API, json={"name": "long", "idle_timeout": "2h"}, headers=alice)
    assert long.status_code == 422, long.text
    assert long.json()["detail"][0]["msg"] == (
        "idle_timeout 2h is more than group vision's maximum, 1h (the group's): ask for 1h or less"
    )

    assert c.delete(f"{API}/nb", headers=alice).status_code == 204
    assert c.get(f"{API}/nb", headers=alice).status_code == 404
    with world.session_factory() as db:
        assert db.get(Job, again["job_id"]).state == "cancelled"  # type: ignore[union-attr]


def test_a_workspace_name_that_reads_as_a_job_login_is_refused(world: World) -> None:
    """The SSH gateway reads `alice+job-5` as alice's job 5: a workspace named `job-5` (its
    ssh_user `alice+job-5`) could never be reached by its name, and its SSH command, in the
    portal and `corral ws show`, would enter another job of alice's."""
    before = counts(world)
    r = world.client.post(API, json={"name": "job-5", "start": False}, headers=world.as_("alice"))
    assert r.status_code == 422 and "alice+job-5" in str(r.json()["detail"])
    assert counts(world) == before
    for fine in ("job-x", "job-5b", "myjob-5"):  # not a job login: a workspace like any other
        made = world.client.post(API, json={"name": fine, "start": False}, headers=world.as_("alice"))
        assert made.status_code == 201, made.text
        assert made.json()["ssh_user"] == f"alice+{fine}"


def test_an_environment_without_jupyterlab_is_refused_at_create(world: World) -> None:
    """A workspace in an environment whose lock holds neither JupyterLab nor Corral (the demo's
    `sklearn`) was accepted, and its job then failed at start (`No module named 'corral'`). The
    version's lock is recorded when it is built: refused at create, naming what is missing."""
    now = time.time()
    with world.session_factory() as db:
        add_node(db, gpus=0)
        alice = db.scalars(sa.select(User).where(User.name == "alice")).one()
        env = Environment(
            name="tools", owner_id=alice.id, visibility="private", created_at=now, last_version=2
        )
        db.add(env)
        db.flush()
        locks = {
            1: "numpy==2.1.0\n    # via -r requirements.in\nscikit-learn==1.5.2\n",
            2: "corral==0.1.0\njupyterlab==4.2.5\n    # via -r requirements.in\nnumpy==2.1.0\n",
        }
        for version, lock in locks.items():
            db.add(EnvironmentVersion(
                environment_id=env.id, version=version, state="ready", source_kind="requirements",
                source="x\n", python="3.11.7", created_by="alice", created_at=now, lock=lock,
            ))  # fmt: skip
        db.commit()
    c, alice_h = world.client, world.as_("alice")
    before = counts(world)
    r = c.post(API, json={"name": "nb", "environment": "tools@1"}, headers=alice_h)
    assert r.status_code == 422, r.text
    assert "environment 'tools@1' cannot run a workspace: its packages lack jupyterlab and corral" in r.text
    assert "corral env create tools -r FILE" in r.text and "pick another environment" in r.text
    assert counts(world) == before
    # Created stopped (`corral ws create --stopped`), it was accepted, and refused only at its
    # first start: the same checks now, with nothing created.
    for environment, says in (
        ("tools@1", "cannot run a workspace"),
        ("nope", "environment 'nope' does not exist"),
    ):
        body = {"name": "nb", "environment": environment, "start": False}
        r = c.post(API, json=body, headers=alice_h)
        assert r.status_code == 422 and says in r.text, r.text
    assert counts(world) == before
    r = c.post(API, json={"name": "nb", "environment": "tools"}, headers=alice_h)  # its newest: @2
    assert r.status_code == 201, r.text
    with world.session_factory() as db:
        job = db.get(Job, r.json()["job_id"])
        assert job is not None and job.spec.environment == "tools@2"
    assert lock_packages("Jupyter_Lab[all]==4\n# c\n--index-url x\nfoo @ https://x/foo.whl\n") == {
        "jupyter-lab",
        "foo",
    }


def test_listing_workspaces_reads_as_many_statements_for_many_as_for_one(
    world: World, settings: Settings
) -> None:
    """`corral ws ls` read each workspace's job, its group's idle policy and (for a cancelled job)
    its idle stop one query at a time: one read now, with each row's answer as before."""
    with world.session_factory() as db:
        add_node(db, gpus=0)
        db.commit()
    c, admin = world.client, world.as_("admin")
    ctx = ServerContext(
        settings=settings, session_factory=world.session_factory, engine=FakeEngine(), owner_id="t"
    )

    def listed(user: str, **which: bool) -> tuple[dict[str, workspaces.WorkspaceView], list[str]]:
        with world.session_factory() as db:
            principal = load_principal(db, accounts.user_by_name(db, user), via="token")
            with statements(ctx) as seen:
                views = workspaces.list_workspaces(db, principal, settings, **which)
        return {f"{v['user']}/{v['name']}": v for v in views}, seen

    assert c.post(API, json={"name": "first"}, headers=world.as_("alice")).status_code == 201
    one, one_read = listed("admin", all_users=True)
    assert list(one) == ["alice/first"] and one["alice/first"]["state"] == "pending"
    assert len(one_read) == 1 and one_read[0].startswith("SELECT"), one_read

    # Two groups (vision with an idle policy, nlp without), a workspace never started, one stopped
    # by hand and one the idle policy stopped.
    assert (
        c.put(f"{API}/policies/vision", json={"default_idle_timeout": "45m"}, headers=admin).status_code
        == 200
    )
    for user, name, start in (("alice", "cold", False), ("alice", "idle", True), ("bob", "nb", True),
                              ("carol", "nb", True), ("carol", "by-hand", True)):  # fmt: skip
        made = c.post(API, json={"name": name, "start": start}, headers=world.as_(user))
        assert made.status_code == 201, made.text
    assert c.post(f"{API}/by-hand/stop", headers=world.as_("carol")).status_code == 200
    idle = c.post(f"{API}/idle/stop", headers=world.as_("alice")).json()
    with world.session_factory() as db:  # as corral.monitor.idle records its stop
        workspaces.record_idle_stop(db, idle["job_id"], 0.5, 1_800_000_000.0)
        db.commit()

    many, many_read = listed("admin", all_users=True)
    assert len(many) == 6 and len(many_read) == len(one_read), many_read
    assert [many[k]["idle_stopped_at"] for k in sorted(many)] == [
        None,
        None,
        1_800_000_000.0,
        None,
        None,
        None,
    ]
    assert many["alice/idle"]["state"] == "stopped" and many["alice/idle"]["reclaimed_gpu_hours"] == 0.5
    assert many["alice/cold"]["job_id"] is None and many["alice/cold"]["state"] == "stopped"
    assert many["carol/by-hand"]["job_state"] == "cancelled" and many["bob/nb"]["state"] == "pending"
    assert {k: v["idle_timeout_s"] for k, v in many.items() if k != "alice/first"} == {
        "alice/cold": 2700, "alice/idle": 2700, "bob/nb": 2700,
        "carol/by-hand": settings.workspace_idle_timeout_s, "carol/nb": settings.workspace_idle_timeout_s,
    }  # fmt: skip
    own, own_read = listed("alice")  # a member's own: the same one read
    assert sorted(own) == ["alice/cold", "alice/first", "alice/idle"] and len(own_read) == 1
    # Each answer as the one workspace's (GET /workspaces/{name}) gives it, and the API says so.
    for key, view in many.items():
        user, name = key.split("/")
        alone = c.get(f"{API}/{name}", params={"user": user}, headers=admin).json()
        assert {k: alone[k] for k in ("state", "job_id", "idle_timeout_s", "idle_stopped_at")} == {
            k: view[k] for k in ("state", "job_id", "idle_timeout_s", "idle_stopped_at")
        }, key
    assert c.get(API, headers=world.as_("alice")).json()[2]["idle_stopped_at"] == 1_800_000_000.0


def test_a_failed_workspace_says_why_in_the_api_and_ws_show(world: World, server_url: str) -> None:
    """`corral ws show` of a workspace whose job failed said `stopped` and `job N (failed)`, not
    why: the job's reason is its `failure`, settled here as the dispatch loop settles a start
    that did not launch."""
    with world.session_factory() as db:
        add_node(db)
        db.commit()
    created = world.client.post(API, json={"name": "nb"}, headers=world.as_("alice"))
    assert created.status_code == 201, created.text
    assert created.json()["failure"] is None
    job_id = created.json()["job_id"]
    with world.session_factory() as db:
        attempt = make_running(db, job_id, "n1", ())
        db.expire_all()
        job = db.get(Job, job_id)
        assert job is not None
        verdict = load_exit_spec().classify(Facts(frozenset({"launch_failed"}), log_tail="no such image"))
        now = time.time()
        settle_failure(
            db, job, why="launch failed: no such image", now=now, rule=retry_rule(verdict), budget=0
        )
        record(db, job, attempt, verdict, "n1", now, retried=False)
        end_attempt(
            db, job, attempt, AttemptState.FAILED, now, reason=verdict.reason, message="no such image"
        )
        db.commit()
        reason = job.reason
    assert job.state == "failed" and reason.startswith("launch failed: no such image"), reason
    view = world.client.get(f"{API}/nb", headers=world.as_("alice")).json()
    assert (view["state"], view["job_state"], view["failure"]) == ("stopped", "failed", reason)
    code, out = run(world, server_url, "alice", "ws", "show", "nb")
    assert code == 0, out
    words = " ".join(out.split())  # the reason may wrap at 80 columns
    assert f"job {job_id} (failed) failed {reason} `corral show {job_id}` has its attempts" in words, out


def test_the_lab_url_of_a_workspace_not_running_tells_its_owner_whether_it_starts_or_is_stopped(
    world: World,
) -> None:
    """The proxy answered a queued workspace and a stopped one alike, `workspace 3 is not running;
    start it with `corral ws start``: by an id the owner never typed, and telling one whose start
    is under way to start it (a 409). Another user learns neither its name nor its state."""
    with world.session_factory() as db:
        add_node(db)
        db.commit()
    created = world.client.post(API, json={"name": "nb"}, headers=world.as_("alice"))
    assert created.status_code == 201, created.text
    lab, job_id = created.json()["url"], created.json()["job_id"]
    queued = world.client.get(lab, headers=world.as_("alice"), follow_redirects=False)
    assert queued.status_code == 503, queued.text
    assert queued.json()["detail"] == (
        f"workspace 'nb' is starting (job {job_id}): its JupyterLab answers here once it runs; "
        "`corral ws show nb` says why it waits"
    )
    assert world.client.post(f"{API}/nb/stop", headers=world.as_("alice")).status_code == 200
    time.sleep(proxy.NOT_RUNNING_CACHE_S)  # the 503 above is kept that long
    stopped = world.client.get(lab, headers=world.as_("alice"), follow_redirects=False)
    assert stopped.status_code == 503, stopped.text
    assert stopped.json()["detail"] == "workspace 'nb' is stopped; start it with `corral ws start nb`"
    other = world.client.get(lab, headers=world.as_("bob"), follow_redirects=False)
    assert other.status_code == 404 and "'nb'" not in other.text, other.text


def lab_answers(world: World, url: str, user: str) -> list[tuple[int, str, str]]:
    """Status, content type and body of `url` for `user`, as an API client and as a browser."""
    proxy._decisions.clear()  # each answer decided afresh, not the cached one
    out = []
    for accept in ("application/json", "text/html,application/xhtml+xml,*/*;q=0.8"):
        headers = {**world.as_(user), "Accept": accept}
        r = world.client.get(url, headers=headers, follow_redirects=False)
        out.append((r.status_code, r.headers["content-type"], r.text))
    return out


def test_someone_elses_workspace_is_answered_exactly_as_a_missing_one(world: World) -> None:
    """Bob opening alice's lab URL got 403 "belongs to another user", and a missing id 404: ids
    were probeable. A non-owner's answer is now the missing workspace's, byte for byte, as for
    groups hidden from non-members (docs/security.md); an administrator is told whose it is."""
    with world.session_factory() as db:
        add_node(db)
        db.commit()
    created = world.client.post(API, json={"name": "nb", "start": False}, headers=world.as_("alice"))
    assert created.status_code == 201, created.text
    lab = created.json()["url"]
    admin = world.client.get(lab, headers=world.as_("admin"), follow_redirects=False)
    assert admin.status_code == 403 and "belongs to another user" in admin.text, admin.text
    while_there = lab_answers(world, lab, "bob")
    assert world.client.delete(f"{API}/nb", headers=world.as_("alice")).status_code == 204
    once_gone = lab_answers(world, lab, "bob")
    assert while_there == once_gone
    assert [status for status, _, _ in once_gone] == [404, 404]
    ws_id = created.json()["id"]
    assert once_gone[0][2] == f'{{"detail":"there is no workspace {ws_id}"}}'


def test_a_browser_is_refused_with_a_page_linking_to_the_portal_and_an_api_client_with_json(
    world: World,
) -> None:
    """A browser opening the lab URL of a stopped workspace got `{"detail": ...}`: it gets a small
    page saying the same (escaped), with a link to the portal's workspaces."""
    created = world.client.post(API, json={"name": "nb", "start": False}, headers=world.as_("alice"))
    assert created.status_code == 201, created.text
    [(api_status, api_type, api_body), (page_status, page_type, page)] = lab_answers(
        world, created.json()["url"], "alice"
    )
    assert (api_status, api_type) == (503, "application/json")
    message = "workspace 'nb' is stopped; start it with `corral ws start nb`"
    assert api_body == f'{{"detail":"{message}"}}'
    assert page_status == 503 and page_type.startswith("text/html"), page_type
    assert f"<p>{html.escape(message)}</p>" in page and "&#x27;nb&#x27;" in page, page
    assert '<a href="/workspaces">' in page, page


@pytest.mark.parametrize("text", ["abc", "1.0", "+1", "01", "0", "-1", "99999999999999999999", "1e0"])
def test_a_lab_url_whose_id_is_not_a_plain_positive_integer_names_no_workspace(
    world: World, text: str
) -> None:
    """`/ws/abc/lab` answered Pydantic's raw 422, and `/ws/1.0/lab` and `/ws/+1/lab` were read as
    workspace 1: they are answered as a missing workspace, a 404, whoever asks."""
    created = world.client.post(API, json={"name": "nb", "start": False}, headers=world.as_("alice"))
    assert created.status_code == 201 and created.json()["id"] == 1, created.text
    [(status, kind, body), (page_status, _, page)] = lab_answers(world, f"/ws/{text}/lab", "alice")
    assert (status, kind, page_status) == (404, "application/json", 404), body
    assert body == f'{{"detail":"there is no workspace {text}"}}'
    assert "stopped" not in page and "there is no workspace" in page, page


def test_an_idle_timeout_over_the_maximum_is_refused_naming_the_group_and_the_values(world: World) -> None:
    """It said `idle_timeout 2592000s is more than this group's maximum 604800s`: seconds
    nobody typed (`--idle-timeout 30d`), no group, no way out."""
    r = world.client.post(API, json={"name": "nb", "idle_timeout": "30d"}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "idle_timeout"]
    assert error["msg"] == (
        "idle_timeout 30d is more than group vision's maximum, 7d (the server's): ask for 7d or less"
    )


def test_ws_show_and_ls_give_memory_and_idle_timeout_as_they_were_asked_for(
    world: World, server_url: str
) -> None:
    """`corral ws create nb --memory 16GiB --idle-timeout 90m` showed `16384 MiB` and `idle
    timeout 5400 s`: units the user never wrote."""
    with world.session_factory() as db:
        add_node(db)
        db.commit()
    body = {"name": "nb", "memory": "16GiB", "idle_timeout": "90m", "start": False}
    assert world.client.post(API, json=body, headers=world.as_("alice")).status_code == 201
    code, out = run(world, server_url, "alice", "ws", "show", "nb")
    assert code == 0, out
    lines = [line.strip() for line in out.splitlines()]
    assert "resources    no GPU, 1 CPU, 16GiB; environment default" in lines, out
    assert "idle timeout 1h30m" in lines, out
    code, out = run(world, server_url, "alice", "ws", "ls")
    assert code == 0 and out.splitlines()[1].split()[2:7] == ["stopped", "no", "GPU,", "1", "CPU,"], out
    assert "16GiB" in out.splitlines()[1], out


def test_a_name_that_is_not_a_workspace_name_is_refused_in_words(world: World) -> None:
    """`corral ws create Bad/Name` answered "field 'name' 'Bad/Name' does not match pattern
    ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"."""
    before = counts(world)
    r = world.client.post(API, json={"name": "Bad/Name"}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"] == (
        "field 'name' 'Bad/Name' is not a workspace name: up to 63 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit"
    )
    assert counts(world) == before


def test_a_gpu_model_without_gpus_is_refused(world: World) -> None:
    """`corral ws create nb --gpu-model H100` (no --gpus) made a workspace without a GPU, shown as
    `no GPU (H100)`: the model meant nothing, and the user who forgot --gpus was not told."""
    before = counts(world)
    r = world.client.post(API, json={"name": "nb", "gpu_model": "H100"}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "gpu_model"]
    assert error["msg"] == (
        "gpu_model 'H100' chooses the model of the workspace's GPUs, but it asks for none: "
        "ask for some (--gpus N) or leave the model out"
    )
    assert counts(world) == before


def test_a_workspace_larger_than_any_node_is_refused_in_a_workspaces_words(
    world: World, server_url: str
) -> None:
    """`corral ws create nb --gpus 9` said "error: tasks: workspace 'nb' can never run on this
    cluster: task main needs 9 A100 GPUs ...": a job spec's field and task nobody wrote."""
    with world.session_factory() as db:
        add_node(db, gpus=2, model="A100")
        db.commit()
    code, out = run(world, server_url, "alice", "ws", "create", "nb", "--gpus", "9")
    assert code == 1, out
    assert " ".join(out.split()).startswith(
        "error: workspace 'nb' can never run on this cluster: it needs 9 A100 GPUs"
    ), out


def test_ws_ssh_says_what_is_missing_before_it_runs_ssh(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral ws ssh nb` ran ssh whatever the state: a user with no key registered got only
    OpenSSH's "Permission denied (publickey)", and a stopped workspace a gateway login first."""

    def no_ssh(program: str, argv: list[str]) -> None:  # it would replace this process
        raise SystemExit(f"ran {argv}")

    monkeypatch.setattr("corral.cli.workspaces.os.execv", no_ssh)
    body = {"name": "nb", "start": False}
    assert world.client.post(API, json=body, headers=world.as_("alice")).status_code == 201
    code, out = run(world, server_url, "alice", "ws", "ssh", "nb")
    assert code == 1, out
    assert " ".join(out.split()) == (
        "error: you have no SSH key registered, so the gateway lets none of yours in: "
        "`corral key add ~/.ssh/id_ed25519.pub` first (`corral key ls` lists them)"
    )
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    added = world.client.post(
        "/api/v1/ssh-keys", json={"name": "laptop", "public_key": key}, headers=world.as_("alice")
    )
    assert added.status_code == 201, added.text
    code, out = run(world, server_url, "alice", "ws", "ssh", "nb")
    assert code == 1, out
    assert " ".join(out.split()) == "error: workspace 'nb' is stopped: start it with `corral ws start nb`"


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--gpus", "-1", "Invalid value for '--gpus': -1 is not a number of GPUs from 0 (none) to 64"),
        ("--gpus", "65", "Invalid value for '--gpus': 65 is not a number of GPUs from 0 (none) to 64"),
        ("--cpus", "0", "Invalid value for '--cpus': 0 is not a number of CPU cores over 0 and up to 1024"),
        ("--cpus", "-2", "Invalid value for '--cpus': -2 is not a number of CPU cores over 0 and up to 1024"),
        ("--cpus", "nan", "Invalid value for '--cpus': nan is not a number of CPU cores over 0 and up to"),
    ],
)
def test_ws_create_refuses_gpus_and_cpus_out_of_range_naming_the_option(
    world: World, server_url: str, option: str, value: str, says: str
) -> None:
    """`corral ws create --gpus -1` and `--cpus 0` answered Pydantic's "Input should be greater
    than or equal to 0", naming no option: the CLI refuses them (usage error, exit 2) in words."""
    before = counts(world)
    code, out = run(world, server_url, "alice", "ws", "create", "nb", option, value)
    words = " ".join(line.strip("│╭╰─ ") for line in out.splitlines())  # the box wraps at 80
    assert code == 2 and says in " ".join(words.split()), out
    assert counts(world) == before
    code, out = run(world, server_url, "alice", "ws", "create", "nb", "--cpus", "0.5", "--stopped")
    assert code == 0 and "1 CPU" not in out and "0.5 CPU" in out, out
