"""Quotas through the API: jobs its quotas can never admit are refused at submit with the numbers,
limits can be cleared, CPU and memory quotas, overcommitted guarantees warn, groups show usage."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from corral.db.models import Attempt, Job
from corral.scheduler import PROFILES, Scheduler
from corral.server.snapshot import build_snapshot, read_cluster_state
from corral.services import accounts, jobs
from tests.api.conftest import World
from tests.api.helpers import add_node, make_running
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]

API = "/api/v1"


def put_quota(world: World, group: str, body: dict[str, Any], status: int = 200) -> Any:
    r = world.client.put(f"{API}/groups/{group}/quota", json=body, headers=world.as_("admin"))
    assert r.status_code == status, r.text
    return r.json()


def submit(world: World, resources: dict[str, Any], user: str = "alice", **fields: Any) -> Any:
    spec = {"name": "q", "command": "true", "resources": resources, **fields}
    return world.client.post(f"{API}/jobs", json=spec, headers=world.as_(user))


def refusal(response: Any) -> str:
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "tasks"]
    return str(error["msg"])


def jobs_stored(world: World) -> int:
    with world.session_factory() as db:
        return int(db.scalar(sa.select(sa.func.count(Job.id))) or 0)


def test_jobs_over_the_user_cap_or_the_group_max_are_refused_with_the_numbers(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1", gpus=4, model="A100")
        db.commit()
    put_quota(world, "vision", {"gpu_model": "A100", "guaranteed": 1, "max": 2, "user_max_gpus": 3})
    over_both = refusal(submit(world, {"gpus": 4}))
    assert over_both == (
        "this job can never run under group vision's quota: it needs 4 GPUs; group vision caps each "
        "user at 3 GPUs (user_max_gpus); it needs 4 GPUs; group vision may hold at most 2 A100 (its max)"
    )
    assert "may hold at most 2 A100 (its max)" in refusal(submit(world, {"gpus": 3}))
    not_preemptible = refusal(submit(world, {"gpus": 2}, preemptible=False))
    assert "guarantees 1 A100 and the job is not preemptible, so it may not borrow" in not_preemptible
    assert jobs_stored(world) == 0  # nothing half-written
    assert submit(world, {"gpus": 2}).status_code == 201
    assert submit(world, {"gpus": 1}, preemptible=False).status_code == 201
    assert submit(world, {"cpus": 1}, user="carol").status_code == 201  # nlp has no quota at all
    assert jobs_stored(world) == 3


def test_a_group_max_is_checked_even_before_any_node_registers(world: World) -> None:
    jobs._nodes_cache.clear()  # node shapes are cached per engine, which outlives one test's rows
    put_quota(world, "vision", {"gpu_model": "*", "guaranteed": 0, "max": 1})
    assert "may hold at most 1 GPU of any model" in refusal(submit(world, {"gpus": 2}))
    assert submit(world, {"gpus": 1}).status_code == 201


def test_a_model_listed_without_a_max_is_not_held_to_the_any_model_max(world: World) -> None:
    """`*` covers the models a group lists no quota for: a model listed with no max (shown as
    such) may borrow up to the cluster, not up to `*`'s max. It was refused at submit ("may hold
    at most 4 A100 (its max)") and would have waited in the schedule cycle with quota_max."""
    jobs._nodes_cache.clear()
    with world.session_factory() as db:
        add_node(db, "n1", gpus=8, model="A100")
        add_node(db, "n2", gpus=8, model="V100")
        db.commit()
    put_quota(world, "vision", {"gpu_model": "*", "guaranteed": 0, "max": 4})
    group = put_quota(world, "vision", {"gpu_model": "A100", "guaranteed": 2})
    assert {"gpu_model": "A100", "guaranteed": 2, "max": None} in group["quotas"]
    assert "may hold at most 4 V100 (its max)" in refusal(submit(world, {"gpus": 6, "gpu_model": "V100"}))
    created = submit(world, {"gpus": 6, "gpu_model": "A100"})
    assert created.status_code == 201, created.text
    now = time.time()
    with world.session_factory() as db:
        snapshot = build_snapshot(read_cluster_state(db), now)
    plan = Scheduler(PROFILES["default"]).schedule(snapshot, now, random.Random(0))
    assert [a.job_id for a in plan.assignments] == [str(created.json()["id"])]


def test_a_star_max_beside_a_models_own_quota_is_said_not_to_cap_that_model(
    world: World, server_url: str
) -> None:
    """docs/scheduler.md ("Quota keys"): `*` covers only the models a group lists no quota for, so
    a `*` max is no cap on the group's total. The quota answers said nothing of it: an admin who
    set `*` max 4 and then an A100 guarantee read nothing that A100 was now uncapped."""
    put_quota(world, "vision", {"gpu_model": "*", "guaranteed": 0, "max": 4})
    assert world.client.get(f"{API}/groups/vision", headers=world.as_("admin")).json()["warnings"] == []
    group = put_quota(world, "vision", {"gpu_model": "A100", "guaranteed": 2})
    says = (
        "group vision: the '*' max of 4 GPUs does not cap A100 (no max of its own): '*' covers only "
        "the models without a quota of their own (give such a model its own max, or remove its quota "
        "to put it under '*')"
    )
    assert group["warnings"] == [says]
    group = put_quota(world, "vision", {"gpu_model": "V100", "guaranteed": 0, "max": 8})
    assert group["warnings"] == [
        says.replace("A100 (no max of its own)", "A100 (no max of its own), V100 (max 8 of its own)")
    ]
    mine = world.client.get(f"{API}/groups", headers=world.as_("alice")).json()  # a member sees it too
    assert [g["warnings"] for g in mine if g["name"] == "vision"] == [group["warnings"]]
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--model", "A100", "--max", "4")
    assert code == 0 and "quotas set" in out, out
    shown = " ".join(out.split())  # Rich wraps the line at the terminal's width
    assert "warning: group vision: the '*' max of 4 GPUs does not cap A100 (max 4 of its own), V100" in shown
    code, out = run(world, server_url, "admin", "group", "ls")
    assert code == 0 and "does not cap A100 (max 4 of its own)" in " ".join(out.split()), out
    for model in ("A100", "V100"):
        code, out = run(world, server_url, "admin", "group", "quota", "vision", "--model", model, "--clear")
        assert code == 0, out
    assert "warning" not in out  # only `*` left: it caps every model
    put_quota(world, "vision", {"gpu_model": "A100", "guaranteed": 1})
    group = put_quota(world, "vision", {"gpu_model": "*", "max": None})
    assert group["warnings"] == []  # no `*` max: nothing it could be thought to cap


def test_the_per_user_cap_can_be_removed_and_a_partial_update_keeps_the_rest(world: World) -> None:
    put_quota(world, "vision", {"gpu_model": "A100", "guaranteed": 2, "max": 4})
    group = put_quota(world, "vision", {"user_max_gpus": 1, "weight": 2})
    assert group["user_max_gpus"] == 1 and group["weight"] == 2
    assert "caps each user at 1 GPU" in refusal(submit(world, {"gpus": 2}))
    group = put_quota(world, "vision", {"user_max_gpus": None})
    assert group["user_max_gpus"] is None
    assert group["quotas"] == [{"gpu_model": "A100", "guaranteed": 2, "max": 4}]  # untouched
    assert group["weight"] == 2
    assert submit(world, {"gpus": 2}).status_code == 201


def test_cpu_and_memory_quotas_are_stored_cleared_and_enforced_at_submit(world: World) -> None:
    group = put_quota(
        world,
        "vision",
        {"cpus_guaranteed": 4, "cpus_max": 8, "memory_guaranteed_mib": 1024, "memory_max_mib": 4096},
    )
    assert (group["cpus_guaranteed"], group["cpus_max"]) == (4, 8)
    assert (group["memory_guaranteed_mib"], group["memory_max_mib"]) == (1024, 4096)
    assert group["quotas"] == []  # no GPU quota was written
    text = refusal(submit(world, {"cpus": 3, "memory": "2GiB"}, instances=3))
    assert "it needs 9 CPUs; group vision may hold at most 8 CPUs (its max)" in text
    assert "it needs 6144 MiB of memory; group vision may hold at most 4096 MiB (its max)" in text
    assert submit(world, {"cpus": 4, "memory": "2GiB"}, instances=2).status_code == 201
    r = world.client.put(f"{API}/groups/vision/quota", json={"cpus_max": 2}, headers=world.as_("admin"))
    assert (
        r.status_code == 422
        and r.json()["detail"][0]["msg"] == "cpus_max (2) must not be less than cpus_guaranteed (4)"
    )
    group = put_quota(world, "vision", {"cpus_max": None, "memory_max_mib": None})
    assert group["cpus_max"] is None and group["memory_max_mib"] is None and group["cpus_guaranteed"] == 4
    assert submit(world, {"cpus": 3}, instances=3).status_code == 201
    created = world.client.post(
        f"{API}/groups",
        json={"name": "speech", "cpus_max": 16, "memory_max_mib": 8192},
        headers=world.as_("admin"),
    )
    assert created.status_code == 201 and created.json()["cpus_max"] == 16


def test_guarantees_adding_up_to_more_than_the_cluster_are_accepted_with_a_warning(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2, model="A100")  # 16 CPUs, 64 GiB
        db.commit()
    assert put_quota(world, "vision", {"gpu_model": "A100", "guaranteed": 2})["warnings"] == []
    overcommit = {"gpu_model": "A100", "guaranteed": 1, "cpus_guaranteed": 20, "memory_guaranteed_mib": 70000}
    group = put_quota(world, "nlp", overcommit)
    assert group["warnings"] == [
        "guaranteed A100 GPUs of all groups add up to 3; the cluster has 2",
        "guaranteed GPUs of all groups add up to 3; the cluster has 2",
        "guaranteed CPUs of all groups add up to 20; the cluster has 16",
        "guaranteed memory of all groups adds up to 70000 MiB; the cluster has 65536 MiB",
    ]
    listed = {
        g["name"]: g["warnings"] for g in world.client.get(f"{API}/groups", headers=world.as_("admin")).json()
    }
    assert listed["vision"] == group["warnings"][:2]  # vision guarantees no CPUs
    mine = world.client.get(f"{API}/groups", headers=world.as_("alice")).json()
    assert [g["warnings"] for g in mine] == [group["warnings"][:2]]
    put_quota(world, "nlp", {**overcommit, "guaranteed": 0, "cpus_guaranteed": 0, "memory_guaranteed_mib": 0})
    assert world.client.get(f"{API}/groups/vision", headers=world.as_("admin")).json()["warnings"] == []


def test_groups_show_gpus_used_guaranteed_and_borrowed_and_cpu_memory_used(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1", gpus=4, model="A100")
        add_node(db, "n2", gpus=2, model="V100")
        db.commit()
    put_quota(world, "vision", {"gpu_model": "A100", "guaranteed": 1, "max": 3, "cpus_max": 8})
    ids = [submit(world, {"gpus": 1}).json()["id"] for _ in range(3)]
    with world.session_factory() as db:
        make_running(db, ids[0], "n1", (0,))
        borrowed = make_running(db, ids[1], "n1", (1, 2))
        make_running(db, ids[2], "n2", (0,))
        db.get(Attempt, borrowed.id).borrowed = True  # type: ignore[union-attr]
        db.commit()
    usage = world.client.get(f"{API}/groups/vision", headers=world.as_("alice")).json()["usage"]
    assert usage["gpus"] == [
        {"gpu_model": "*", "used": 1, "borrowed": 0, "guaranteed": 0, "max": None, "models": {"V100": 1}},
        {"gpu_model": "A100", "used": 3, "borrowed": 2, "guaranteed": 1, "max": 3, "models": {"A100": 3}},
    ]
    assert usage["cpus"] == {"used": 3, "guaranteed": 0, "max": 8}
    assert usage["memory_mib"] == {"used": 768, "guaranteed": 0, "max": None}
    nlp = next(
        g for g in world.client.get(f"{API}/groups", headers=world.as_("admin")).json() if g["name"] == "nlp"
    )
    assert nlp["usage"]["gpus"] == [] and nlp["usage"]["cpus"]["used"] == 0


def test_two_admins_setting_a_new_models_quota_at_once_take_turns(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second request commits the group's first a100 quota between the first's read (none
    yet) and its insert: the first's insert broke the unique constraint, a 500 (IntegrityError on
    either database). With the group's row locked the second waits for the first, reads its
    quota and changes it: both answer 200, the later one's numbers stand."""
    real, paused, second_done = accounts.set_quota, threading.Event(), threading.Event()

    def set_quota(*args: Any, **kwargs: Any) -> Any:
        if not paused.is_set():  # the first request, after its read, before its write
            paused.set()
            second_done.wait(2)  # with the lock, the second waits for us: go on after 2 s
        return real(*args, **kwargs)

    monkeypatch.setattr(accounts, "set_quota", set_quota)
    results: dict[int, Any] = {}

    def put(i: int, guaranteed: int) -> None:
        body = {"gpu_model": "a100", "guaranteed": guaranteed}
        try:
            results[i] = world.client.put(f"{API}/groups/vision/quota", json=body, headers=world.as_("admin"))
        except Exception as exc:  # the server's own error (the test client raises it)
            results[i] = exc
        finally:
            if i == 2:
                second_done.set()

    first = threading.Thread(target=put, args=(1, 2))
    first.start()
    assert paused.wait(10)
    second = threading.Thread(target=put, args=(2, 3))
    second.start()
    first.join(30)
    second.join(30)
    assert [getattr(results[i], "status_code", results[i]) for i in (1, 2)] == [200, 200], results
    group = world.client.get(f"{API}/groups/vision", headers=world.as_("admin")).json()
    (quota,) = [q for q in group["quotas"] if q["gpu_model"] == "a100"]
    assert quota["guaranteed"] == 3, quota


def test_memory_quotas_up_to_the_apis_bound_are_stored_on_either_database(world: World) -> None:
    """bench/fuzz_api.py --postgres: a memory quota over 2**31 - 1 MiB (which the API takes, up to
    2**40) was a 500 on PostgreSQL ("integer out of range"); the columns are 64-bit now (0030)."""
    c, admin = world.client, world.as_("admin")
    big = 2**40
    r = c.post("/api/v1/groups", json={"name": "huge", "memory_guaranteed_mib": 84810021741}, headers=admin)
    assert r.status_code == 201 and r.json()["memory_guaranteed_mib"] == 84810021741, r.text
    r = c.put("/api/v1/groups/huge/quota", json={"memory_max_mib": big}, headers=admin)
    assert r.status_code == 200 and r.json()["memory_max_mib"] == big, r.text
    shown = c.get("/api/v1/groups/huge", headers=admin).json()
    assert (shown["memory_guaranteed_mib"], shown["memory_max_mib"]) == (84810021741, big)
    r = c.put("/api/v1/groups/huge/quota", json={"memory_max_mib": big + 1}, headers=admin)
    assert r.status_code == 422 and "memory_max_mib" in r.text, r.text
