"""A reduced schemathesis run against a real server (the full one: bench/fuzz_api.py).

The server is started here (tests/server_harness.py: uvicorn, SQLite, the local engine) and
fuzzed over HTTP with all of schemathesis's checks and a fixed seed, as a plain member and as an
admin, fuzzing and stateful phases (the links the schema declares). Accepted exceptions are the
ones listed, each with why, in tests/fuzz_hooks.py; anything else fails. The coverage phase
(undeclared methods, Allow headers) is slow on the job spec's schema, so the bench runs it and
this file checks its findings directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fuzz_run import FuzzResult, run_as_member_and_admin
from tests.server_harness import CorralServer, start_server

SEED = 11
API = "/api/v1"


@pytest.fixture(scope="module")
def server() -> Iterator[CorralServer]:
    srv = start_server(virtual_gpus=2)
    try:
        yield srv
    finally:
        srv.stop()


def _explain(result: FuzzResult) -> str:
    failures = [line for line in result.output.splitlines() if line.startswith("FUZZ FAILURE")]
    return f"{result.who}: {result.failing_operations}\n" + "\n".join(failures) + f"\n{result.output[-6000:]}"


def test_schemathesis_finds_nothing_as_member_and_admin(server: CorralServer) -> None:
    results, tokens = run_as_member_and_admin(
        server.url,
        server.token,
        max_examples=3,
        seed=SEED,
        phases=("fuzzing", "stateful"),
        stateful_steps=10,
        # 55 declared links: 3 scenarios of a member, who may create few of their sources,
        # sometimes followed none of them; nor did 12 once the job links grew (hold, release):
        # schemathesis ends a suite at Hypothesis's first "inconsistent data generation", at
        # times before any link. So the stateful phase runs suites for a time, as the bench does.
        stateful_examples=12,
        stateful_time_s=25,
        timeout_s=240,
    )
    assert sum(r.cases for r in results) >= 200  # a few hundred cases
    for result in results:
        assert result.failure_count == 0, _explain(result)
        assert result.errors == 0, _explain(result)
        assert result.server_errors == 0, _explain(result)
        assert result.unreadable_4xx == {}, _explain(result)
        assert result.links_total >= 40 and result.links_covered >= 1, _explain(result)
    # Authenticated as itself all along: the guard kept each run's own token alive.
    for token in tokens.values():
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as c:
            assert c.get(f"{API}/me").status_code == 200


def test_wrong_methods_get_405_with_every_allowed_method(server: CorralServer) -> None:
    """What schemathesis's coverage phase found before: a GET on a POST-only API path answered
    404 (the portal's catch-all route), and OPTIONS named only the first route's methods."""
    with server.client() as c:
        r = c.get(f"{API}/alerts/webhook")
        assert r.status_code == 405 and r.headers["allow"] == "POST", r.text
        assert "GET is not allowed" in r.json()["detail"]
        r = c.options(f"{API}/jobs/1")
        assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"DELETE", "GET"}
        r = c.put(f"{API}/tokens")
        assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "POST"}
        # A literal path is not a value of a templated route beside it (/datasets/{name}):
        # bench/fuzz_api.py found `Allow: DELETE, GET, POST` on /datasets/import.
        for path, allowed in (("datasets/import", "POST"), ("datasets/uploads", "GET, POST")):
            r = c.options(f"{API}/{path}")
            assert r.status_code == 405 and r.headers["allow"] == allowed, (path, r.headers)
        r = c.delete(f"{API}/datasets/import")
        assert r.status_code == 405 and r.headers["allow"] == "POST", r.text
        assert c.get(f"{API}/no-such-thing").status_code == 404  # no route at all: still 404
        # bench/fuzz_api.py: a job id past 64 bits on the outputs routes was a 500 (SQLite overflow)
        r = c.get(f"{API}/jobs/5089430826076726099968/outputs/file", params={"path": "a"})
        assert r.status_code == 422 and "job_id" in r.text, r.text
        assert c.get("/no-such-page").status_code == 404  # the portal's own 404 page


def test_unpaired_surrogates_are_refused_not_stored(server: CorralServer) -> None:
    """Found by bench/fuzz_api.py: a job whose env held "\\ud8dc" was stored, and then every
    listing, show and cancel touching it was a 500 (the text cannot be encoded as UTF-8)."""
    body = '{"name": "s", "command": "true", "env": {"A": "\\ud8dc"}}'
    with server.client() as c:
        r = c.post(f"{API}/jobs", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "unpaired UTF-16 surrogate" in r.json()["detail"]
        paired = '{"name": "s", "command": "true", "env": {"A": "\\ud83d\\ude00"}}'  # an emoji
        r = c.post(f"{API}/jobs", content=paired, headers={"Content-Type": "application/json"})
        assert r.status_code == 201, r.text
        assert c.get(f"{API}/jobs").status_code == 200
        c.post(f"{API}/jobs/{r.json()['id']}/cancel")


def test_schema_documents_every_error(server: CorralServer) -> None:
    with httpx.Client(base_url=server.url) as c:
        schema = c.get("/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            codes = set(op["responses"])
            assert {"400", "408", "413"} <= codes, (method, path)
            if "security" in op:
                assert {"401", "403"} <= codes, (method, path)
            if "{" in path:
                assert {"404", "422"} <= codes, (method, path)
            for code, response in op["responses"].items():
                if code.startswith("4"):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/ErrorOut", (method, path, code)
    assert "429" in schema["paths"][f"{API}/jobs"]["post"]["responses"]
    links = schema["paths"][f"{API}/jobs"]["post"]["responses"]["201"]["links"]
    assert {"GetJob", "GetJobLogs", "CancelJob", "DeleteJob"} <= set(links)


def test_memory_pattern_admits_only_sizes_the_server_takes(server: CorralServer) -> None:
    """The reduced run found a schema-valid memory of '644K' refused ("less than 1 MiB"): the
    schema's pattern now admits only sizes of 1 MiB or more, and every size it admits is taken."""
    import re

    with httpx.Client(base_url=server.url) as c:
        schema = c.get("/openapi.json").json()
    post = schema["paths"][f"{API}/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    spec = schema["components"]["schemas"][post["$ref"].rsplit("/", 1)[1]] if "$ref" in post else post
    resources = spec.get("$defs", schema["components"]["schemas"])["ResourcesV1"]["properties"]
    (text,) = [s for s in resources["memory"]["anyOf"] if s["type"] == "string"]
    pattern = re.compile(text["pattern"])
    too_small = ["644K", " 1023KiB ", "0M", "0.5MiB", "0.0009G", "0.0000009T", "00.9m"]
    admitted = ["1024K", "1M", " 1.5 GiB ", "0.001G", "0.000001TB", "0512mb", "64Ti"]
    assert [v for v in too_small if pattern.match(v)] == []
    assert [v for v in admitted if not pattern.match(v)] == []
    with server.client() as c:
        for value in admitted[:-1]:  # 64 TiB: more than the node has, "can never run"
            spec_body = {"name": "m", "command": "true", "resources": {"memory": value}}
            r = c.post(f"{API}/jobs", json=spec_body)
            assert r.status_code in (201, 422) and "MiB" not in r.text, (value, r.text)
            if r.status_code == 201:
                c.post(f"{API}/jobs/{r.json()['id']}/cancel")
        r = c.post(f"{API}/jobs", json={"name": "m", "command": "true", "resources": {"memory": "644K"}})
        assert r.status_code == 422 and "less than 1 MiB" in r.text, r.text


def test_concurrent_starts_of_a_workspace_make_one_job(server: CorralServer) -> None:
    """Chasing a 500 on POST /workspaces/{name}/start in bench/fuzz_api.py (admin, 2 workers):
    starts at once each submitted a job, and all but one ran on owned by no workspace. Now a
    compare-and-set on the job a start replaces: one 200, the others 409."""
    from concurrent.futures import ThreadPoolExecutor

    def start() -> httpx.Response:
        with server.client() as c:
            return c.post(f"{API}/workspaces/race/start")

    with server.client() as c:
        assert c.post(f"{API}/workspaces", json={"name": "race", "start": False}).status_code == 201
        for _round in range(3):
            with ThreadPoolExecutor(3) as pool:
                answers = list(pool.map(lambda _: start(), range(3)))
            codes = sorted(r.status_code for r in answers)
            assert codes == [200, 409, 409], [r.text for r in answers]
            started = next(r.json()["job_id"] for r in answers if r.status_code == 200)
            jobs = c.get(f"{API}/jobs", params={"state": "queued,scheduled,starting,running"}).json()
            workspace_jobs = [j["id"] for j in jobs["items"] if j["name"] == "ws-race"]
            assert workspace_jobs == [started], (workspace_jobs, started)
            assert c.post(f"{API}/workspaces/race/stop").status_code == 200
            wait_stopped(c, "race")


def wait_stopped(c: httpx.Client, name: str) -> None:
    import time

    deadline = time.monotonic() + 60
    while c.get(f"{API}/workspaces/{name}").json()["state"] != "stopped":
        assert time.monotonic() < deadline, c.get(f"{API}/workspaces/{name}").text
        time.sleep(0.3)


def test_tiny_idle_timeouts_are_refused_not_a_500(server: CorralServer) -> None:
    """Found by the reduced run (stateful, seed 22): a workspace with idle_timeout 5e-324 was a
    500 (stored as "0s", which the job spec refused); under a second is now a clear 422."""
    with server.client() as c:
        for value in (5e-324, 1e-7, "0.5s"):
            r = c.post(f"{API}/workspaces", json={"name": "tiny", "idle_timeout": value, "start": False})
            assert r.status_code == 422 and "at least 1s" in r.text, (value, r.text)
        r = c.put(f"{API}/workspaces/policies/default", json={"default_idle_timeout": 5e-324})
        assert r.status_code == 422 and "at least 1s" in r.text, r.text


def test_holds_and_quota_removal_are_linked_and_the_links_resolve(server: CorralServer) -> None:
    """The stateful phase reaches today's endpoints only through declared links: hold → release
    (and cancel), release → hold, and a group's quota row → DELETE /groups/{name}/quota. Each
    link's JSON pointer must name a value the source's real answer holds."""
    with httpx.Client(base_url=server.url) as c:
        paths = c.get("/openapi.json").json()["paths"]

    def links(method: str, path: str, status: str) -> dict[str, dict[str, object]]:
        return paths[f"{API}{path}"][method]["responses"][status]["links"]

    hold = links("post", "/jobs/{job_id}/hold", "200")
    assert {"ReleaseHeldJob", "CancelHeldJob"} <= set(hold)
    assert set(links("post", "/jobs/{job_id}/release", "200")) == {"HoldReleasedJob"}
    assert {"HoldJob", "ReleaseJob"} <= set(links("post", "/jobs", "201"))
    for source in (links("post", "/groups", "201"), links("put", "/groups/{name}/quota", "200")):
        assert source["RemoveGroupQuota"]["parameters"] == {
            "name": source["RemoveGroupQuota"]["parameters"]["name"],
            "gpu_model": "$response.body#/quotas/0/gpu_model",
        }
    assert hold["ReleaseHeldJob"]["parameters"] == {"job_id": "$response.body#/job/id"}

    with server.client() as c:
        r = c.post(f"{API}/jobs", params={"hold": "true"}, json={"name": "held", "command": "true"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        held = c.post(f"{API}/jobs/{job_id}/hold")
        assert held.status_code == 200 and held.json()["job"]["id"] == job_id, held.text
        released = c.post(f"{API}/jobs/{job_id}/release")
        assert released.status_code == 200 and released.json()["job"]["id"] == job_id, released.text
        c.post(f"{API}/jobs/{job_id}/cancel")
        quota = {"gpu_model": "*", "guaranteed": 0, "max": 1}
        r = c.post(f"{API}/groups", json={"name": "linked-quota", "quotas": [quota]})
        assert r.status_code == 201 and r.json()["quotas"][0]["gpu_model"] == "*", r.text
        r = c.put(f"{API}/groups/linked-quota/quota", json={"gpu_model": "A100", "max": 2})
        model = r.json()["quotas"][0]["gpu_model"]
        removed = c.delete(f"{API}/groups/linked-quota/quota", params={"gpu_model": model})
        assert removed.status_code == 200 and model not in {q["gpu_model"] for q in removed.json()["quotas"]}


def test_a_job_asking_for_a_vanishing_cpu_share_is_scheduled() -> None:
    """Found by bench/fuzz_api.py (server log): a job with cpus 5e-324 (positive, as the spec
    asks) made the schedule loop fail on every tick (free CPUs / cpus is infinite, and int() of
    it an OverflowError), so nothing queued was placed any more. Now it is placed like any job
    (its cgroup gets the smallest CPU limit, 0.001 of a CPU). A server of its own: the module's
    is busy with the fuzzers' jobs, which may hold every CPU for longer than the wait below."""

    own = start_server(virtual_gpus=2)
    try:
        _tiny_cpu_job_is_placed(own)
    finally:
        own.stop()


def _tiny_cpu_job_is_placed(server: CorralServer) -> None:
    import time

    with server.client() as c:
        r = c.post(f"{API}/jobs", json={"name": "tiny-cpu", "command": "true", "resources": {"cpus": 5e-324}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 30
        while (state := c.get(f"{API}/jobs/{job_id}").json()["state"]) == "queued":
            assert time.monotonic() < deadline, c.get(f"{API}/jobs/{job_id}").text
            time.sleep(0.3)
        assert state in ("scheduled", "starting", "running", "succeeded"), state
        c.post(f"{API}/jobs/{job_id}/cancel")
