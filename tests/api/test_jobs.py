"""Jobs through the API: validation (422 with field paths), fit check, group rules, visibility,
filters, sorting, pagination and cancel in every state."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import pytest
import sqlalchemy as sa

from corral.api.schemas import JobListOut, JobOut
from corral.config import Settings
from corral.db.models import Job
from corral.spec import JobSpecV1
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.helpers import add_node, job_state, make_running

JOBS = "/api/v1/jobs"


def submit(world: World, user: str, spec: dict[str, Any] | str, **headers: str) -> Any:
    if isinstance(spec, str):
        return world.client.post(
            JOBS, content=spec, headers={**world.as_(user), **headers, "Content-Type": "application/yaml"}
        )
    return world.client.post(JOBS, json=spec, headers=world.as_(user))


def errors_of(response: Any) -> dict[tuple[Any, ...], str]:
    assert response.status_code == 422, response.text
    return {tuple(e["loc"]): e["msg"] for e in response.json()["detail"]}


BAD_SPECS = [
    ({**SIMPLE_JOB, "name": "x" * 129}, ("body", "name"), "at most 128 characters"),
    ({**SIMPLE_JOB, "name": "has space"}, ("body", "name"), "match pattern"),
    ({**SIMPLE_JOB, "command": "x" * 20_000}, ("body", "tasks", "main", "command"), "at most 16384"),
    (
        {**SIMPLE_JOB, "resources": {"memory": "12XB"}},
        ("body", "tasks", "main", "resources", "memory"),
        "is not a size such as",
    ),
    (
        {**SIMPLE_JOB, "resources": {"gpu_model": "A100||"}},
        ("body", "tasks", "main", "resources", "gpu_model"),
        "alternatives like",
    ),
    ({**SIMPLE_JOB, "instances": 65}, ("body", "tasks", "main", "instances"), "less than or equal to 64"),
    ({**SIMPLE_JOB, "max_runtime": "soon"}, ("body", "max_runtime"), "is not a duration"),
    ({**SIMPLE_JOB, "env": {"BIG": "x" * 70_000}}, ("body", "env"), "bytes; at most 65536"),
    ({**SIMPLE_JOB, "env": {"1BAD": "x"}}, ("body", "env"), "must be letters, digits"),
    ({**SIMPLE_JOB, "retires": 2}, ("body", "retires"), "unknown field 'retires'"),
    ({**SIMPLE_JOB, "priority": "urgent"}, ("body", "priority"), "'low', 'normal' or 'high'"),
    # both forms named: a spec of one task may give `command` at the top level instead
    (
        {"name": "no-tasks"},
        ("body", "tasks"),
        "the field 'tasks' is required (or, for a job of one task, 'command' at the top level)",
    ),
    (
        {
            "name": "t",
            "tasks": {"a": {"command": "x", "instances": 40}, "b": {"command": "y", "instances": 40}},
        },
        ("body", "tasks"),
        "80 instances over all tasks",
    ),
]


@pytest.mark.parametrize(
    ("spec", "loc", "text"), BAD_SPECS, ids=[str(b[1][-1]) + str(i) for i, b in enumerate(BAD_SPECS)]
)
def test_bad_specs_get_422_with_field_path_and_sentence(
    world: World, spec: dict[str, Any], loc: tuple[Any, ...], text: str
) -> None:
    errors = errors_of(submit(world, "alice", spec))
    assert loc in errors, errors
    assert text in errors[loc]
    with world.session_factory() as db:  # nothing half-written
        assert db.scalar(sa.select(sa.func.count(Job.id))) == 0


def test_yaml_body_and_yaml_errors(world: World) -> None:
    yaml_spec = """
name: cifar
priority: high
retries: 2
max_runtime: 6h
tasks:
  trainer:
    instances: 2
    resources: {gpus: 1, gpu_model: "A100|H100", cpus: 2, memory: 4GiB}
    command: python train.py
env: {EPOCHS: "10"}
"""
    r = submit(world, "alice", yaml_spec)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["priority"] == "high" and job["retries"] == 2
    assert job["spec"]["tasks"]["trainer"]["resources"]["memory"] == 4096
    assert job["spec"]["group"] == "vision"
    bad = errors_of(submit(world, "alice", "name: [unclosed"))
    assert "not valid YAML at line 1" in bad[("body",)]
    assert "must be a mapping" in errors_of(submit(world, "alice", "- a\n- b\n"))[("body",)]
    r = world.client.post(
        JOBS, content=b"{not json", headers={**world.as_("alice"), "Content-Type": "application/json"}
    )
    assert "not valid JSON" in errors_of(r)[("body",)]


def test_group_rules(world: World) -> None:
    assert submit(world, "carol", SIMPLE_JOB).json()["group"] == "nlp"  # default group
    r = submit(world, "carol", {**SIMPLE_JOB, "group": "vision"})  # not hers: as if it did not exist
    assert r.status_code == 404 and r.json()["detail"] == "no group named 'vision'", r.text
    r = submit(world, "alice", {**SIMPLE_JOB, "group": "nope"})  # a name that does not exist: 404
    assert r.status_code == 404 and "no group named 'nope'" in r.json()["detail"]


def test_job_that_can_never_fit_is_refused(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2, model="A100")
        db.commit()
    too_big = {"name": "big", "command": "x", "resources": {"gpus": 4}}
    assert "the largest node has 2 such GPUs" in errors_of(submit(world, "alice", too_big))[("body", "tasks")]
    wrong_model = {"name": "m", "command": "x", "resources": {"gpus": 1, "gpu_model": "H100"}}
    assert "this cluster has A100" in errors_of(submit(world, "alice", wrong_model))[("body", "tasks")]
    ok = {"name": "ok", "command": "x", "resources": {"gpus": 2, "gpu_model": "V100|A100"}}
    assert submit(world, "alice", ok).status_code == 201
    # GPUs that fit, memory that does not: said so (it said "the largest node has 2 such GPUs")
    too_much = {"name": "mem", "command": "x", "resources": {"gpus": 1, "memory": "80GiB"}}
    assert errors_of(submit(world, "alice", too_much))[("body", "tasks")].endswith(
        "task main needs 1 A100 GPU, 1 CPU and 81920 MiB on one node; "
        "nodes with 1 such GPU have at most 16 CPUs and 65536 MiB"
    )


def test_a_node_registered_a_moment_ago_counts_for_the_fit_check(world: World) -> None:
    """Node shapes are cached for the fit check, but a refusal is always re-checked against the
    database: right after a bigger node registers, a job that needs it is accepted."""
    with world.session_factory() as db:
        add_node(db, "small", gpus=2, model="A100")
        db.commit()
    needs_four = {"name": "four", "command": "x", "resources": {"gpus": 4}}
    refused = errors_of(submit(world, "alice", needs_four))[("body", "tasks")]
    assert "the largest node has 2 such GPUs" in refused
    with world.session_factory() as db:  # within the cache's trusted second
        add_node(db, "big", gpus=4, model="A100")
        db.commit()
    assert submit(world, "alice", needs_four).status_code == 201


def test_visibility_filters_sorting_and_pagination(world: World) -> None:
    for i in range(7):
        assert submit(world, "alice", {**SIMPLE_JOB, "name": f"a{i}"}).status_code == 201
    for i in range(3):
        assert submit(world, "carol", {**SIMPLE_JOB, "name": f"c{i}"}).status_code == 201

    def page(who: str, **params: Any) -> Any:
        r = world.client.get(JOBS, params=params, headers=world.as_(who))
        assert r.status_code == 200, r.text
        return r.json()

    assert page("alice")["total"] == 7
    assert page("carol")["total"] == 3
    assert page("bob")["total"] == 7  # bob administers vision
    assert page("admin")["total"] == 10
    assert page("carol", user="alice")["total"] == 0  # a filter never widens what one may see
    assert page("admin", group="nlp")["total"] == 3
    assert page("admin", user="alice", group="nlp")["total"] == 0
    # A name that does not exist: an admin (who may see every name) is told, naming it; it listed
    # no job, as if the name were right (`corral ls --user alcie`). Others get no job, as for a
    # name they may not see, so that the answer does not say which names exist.
    r = world.client.get(JOBS, params={"user": "alcie"}, headers=world.as_("admin"))
    assert errors_of(r) == {("query", "user"): "no user named 'alcie'"}
    r = world.client.get(JOBS, params={"group": "visoin"}, headers=world.as_("admin"))
    assert errors_of(r) == {("query", "group"): "no group named 'visoin'"}
    # Both wrong at once: both named in the one refusal, each at its own field (not the user first
    # and the group after, nor the group's message under the user's field)
    r = world.client.get(JOBS, params={"user": "alcie", "group": "visoin"}, headers=world.as_("admin"))
    assert errors_of(r) == {
        ("query", "user"): "no user named 'alcie'",
        ("query", "group"): "no group named 'visoin'",
    }
    assert page("alice", user="alcie")["total"] == page("alice", group="visoin")["total"] == 0
    assert page("carol", group="vision")["total"] == 0  # exists, not hers: the same answer
    names = [j["name"] for j in page("alice", sort="name", order="asc")["items"]]
    assert names == sorted(names)
    newest = page("admin", limit=4)
    assert [j["name"] for j in newest["items"]] == ["c2", "c1", "c0", "a6"]
    assert newest["total"] == 10
    seen = [j["id"] for off in (0, 4, 8) for j in page("admin", limit=4, offset=off)["items"]]
    assert len(seen) == len(set(seen)) == 10
    first = page("admin", limit=1)["items"][0]["id"]
    world.client.post(f"{JOBS}/{first}/cancel", headers=world.as_("admin"))
    assert page("admin", state="cancelled")["total"] == 1
    assert page("admin", state="queued,cancelled")["total"] == 10
    # The schema names the states and sort keys (a pattern, an enum), so the models refuse others;
    # an unknown state is named, with the states (not the pattern: `corral ls --state` prints it).
    r = world.client.get(JOBS, params={"state": "sleeping"}, headers=world.as_("admin"))
    assert "'sleeping': states are queued, scheduled" in errors_of(r)[("query", "state", 0)]
    r = world.client.get(JOBS, params={"sort": "password"}, headers=world.as_("admin"))
    assert "'created_at'" in errors_of(r)[("query", "sort")]
    r = world.client.get(JOBS, params={"limit": 5000}, headers=world.as_("admin"))
    assert r.status_code == 422


def test_listing_stays_fast_at_100k_jobs(world: World) -> None:
    with world.session_factory() as db:
        user_id, group_id = db.execute(
            sa.text("SELECT u.id, g.id FROM users u, groups g WHERE u.name='alice' AND g.name='vision'")
        ).one()
        now = time.time()
        spec = JobSpecV1.model_validate({"name": "j", "command": "true"})
        states = ("succeeded", "failed", "cancelled", "queued")
        rows = [
            {
                "name": f"j{i}",
                "user_id": user_id,
                "group_id": group_id,
                "state": states[i % 4],
                "priority": 1,
                "preemptible": True,
                "spec": spec,
                "max_retries": 0,
                "attempt_count": 0,
                "submitted_at": now - 100_000 + i,
                "updated_at": now,
                "cancel_requested": False,
                "reason": "",
                "attained_gpu_seconds": 0.0,
            }
            for i in range(100_000)
        ]
        db.execute(sa.insert(Job), rows)
        db.commit()
        if db.bind is not None and db.bind.dialect.name == "postgresql":
            db.execute(sa.text("ANALYZE jobs"))
            db.commit()
    cases: list[tuple[str, dict[str, Any]]] = [
        ("bob", {}),  # group admin: own jobs OR his group's, the hard case for indexes
        ("admin", {}),
        ("alice", {}),
        ("bob", {"state": "queued"}),
        ("bob", {"user": "alice", "offset": 5000}),
        ("admin", {"group": "vision", "sort": "updated_at"}),
    ]
    for who, params in cases:
        world.client.get(JOBS, params=params, headers=world.as_(who))  # warm caches
        # Best of three, as tests/web/test_list_scale.py: a full scan + sort is slow in every
        # try, while one try can lose the CPU to the rest of a loaded box (failed 3 in 34 runs
        # beside CPU hogs and a parallel suite, each time on one try of ~0.6 s)
        elapsed = math.inf
        for _ in range(3):
            start = time.perf_counter()
            r = world.client.get(JOBS, params=params, headers=world.as_(who))
            elapsed = min(elapsed, time.perf_counter() - start)
        assert r.status_code == 200
        body = r.json()
        assert body["total"] == (25_000 if params.get("state") else 100_000)
        assert len(body["items"]) == 50
        if not params:
            assert [j["name"] for j in body["items"][:2]] == ["j99999", "j99998"]  # newest first
        # Generous bound for a 2-core shared machine; the point is "no full scan + sort per page".
        assert elapsed < 0.5, f"{who} {params}: {elapsed:.3f} s"


def test_cancel_in_every_state(world: World) -> None:
    def new_job() -> int:
        return int(submit(world, "alice", SIMPLE_JOB).json()["id"])

    def cancel(job_id: int, user: str = "alice") -> Any:
        return world.client.post(f"{JOBS}/{job_id}/cancel", headers=world.as_(user))

    queued = new_job()
    r = cancel(queued)
    assert r.json()["state"] == "cancelled" and r.json()["finished_at"] is not None
    assert cancel(queued).status_code == 409
    with world.session_factory() as db:
        add_node(db, "n1")
        add_node(db, "cpu1", gpus=0)
        db.commit()
    running = new_job()
    with world.session_factory() as db:
        make_running(db, running)
    r = cancel(running, "bob")  # the group admin may cancel alice's job
    assert r.status_code == 200
    body = r.json()
    # Active jobs are stopped by the control loops: the API only records the request.
    assert body["state"] == "running" and body["cancel_requested"] is True
    assert body["events"][-1]["kind"] == "cancel_requested"
    assert cancel(running).status_code == 200  # repeating is harmless
    with world.session_factory() as db:
        assert job_state(db, running) == "running"
    assert cancel(running, "carol").status_code == 404  # may not see it: as a missing job
    assert world.client.post(f"{JOBS}/999999/cancel", headers=world.as_("admin")).status_code == 404


def test_runtime_estimate_comes_from_the_users_earlier_runs(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    spec = {**SIMPLE_JOB, "name": "resnet", "max_runtime": "2h"}
    first = int(submit(world, "alice", spec).json()["id"])
    with world.session_factory() as db:
        assert db.get(Job, first).runtime_estimate_s == 7200  # type: ignore[union-attr]  # no history
        second = int(submit(world, "alice", spec).json()["id"])
        for job_id, seconds, gpu in ((first, 600.0, 0), (second, 900.0, 1)):
            attempt = make_running(db, job_id, gpu_indices=(gpu,))
            attempt.state, attempt.ended_at = "succeeded", attempt.started_at + seconds
            db.get(Job, job_id).state = "succeeded"  # type: ignore[union-attr]
            db.commit()
    third = int(submit(world, "alice", spec).json()["id"])
    other_user = int(submit(world, "bob", spec).json()["id"])
    other_name = int(submit(world, "alice", {**spec, "name": "bert"}).json()["id"])
    with world.session_factory() as db:
        assert db.get(Job, third).runtime_estimate_s == pytest.approx(750.0)  # type: ignore[union-attr]
        assert db.get(Job, other_user).runtime_estimate_s == 7200  # type: ignore[union-attr]
        # a new name: alice's two earlier runs of the same size (1 GPU) are the next level
        bert = db.get(Job, other_name)
        assert bert is not None and bert.runtime_estimate_basis == "user_size"
        assert bert.runtime_estimate_s == pytest.approx(750.0)


def test_submit_reads_its_group_once_and_the_first_estimate_levels_in_one_statement(world: World) -> None:
    """Submitting is the hottest write path: the group is read once, joined with its quotas (the
    quota check reads those, not a second load of the group), and the runtime estimate's first
    two levels (this name, this size) come from one statement."""
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    assert submit(world, "alice", {**SIMPLE_JOB, "name": "warm-up"}).status_code == 201
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    bind = world.session_factory.kw["bind"]
    sa.event.listen(bind, "before_cursor_execute", record)
    try:
        assert submit(world, "alice", {**SIMPLE_JOB, "name": "fresh"}).status_code == 201
    finally:
        sa.event.remove(bind, "before_cursor_execute", record)
    reads = [re.findall(r'\bFROM\s+"?(\w+)', s, re.IGNORECASE) for s in seen]
    assert sum("groups" in tables for tables in reads) == 1
    (group_read,) = [s for s, tables in zip(seen, reads, strict=True) if "groups" in tables]
    assert "group_quotas" in group_read
    assert not any(tables and tables[0] == "group_quotas" for tables in reads)
    first_levels = [s for s in seen if "UNION ALL" in s.upper() and "attempts" in s]
    assert len(first_levels) == 1


def test_unknown_duration_is_estimated_from_group_history_with_its_spread(world: World) -> None:
    """bob has never run anything and gives no max_runtime: his job's runtime comes from his
    group's (vision) finished jobs, with their 25th-75th percentiles; carol's group (nlp) has no
    history of its own and only 3 runs exist, so hers comes from the whole cluster's."""
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    done = [int(submit(world, "alice", {**SIMPLE_JOB, "name": f"run{i}"}).json()["id"]) for i in range(3)]
    with world.session_factory() as db:
        for i, (job_id, seconds) in enumerate(zip(done, (600.0, 900.0, 1200.0), strict=True)):
            attempt = make_running(db, job_id, gpu_indices=(i,))
            attempt.state, attempt.ended_at = "succeeded", attempt.started_at + seconds
            db.get(Job, job_id).state = "succeeded"  # type: ignore[union-attr]
            db.commit()
    fresh = {**SIMPLE_JOB, "name": "never-seen", "resources": {"gpus": 2}}
    bobs = submit(world, "bob", fresh).json()
    assert bobs["runtime_estimate"] == {"seconds": 900.0, "low_s": 750.0, "high_s": 1050.0, "basis": "group"}
    carols = submit(world, "carol", fresh).json()
    assert carols["runtime_estimate"]["basis"] == "cluster"
    got = world.client.get(f"{JOBS}/{bobs['id']}", headers=world.as_("bob")).json()
    assert got["runtime_estimate"] == bobs["runtime_estimate"]


def test_job_detail_has_attempts_events_and_diagnosis(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    job_id = int(submit(world, "alice", {**SIMPLE_JOB, "resources": {"gpus": 2}}).json()["id"])
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        job.diagnosis = {
            "reasons": [{"code": "quota_exhausted", "source": "quota", "message": "wait"}],
            "queue_position": 3,
            "estimated_start": time.time() + 60,
            "unschedulable": False,
        }
        db.commit()
        make_running(db, job_id, gpu_indices=(0, 1))
    r = world.client.get(f"{JOBS}/{job_id}", headers=world.as_("alice"))
    job = r.json()
    JobOut.model_validate(job)  # the documented response model matches what is sent
    JobListOut.model_validate(world.client.get(JOBS, headers=world.as_("alice")).json())
    assert job["diagnosis"]["queue_position"] == 3
    assert job["attempts"][0]["nodes"] == ["n1"]
    assert [g["index"] for g in job["attempts"][0]["gpus"]] == [0, 1]
    assert job["events"][0]["to_state"] == "queued"
    # the GPUs' holder: named to alice, vision's admin bob and the admin; carol (nlp) sees them
    # held, not by which job (that job's page answers her 404; review106 #5)
    for user, shown in (("alice", job_id), ("bob", job_id), ("admin", job_id), ("carol", None)):
        nodes = world.client.get("/api/v1/nodes", headers=world.as_(user)).json()
        assert [(g["allocated"], g["job_id"]) for g in nodes[0]["gpus"]] == [(True, shown)] * 2, user
    summary = world.client.get("/api/v1/cluster/summary", headers=world.as_("carol")).json()
    assert summary["gpus"]["by_model"]["A100"] == {"total": 2, "allocated": 2, "free": 0, "unavailable": 0}
    assert summary["jobs"] == {"running": 1}


def test_a_mount_of_a_missing_group_path_is_refused_at_submit(world: World, settings: Settings) -> None:
    """A job mounting `group/vision/checkpoints`, which nobody had made, was queued and every
    attempt then failed to launch ("the source must exist", retried twice). The server sees the
    group's storage (the local engine's root; Slurm's is the same shared root): refused at submit,
    naming the path and how to make it. The user's own subdir is made on first use: accepted."""
    spec = {**SIMPLE_JOB, "mounts": [{"source": "group/vision/checkpoints", "target": "/mnt/ck"}]}
    r = submit(world, "alice", spec)
    assert r.status_code == 422, r.text
    assert (
        "mount source 'group/vision/checkpoints' does not exist yet; make it first, e.g. from a job "
        "of yours: mkdir -p /group/vision/checkpoints"
    ) in r.text
    (settings.storage_path / "group/vision/checkpoints").mkdir(parents=True)
    assert submit(world, "alice", spec).status_code == 201
    own = {**SIMPLE_JOB, "mounts": [{"source": "group/vision/alice", "target": "/mnt/mine"}]}
    assert submit(world, "alice", own).status_code == 201


def test_a_mount_inside_another_or_on_the_jobs_environment_is_refused_at_submit(world: World) -> None:
    """`home` at /mnt/x with `group/vision/alice` at /mnt/x/g was queued, and its launch made the
    mount point inside the first mount as root: a dir of root's left in the user's home, or, under
    a read-only dataset, every attempt failed ("bwrap: Can't mkdir /mnt/x/g: Read-only file
    system"). A mount at /env/<name> of a job whose environment is <name> ran, the environment's
    bind hiding the mount without a word. Both are refused at submit, naming the two places."""
    nested = [
        {"source": "home", "target": "/mnt/x"},
        {"source": "group/vision/alice", "target": "/mnt/x/g"},
    ]
    for mounts in (nested, nested[::-1]):
        r = submit(world, "alice", {**SIMPLE_JOB, "mounts": mounts})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["msg"] == (
            "mount source 'group/vision/alice' at '/mnt/x/g' is inside mount source 'home' at '/mnt/x': "
            "give each mount a place of its own, not one inside another"
        ), r.text
    for target in ("/env/tools", "/env/tools/data", "/env"):
        spec = {**SIMPLE_JOB, "environment": "tools", "mounts": [{"source": "home", "target": target}]}
        r = submit(world, "alice", spec)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["msg"] == (
            f"mount source 'home' at '{target}' overlaps '/env/tools', where the job's environment "
            "'tools' is bound: mount it elsewhere"
        ), r.text
    # Beside each other, or beside the environment's place, they are fine.
    side = [{"source": "home", "target": "/mnt/x"}, {"source": "group/vision/alice", "target": "/mnt/xg"}]
    assert submit(world, "alice", {**SIMPLE_JOB, "mounts": side}).status_code == 201
    spec = {**SIMPLE_JOB, "mounts": [{"source": "home", "target": "/env/tools"}]}  # the server's own env
    assert submit(world, "alice", spec).status_code == 201
