"""API limits in process: body size (413), JSON depth and size (400), body-read timeout (408),
rate limits (429 + Retry-After) and who may scrape /metrics. Each refusal names the limit."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.limits import BodyLimits, TokenBuckets, json_shape_error
from corral.api.metrics_auth import binds_private_only
from corral.config import Settings
from corral.db.session import init_db, make_engine, make_session_factory
from corral.services import auth
from tests.api.conftest import SIMPLE_JOB, World
from tests.server_harness import free_port, server_env

API = "/api/v1"
JSON = {"content-type": "application/json"}


def client_with(world: World, db_engine: sa.Engine, tmp_path: Path, **overrides: Any) -> TestClient:
    """A second app on the world's database with other settings (as a second server would be)."""
    settings = Settings(home=tmp_path / "home2", database_url="sqlite:///unused", **overrides)
    return TestClient(create_app(settings, db_engine=db_engine))


@dataclass
class Lone:
    client: TestClient
    auth: dict[str, str]


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lone]:
    """One app on its own SQLite database with its admin: the body checks do not depend on the
    database, so they run once, not once per backend."""
    home = tmp_path_factory.mktemp("lone")
    url = f"sqlite:///{home / 'corral.db'}"
    init_db(url)
    settings = Settings(home=home, database_url=url)
    engine = make_engine(url)
    with make_session_factory(engine)() as db:
        token = auth.bootstrap_admin(db, settings)
    with TestClient(create_app(settings, db_engine=engine)) as client:
        yield Lone(client, {"Authorization": f"Bearer {token}"})
    engine.dispose()


def test_deep_json_is_a_clear_400_not_a_server_error(lone: Lone) -> None:
    # Before the limit: Python's JSON decoder raised RecursionError on this body, a 500.
    c = lone.client
    deep = "[" * 5000 + "]" * 5000
    r = c.post(f"{API}/jobs", content=deep, headers={**JSON, **lone.auth})
    assert r.status_code == 400, r.text
    assert "nested more than 32 levels deep" in r.json()["detail"]
    assert "CORRAL_API_MAX_JSON_DEPTH" in r.json()["detail"]
    # Deep objects too, and brackets inside strings do not count.
    deep_obj = '{"a":' * 100 + "1" + "}" * 100
    r = c.post(f"{API}/jobs", content=deep_obj, headers={**JSON, **lone.auth})
    assert r.status_code == 400 and "nested more than 32 levels" in r.json()["detail"]
    spec = {**SIMPLE_JOB, "command": "echo '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{{{{{{{{{{{'"}
    r = c.post(f"{API}/jobs", json=spec, headers=lone.auth)
    assert r.status_code == 201, r.text


def test_deep_yaml_and_untyped_bodies_are_400_too(lone: Lone) -> None:
    # Before: each of these gave 500 (RecursionError in PyYAML or the JSON decoder).
    c, deep = lone.client, "[" * 5000 + "]" * 5000
    for content_type in ("application/yaml", "text/plain", None):
        headers = {**lone.auth, **({"content-type": content_type} if content_type else {})}
        r = c.post(f"{API}/jobs", content=deep, headers=headers)
        assert r.status_code == 400 and "nested more than 32 levels deep" in r.json()["detail"], content_type
    # Block style nests by indentation, not brackets: 690 levels fit in the spec's 256 KiB and
    # recurse past Python's limit; the RecursionError handler answers for it.
    block = "".join(" " * i + "a:\n" for i in range(690))
    r = c.post(f"{API}/jobs", content=block, headers={**lone.auth, "content-type": "application/yaml"})
    assert r.status_code == 400 and "nested too deeply to parse" in r.json()["detail"]


def test_json_shape_counts_structure_outside_strings() -> None:
    assert json_shape_error(b'{"a": "[[[[,,,,\\"[[[\\\\"}', 2, 10) is None
    assert json_shape_error(b'["\\\\", "[[[["]', 1, 10) is None  # an escaped backslash ends no string
    assert json_shape_error(b"[[1]]", 2, 10) is None
    depth = json_shape_error(b"[[[1]]]", 2, 10)
    assert depth is not None and "nested more than 2 levels" in depth
    many = json_shape_error(json.dumps(list(range(50))).encode(), 5, 20)
    assert many is not None and "more than 20 JSON or YAML values" in many


def test_too_many_json_elements_is_400(lone: Lone) -> None:
    body = json.dumps({**SIMPLE_JOB, "env": {f"V{i}": "x" for i in range(30_000)}})
    r = lone.client.post(f"{API}/jobs", content=body, headers={**JSON, **lone.auth})
    assert r.status_code == 400 and "more than 20000 JSON or YAML values" in r.json()["detail"]


def test_big_body_is_413_with_or_without_content_length(lone: Lone) -> None:
    c, alice = lone.client, lone.auth
    big = b"x" * (20 << 20)
    r = c.post(f"{API}/jobs", content=big, headers={**JSON, **alice})
    assert r.status_code == 413 and "CORRAL_API_MAX_BODY_BYTES" in r.json()["detail"]
    sent: list[int] = []

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(20):
            sent.append(1)
            yield b"x" * (1 << 20)

    r = c.post(f"{API}/jobs", content=chunks(), headers={**JSON, **alice})
    assert r.status_code == 413 and "larger than 1048576 bytes" in r.json()["detail"]


def test_body_read_timeout_is_408() -> None:
    """A client that stops sending half-way gets 408 once the body timeout passes."""
    settings = Settings(home=Path("/nonexistent"), database_url="sqlite:///unused", api_body_timeout_s=0.2)
    reached_app: list[bool] = []

    async def app(_scope: Any, _receive: Any, _send: Any) -> None:
        reached_app.append(True)

    async def receive() -> dict[str, Any]:
        if not parts:
            await asyncio.sleep(3600)
        return parts.pop(0)

    parts = [{"type": "http.request", "body": b'{"name":', "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/v1/jobs", "headers": []}
    asyncio.run(BodyLimits(app, settings)(scope, receive, send))
    assert not reached_app and sent[0]["status"] == 408
    assert "CORRAL_API_BODY_TIMEOUT_S" in json.loads(sent[1]["body"])["detail"]


def test_token_bucket_refills_at_its_rate() -> None:
    buckets = TokenBuckets(per_min=60, burst=2)
    assert buckets.take("k", 0.0) == 0.0 and buckets.take("k", 0.0) == 0.0
    assert buckets.take("k", 0.0) == pytest.approx(1.0)  # one a second
    assert buckets.take("other", 0.0) == 0.0  # keys are independent
    assert buckets.take("k", 1.0) == 0.0 and buckets.take("k", 1.0) > 0


def test_submit_rate_limit_per_token(world: World, db_engine: sa.Engine, tmp_path: Path) -> None:
    with client_with(world, db_engine, tmp_path, rate_submit_per_min=1, rate_submit_burst=2) as c:
        for _ in range(2):
            assert c.post(f"{API}/jobs", json=SIMPLE_JOB, headers=world.as_("alice")).status_code == 201
        r = c.post(f"{API}/jobs", json=SIMPLE_JOB, headers=world.as_("alice"))
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert "job submission" in r.json()["detail"] and "CORRAL_RATE_SUBMIT_PER_MIN" in r.json()["detail"]
        # Another token has its own bucket; reads are not limited.
        assert c.post(f"{API}/jobs", json=SIMPLE_JOB, headers=world.as_("bob")).status_code == 201
        assert c.get(f"{API}/jobs", headers=world.as_("alice")).status_code == 200


def test_big_lists_and_logins_are_rate_limited(world: World, db_engine: sa.Engine, tmp_path: Path) -> None:
    overrides = {"rate_big_list_per_min": 1, "rate_big_list_burst": 1, "rate_login_per_min": 1}
    with client_with(world, db_engine, tmp_path, rate_login_burst=2, **overrides) as c:
        alice = world.as_("alice")
        assert c.get(f"{API}/jobs?limit=500", headers=alice).status_code == 200
        r = c.get(f"{API}/jobs?limit=500", headers=alice)
        assert r.status_code == 429 and "lists with limit > 100" in r.json()["detail"]
        assert c.get(f"{API}/jobs?limit=50", headers=alice).status_code == 200  # small pages stay free
        # Login is limited per source address, whatever the account.
        for name in ("nobody", "carol"):
            r = c.post(f"{API}/auth/login", json={"username": name, "password": "x"})
            assert r.status_code == 401
        r = c.post(f"{API}/auth/login", json={"username": "alice", "password": "x"})
        assert r.status_code == 429 and "retry-after" in r.headers


def test_metrics_needs_the_scrape_token(world: World, db_engine: sa.Engine, tmp_path: Path) -> None:
    with client_with(world, db_engine, tmp_path, metrics_token="scrape-secret") as c:
        r = c.get("/metrics")
        assert r.status_code == 401 and "CORRAL_METRICS_TOKEN" in r.json()["detail"]
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert (
            c.get("/metrics", headers=world.as_("admin")).status_code == 401
        )  # API tokens are not scrape tokens
        r = c.get("/metrics", headers={"Authorization": "Bearer scrape-secret"})
        assert r.status_code == 200 and "corral_" in r.text
    token_file = tmp_path / "metrics.token"
    token_file.write_text("from-a-file\n")
    with client_with(world, db_engine, tmp_path, metrics_token_file=token_file) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer from-a-file"}).status_code == 200
    # A public bind without a token: closed, saying what to set. A loopback bind: open.
    with client_with(world, db_engine, tmp_path, host="0.0.0.0") as c:
        r = c.get("/metrics")
        assert r.status_code == 401 and "not a private address" in r.json()["detail"]
    with client_with(world, db_engine, tmp_path, host="127.0.0.1") as c:
        assert c.get("/metrics").status_code == 200


def test_metrics_needs_the_scrape_token_on_slurm_even_on_a_private_bind(
    world: World, db_engine: sa.Engine, tmp_path: Path
) -> None:
    """A Slurm job shares its node's network: on a private bind it could still scrape /metrics,
    whose GPU series name every running job's user and group (review104 finding 7)."""
    with client_with(world, db_engine, tmp_path, host="127.0.0.1", engine="slurm") as c:
        r = c.get("/metrics")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "Slurm engine's jobs share their node's network" in r.json()["detail"]
        assert "CORRAL_METRICS_TOKEN" in r.json()["detail"]
    with client_with(world, db_engine, tmp_path, host="127.0.0.1", engine="slurm", metrics_token="s3") as c:
        assert c.get("/metrics").status_code == 401
        r = c.get("/metrics", headers={"Authorization": "Bearer s3"})
        assert r.status_code == 200 and "corral_" in r.text


def test_unreadable_metrics_token_file_refuses_start(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path, database_url="sqlite:///unused", metrics_token_file=tmp_path / "missing"
    )
    with pytest.raises(ValueError, match="CORRAL_METRICS_TOKEN_FILE"):
        create_app(settings, db_engine=sa.create_engine("sqlite://"))


def test_a_blank_or_unreadable_metrics_token_refuses_start_up_in_one_line_writing_nothing(
    tmp_path: Path,
) -> None:
    """CORRAL_METRICS_TOKEN of blanks only was the token "" (stripped): every scrape 401 with no
    word of why, and an empty `Bearer` compared with it by hand matched it (review126 #5); it
    refuses start-up, as a token file that cannot be read or is empty does. Found only by the
    app's MetricsGuard, that was a traceback after the home was written (review127 #2): now one
    line, before anything is."""
    empty = tmp_path / "empty-token"
    empty.write_text("")
    for extra_env, said in (
        (
            {"CORRAL_METRICS_TOKEN": "  \t "},
            "CORRAL_METRICS_TOKEN: it is empty (blanks only): set a token or unset it",
        ),
        (
            {"CORRAL_METRICS_TOKEN_FILE": str(tmp_path / "absent")},
            f"CORRAL_METRICS_TOKEN_FILE={tmp_path / 'absent'}: cannot read it",
        ),
        ({"CORRAL_METRICS_TOKEN_FILE": str(empty)}, f"CORRAL_METRICS_TOKEN_FILE: {empty} is empty"),
    ):
        home = tmp_path / "home"
        env = server_env(home, database_url=None, virtual_gpus=1, extra_env=extra_env)
        done = subprocess.run(
            [sys.executable, "-m", "corral.server", "--host", "127.0.0.1", "--port", str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {said}"), done.stderr
        assert lines[0].endswith(". Nothing was written."), done.stderr
        assert not home.exists() or not any(home.iterdir()), sorted(home.iterdir())


@pytest.mark.parametrize(
    ("host", "private"),
    [("127.0.0.1", True), ("::1", True), ("10.1.2.3", True), ("192.168.0.9", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("8.8.8.8", False), ("corral.example.org", False)],
)  # fmt: skip
def test_private_bind_rule(host: str, private: bool) -> None:
    assert binds_private_only(host) is private
