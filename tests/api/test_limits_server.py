"""The API limits and credential hygiene against a REAL server process (tests/server_harness.py):
a 20 MB body is refused 413, a 5,000-level JSON body 400, a stalled body 408, /metrics wants its
scrape token, and no token or password ever reaches the server's log."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_fixture import CorralServer, start_server

API = "/api/v1"
SCRAPE_TOKEN = "scrape-token-for-the-test"
PASSWORD = "dora-s-password-1234"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    home: Path = tmp_path_factory.mktemp("limits") / "home"
    env = {"CORRAL_METRICS_TOKEN": SCRAPE_TOKEN, "CORRAL_API_BODY_TIMEOUT_S": "1"}
    server = start_server(home, extra_env=env)
    try:
        yield server
    finally:
        server.stop()


def test_big_and_deep_bodies_are_refused_with_4xx(srv: CorralServer) -> None:
    with srv.client() as c:
        r = c.post(f"{API}/jobs", content=b"x" * (20 << 20), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "CORRAL_API_MAX_BODY_BYTES" in r.json()["detail"]
        deep = "[" * 5000 + "]" * 5000
        r = c.post(f"{API}/jobs", content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "nested more than 32 levels deep" in r.json()["detail"]
        # The server is still fine.
        assert c.get(f"{API}/me").json()["name"] == "admin"


def test_a_stalled_body_gets_408(srv: CorralServer) -> None:
    host, port = "127.0.0.1", srv.port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"name":'
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert "CORRAL_API_BODY_TIMEOUT_S" in json.loads(body)["detail"]


def test_metrics_scrape_needs_the_token(srv: CorralServer) -> None:
    with httpx.Client(base_url=srv.url, timeout=10) as anonymous:
        r = anonymous.get("/metrics")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = anonymous.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
        assert r.status_code == 200 and "corral_" in r.text


def test_tokens_and_passwords_never_reach_the_log(srv: CorralServer) -> None:
    with srv.client() as admin:
        r = admin.post(f"{API}/users", json={"name": "dora", "password": PASSWORD})
        assert r.status_code == 201, r.text
        created = admin.post(f"{API}/tokens", json={"name": "t", "user": "dora"}).json()["token"]
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.get(f"{API}/me", headers={"Authorization": f"Bearer {created}"}).status_code == 200
        assert c.get(f"{API}/me", headers={"Authorization": "Bearer crl_wrong-token-xyz"}).status_code == 401
        assert c.post(f"{API}/auth/login", json={"username": "dora", "password": PASSWORD}).status_code == 200
        cookie = c.cookies["corral_session"]
        r = c.post(f"{API}/auth/login", json={"username": "dora", "password": PASSWORD + "-wrong"})
        assert r.status_code == 401
    log = srv.log_text()
    assert "failed login for account 'dora'" in log  # the failure is logged ...
    for secret in (created, srv.token, PASSWORD, cookie, "crl_wrong-token-xyz", SCRAPE_TOKEN):
        assert secret not in log  # ... and no secret is
