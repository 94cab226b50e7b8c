"""A Slurm workspace's JupyterLab proves who it is (corral.workspaces.labtls): the proxy and the
idle reader talk to the node's port only over TLS pinned to the certificate the launcher made,
so another process holding that port (the launcher's window before JupyterLab binds, or a
JupyterLab gone while its job lives on) gets no request and no workspace credential, and the
user a 502 saying why. Real TLS servers on loopback stand in for the lab and for squatters; the
authorization decision is stubbed as in test_proxy_http.py (tests/slurm/test_slurm_workspaces.py
runs the real JupyterLab on the real Slurm harness)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse
from websockets.asyncio.server import ServerConnection, serve

from corral.workspaces import activity, labtls, launch, proxy
from corral.workspaces.endpoint import EndpointUnusable, Upstream, jupyter_upstream, parse_endpoint
from corral.workspaces.jupyter_auth import HEADER

TOKEN = "the-workspace-credential-0123456789"
KERNELS = b'[{"id": "k1", "last_activity": "2026-01-02T03:04:05Z", "execution_state": "idle"}]'


class Loop:
    """An event loop in a thread, serving the stand-ins while the proxy runs in the test's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[Any] = []

    def run(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def listen(self, handler: Callable[..., Awaitable[None]], tls: ssl.SSLContext | None) -> int:
        async def start() -> Any:
            return await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)

        server = self.run(start())
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def close(self) -> None:
        async def shut() -> None:
            for server in self.servers:
                server.close()
                try:
                    await asyncio.wait_for(server.wait_closed(), 2)
                except TimeoutError:
                    pass  # a connection the proxy still holds (a WebSocket) ends with the loop below

        self.run(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def loop() -> Iterator[Loop]:
    served = Loop()
    yield served
    served.close()


@pytest.fixture(autouse=True)
def fresh_proxy_state() -> Iterator[None]:
    yield
    proxy._pools.clear()
    proxy._decisions.clear()


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def lab_certificate(tmp_path: Path, name: str) -> tuple[ssl.SSLContext, str]:
    where = tmp_path / name
    where.mkdir()
    cert, key, fingerprint = labtls.make_certificate(str(where))
    return server_context(cert, key), fingerprint


def recording_http(seen: list[bytes], answer_anything: bool = False) -> Callable[..., Awaitable[None]]:
    """An HTTP server that keeps every byte it is sent (after TLS, when it has TLS) and answers a
    request's head, or with `answer_anything` whatever came, with a 200 of its own: the lab's
    stand-in, and what a squatter does."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                seen.append(data)
                if answer_anything or b"\r\n\r\n" in b"".join(seen):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(KERNELS), KERNELS))
                    await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    return handle


def proxy_app(monkeypatch: pytest.MonkeyPatch, port: int, fingerprint: str) -> FastAPI:
    async def allowed(*_: Any) -> proxy.Decision:
        upstream = Upstream(host="127.0.0.1", port=port, fingerprint=fingerprint)
        return proxy.Decision(200, upstream=upstream, token=TOKEN)

    monkeypatch.setattr(proxy, "authorize", allowed)
    app = FastAPI()
    app.include_router(proxy.router)
    return app


def proxied_get(app: FastAPI) -> httpx.Response:
    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await asyncio.wait_for(client.get("/ws/5/api/kernels"), 20)

    return asyncio.run(get())


def test_the_lab_is_reached_over_tls_with_its_own_certificate(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls, fingerprint = lab_certificate(tmp_path, "lab")
    seen: list[bytes] = []
    port = loop.listen(recording_http(seen), tls)
    r = proxied_get(proxy_app(monkeypatch, port, fingerprint))
    assert r.status_code == 200 and r.content == KERNELS, r.text
    request = b"".join(seen)
    assert request.startswith(b"GET /ws/5/api/kernels HTTP/1.1\r\n"), request
    assert f"{HEADER}: {TOKEN}".encode() in request, request
    upstream = Upstream(host="127.0.0.1", port=port, fingerprint=fingerprint)
    at = activity.jupyter_last_activity(upstream, "/ws/5/", TOKEN, now=2e9)
    assert at == 1767323045.0  # the kernel's last_activity: the idle reader got through too


@pytest.mark.parametrize("squatter", ["another certificate", "plain HTTP"])
def test_a_squatter_on_the_port_gets_no_request_and_the_user_a_502(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squatter: str
) -> None:
    """What holds the port answers 200 to anything it is sent (its answer would be served on the
    portal's origin); it gets a TLS handshake at most, never a request byte or the credential."""
    _, fingerprint = lab_certificate(tmp_path, "lab")
    seen: list[bytes] = []
    tls = lab_certificate(tmp_path, "squatter")[0] if squatter == "another certificate" else None
    port = loop.listen(recording_http(seen, answer_anything=True), tls)
    app = proxy_app(monkeypatch, port, fingerprint)

    r = proxied_get(app)
    assert r.status_code == 502, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"workspace 5's JupyterLab is not there: 127.0.0.1:{port} did not prove"), detail
    assert detail.endswith("nothing was sent to it"), detail
    if squatter == "another certificate":
        assert "is not the one the workspace's JupyterLab reported" in detail, detail

    channels = "/ws/5/api/kernels/k1/channels"
    with (
        TestClient(app) as client,
        pytest.raises(WebSocketDenialResponse) as denied,
        client.websocket_connect(channels, headers={"origin": "http://testserver"}),
    ):
        pass  # (the handshake is in the `with`)
    assert denied.value.status_code == 502, denied.value.text
    assert "did not prove to be it" in denied.value.json()["detail"], denied.value.text

    upstream = Upstream(host="127.0.0.1", port=port, fingerprint=fingerprint)
    with pytest.raises(activity.NO_ANSWER):
        activity.jupyter_last_activity(upstream, "/ws/5/", TOKEN, now=2e9)

    time.sleep(0.2)  # the squatter's last reads
    received = b"".join(seen)
    if squatter == "another certificate":
        assert received == b"", received  # its TLS completed; not one byte of a request followed
    else:
        assert all(chunk.startswith(b"\x16\x03") for chunk in seen), seen  # TLS ClientHellos only
    # (a ClientHello may name "http/1.1", as its ALPN; a request line ends " HTTP/1.1\r\n")
    for leak in (TOKEN.encode(), HEADER.lower().encode(), b"/ws/5/", b" http/1.1\r\n", b"upgrade:"):
        assert leak not in received.lower(), received


def test_the_proxys_websocket_reaches_the_lab_over_pinned_tls(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls, fingerprint = lab_certificate(tmp_path, "lab")

    async def answer(connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None
        await connection.send(json.dumps([request.path, request.headers.get(HEADER)]))
        async for message in connection:
            await connection.send(message)

    async def start() -> Any:
        return await serve(answer, "127.0.0.1", 0, ssl=tls)

    server = loop.run(start())
    loop.servers.append(server)
    port = next(iter(server.sockets)).getsockname()[1]
    app = proxy_app(monkeypatch, port, fingerprint)
    with TestClient(app) as client:
        url = "/ws/5/api/kernels/k1/channels?session_id=s"
        with client.websocket_connect(url, headers={"origin": "http://testserver"}) as ws:
            assert json.loads(ws.receive_text()) == [url, TOKEN]
            ws.send_text("run")
            assert ws.receive_text() == "run"


def test_the_launcher_makes_a_private_key_and_pins_its_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(launch.LISTEN_ENV, "tcp")
    monkeypatch.setenv("CORRAL_HOST", "127.0.0.1")
    work, temp = tmp_path / "work", tmp_path / "tmp"  # the job's work dir (shared storage), its /tmp
    work.mkdir()
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    started = time.perf_counter()
    argv = launch.listen_argv(str(work))
    print(f"key, certificate and endpoint file: {1000 * (time.perf_counter() - started):.0f} ms")
    options = dict(arg.removeprefix("--ServerApp.").split("=", 1) for arg in argv)
    assert options["ip"] == "127.0.0.1" and options["port_retries"] == "0", options
    port, fingerprint = parse_endpoint((work / launch.ENDPOINT_NAME).read_bytes())
    assert port == int(options["port"])
    cert, key = Path(options["certfile"]), Path(options["keyfile"])
    assert labtls.fingerprint_of_pem(cert.read_text()) == fingerprint
    assert cert.parent == key.parent and cert.parent.parent == temp  # the key stays off the shared storage
    assert stat.S_IMODE(os.stat(cert.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    server_context(str(cert), str(key))  # the pair JupyterLab loads: the key is the certificate's
    launch.listen_argv(str(work))  # the next start: a new key, so one that leaked once is no use later
    assert parse_endpoint((work / launch.ENDPOINT_NAME).read_bytes())[1] != fingerprint


def test_without_cryptography_the_certificate_comes_from_openssl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_cryptography() -> tuple[bytes, bytes]:
        raise ImportError("No module named 'cryptography'")

    monkeypatch.setattr(labtls, "_with_cryptography", no_cryptography)
    cert, key, fingerprint = labtls.make_certificate(str(tmp_path))
    assert labtls.fingerprint_of_pem(Path(cert).read_text()) == fingerprint
    assert sorted(os.listdir(Path(cert).parent)) == [labtls.CERT_NAME, labtls.KEY_NAME]  # openssl's removed
    server_context(cert, key)
    monkeypatch.setattr(labtls.shutil, "which", lambda _: None)
    with pytest.raises(RuntimeError, match="no `cryptography` package and there is no `openssl` command"):
        labtls.make_certificate(str(tmp_path))


def test_an_endpoint_without_a_certificate_is_refused_by_name() -> None:
    with pytest.raises(EndpointUnusable, match="a port without a TLS certificate"):
        parse_endpoint(b"8888\n")  # what the launcher wrote before the pin: no clear text
    with pytest.raises(EndpointUnusable, match="not '<port> <certificate sha256>'"):
        parse_endpoint(b"8888 " + b"A" * 64)
    with pytest.raises(EndpointUnusable, match="port 22, outside 1024-65535"):
        parse_endpoint(b"22 " + b"a" * 64)
    assert parse_endpoint(b"8888 " + b"a" * 64 + b"\n") == (8888, "a" * 64)


@pytest.mark.skipif(os.geteuid() != 0, reason="a job's uid other than ours: needs root")
def test_the_endpoint_file_is_the_jobs_own_word_or_nothing(tmp_path: Path) -> None:
    """Read as root: a symlink in its place (to a file of the job's, even) or a file of another
    uid is not the job's word, and names no upstream."""
    job_uid = 300_124
    job = tmp_path / "attempts" / "1.1" / "job"
    work = job / "work" / "0"
    work.mkdir(parents=True)
    store = SimpleNamespace(load=lambda _: SimpleNamespace(uid=job_uid), job_dir=lambda _: job)
    engine = SimpleNamespace(name="slurm", store=store)
    endpoint = work / launch.ENDPOINT_NAME
    endpoint.write_text(f"8888 {'b' * 64}\n")
    os.chown(endpoint, job_uid, job_uid)
    assert jupyter_upstream(engine, "1.1", "10.0.0.7") == Upstream(
        host="10.0.0.7", port=8888, fingerprint="b" * 64
    )
    os.chown(endpoint, job_uid + 1, job_uid + 1)  # another user's file
    assert jupyter_upstream(engine, "1.1", "10.0.0.7") is None
    os.chown(endpoint, job_uid, job_uid)
    endpoint.rename(work / "elsewhere")
    endpoint.symlink_to(work / "elsewhere")
    os.lchown(endpoint, job_uid, job_uid)
    assert jupyter_upstream(engine, "1.1", "10.0.0.7") is None
