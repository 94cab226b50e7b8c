"""The build job's one network exception, on a real server (local engine, each job in its own
network namespace, outbound `none`): with CORRAL_ENV_INDEX_URL the build job reaches the package
index (here a PEP 503 index served by the test on a non-loopback address of this machine) through
slirp4netns, while an ordinary job, in that very environment, cannot reach it."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sdk import Client
from tests.environments.wheels import make_wheel
from tests.isolation.test_network import external_address
from tests.server_fixture import CorralServer, start_server
from tests.support import require

PKG = "corraltestpkg"


class Index(http.server.SimpleHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, format: str, *args: object) -> None:
        Index.hits.append(self.path)


def serve_index(base: Path, address: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    wheel = make_wheel(base / "files", PKG, "1.0", "VALUE = 7\n")
    page = base / "simple" / PKG / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<html><body><a href="../../files/{wheel.name}">{wheel.name}</a></body></html>\n')
    handler = functools.partial(Index, directory=str(base))
    httpd = http.server.ThreadingHTTPServer((address, 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://{address}:{httpd.server_address[1]}/simple"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CorralServer, str]]:
    address = external_address()
    require(address is not None, "a non-loopback IPv4 address for the test's package index")
    assert address is not None
    base = tmp_path_factory.mktemp("envindex")
    httpd, url = serve_index(base / "index", address)
    srv = start_server(base / "home", allow_unisolated=False, extra_env={"CORRAL_ENV_INDEX_URL": url})
    try:
        yield srv, url
    finally:
        srv.stop()
        httpd.shutdown()


def test_the_build_reaches_the_index_and_jobs_do_not(indexed: tuple[CorralServer, str]) -> None:
    server, url = indexed
    admin = Client(server.url, server.token)
    admin.create_group("g")
    admin.create_user("alice", groups=["g"], default_group="g")
    alice = Client(server.url, admin.create_token("alice-t", user="alice")["token"])
    queued = alice.create_environment("netpkg", f"{PKG}==1.0\n")
    built = alice.wait_environment("netpkg", queued["version"], timeout_s=120, poll_s=0.2)
    log = alice.logs(built["build_job_id"])["data"]
    assert built["state"] == "ready", (built, log)
    assert f"/simple/{PKG}/" in Index.hits  # resolved through the network, from the admin's index
    assert any(hit.endswith(".whl") for hit in Index.hits)
    fetch = f"python -c 'import urllib.request as u; u.urlopen(\"{url}/{PKG}/\", timeout=5)'"
    job = alice.submit(
        {
            "name": "no-net",
            "environment": "netpkg",
            "resources": {"cpus": 0.25, "memory": "256MiB"},
            "command": f"python -c 'import {PKG}; print(\"VALUE\", {PKG}.VALUE)'; "
            f"{fetch} 2>/dev/null && echo REACHED || echo UNREACHABLE",
        }
    )
    job = alice.wait(job["id"], timeout_s=60)
    out = alice.logs(job["id"])["data"]
    assert job["state"] == "succeeded", out
    assert "VALUE 7" in out and "UNREACHABLE" in out and "REACHED\n" not in out.replace("UNREACHABLE", "")
