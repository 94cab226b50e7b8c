"""Workspaces: how long from `POST /workspaces` until JupyterLab answers through Corral's proxy, and
what the proxy adds per HTTP request and per WebSocket message, against a direct connection to the
same JupyterLab's Unix socket measured in the same run.

    python bench/workspace_ready.py [--count 20] [--requests 300]

A real server (local engine, sandboxed, SQLite) on an otherwise idle machine: `--count` workspaces
(no GPU, 1 CPU) created one after another, each waited for (`GET /ws/<id>/api/status` = 200) and
stopped before the next. Then, with one workspace running, `--requests` sequential GETs of
`/ws/<id>/api/status` and as many kernel_info round trips on a kernel's WebSocket, through the
proxy and straight to the socket (with the credential the proxy adds). Prints p50/p95 and the
difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from websockets.sync.client import connect, unix_connect

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.server_harness import CorralServer, start_server  # noqa: E402

API = "/api/v1"
HEADER = "X-Corral-Workspace-Token"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:7.2f} ms   p95 {pct(values, 0.95) * 1000:7.2f} ms"


def user_client(srv: CorralServer) -> httpx.Client:
    with srv.client() as admin:
        admin.post(f"{API}/groups", json={"name": "bench"})
        admin.post(f"{API}/users", json={"name": "bench", "groups": ["bench"], "default_group": "bench"})
        token = admin.post(f"{API}/tokens", json={"name": "b", "user": "bench"}).json()["token"]
    return srv.client(token, timeout=60)


def wait_ready(c: httpx.Client, ws_id: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while c.get(f"/ws/{ws_id}/api/status").status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit(f"workspace {ws_id} not ready in {timeout_s} s")
        time.sleep(0.05)


def stop_and_wait(c: httpx.Client, name: str, job_id: int) -> None:
    c.post(f"{API}/workspaces/{name}/stop")
    while c.get(f"{API}/jobs/{job_id}").json()["state"] not in ("cancelled", "failed", "succeeded"):
        time.sleep(0.1)


def readiness(c: httpx.Client, count: int) -> list[float]:
    times = []
    for i in range(count):
        started = time.monotonic()
        ws = c.post(f"{API}/workspaces", json={"name": f"b{i}", "cpus": 1, "memory": "2GiB"}).json()
        wait_ready(c, ws["id"])
        times.append(time.monotonic() - started)
        print(f"  workspace {i + 1}/{count}: ready in {times[-1]:.2f} s", flush=True)
        stop_and_wait(c, ws["name"], ws["job_id"])
    return times


def direct_target(srv: CorralServer, ws_id: int) -> tuple[str, str]:
    """The JupyterLab socket and credential of a running workspace, read as the proxy does."""
    db = sa.create_engine(f"sqlite:///{srv.home / 'corral.db'}")
    with db.connect() as conn:
        token, job_id = conn.execute(
            sa.text("SELECT jupyter_token, current_job_id FROM workspaces WHERE id = :id"), {"id": ws_id}
        ).one()
        number = conn.execute(
            sa.text("SELECT max(number) FROM attempts WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()
    db.dispose()
    return str(srv.home / "engine" / "attempts" / f"{job_id}.{number}" / "work" / "0" / "jupyter.sock"), token


def http_latency(client: httpx.Client, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        assert client.get(url).status_code == 200
        out.append(time.perf_counter() - started)
    return out


def kernel_info(ws: Any) -> None:
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "kernel_info_request",
        "username": "",
        "session": "b",
        "version": "5.3",
    }
    ws.send(
        json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": {}, "channel": "shell"})
    )
    while True:
        msg = json.loads(ws.recv(timeout=30))
        if msg["msg_type"] == "kernel_info_reply" and msg["parent_header"].get("msg_id") == msg_id:
            return


def ws_latency(ws: Any, n: int) -> list[float]:
    kernel_info(ws)  # warm
    out = []
    for _ in range(n):
        started = time.perf_counter()
        kernel_info(ws)
        out.append(time.perf_counter() - started)
    return out


def proxy_overhead(srv: CorralServer, c: httpx.Client, n: int) -> None:
    ws = c.post(f"{API}/workspaces", json={"name": "lat", "cpus": 1, "memory": "2GiB"}).json()
    wait_ready(c, ws["id"])
    socket, token = direct_target(srv, ws["id"])
    base = f"/ws/{ws['id']}/"
    kernel = c.post(f"{base}api/kernels", json={"name": "python3"}).json()["id"]
    direct = httpx.Client(transport=httpx.HTTPTransport(uds=socket), headers={HEADER: token})
    http_latency(c, f"{base}api/status", 20)  # warm both
    http_latency(direct, f"http://localhost{base}api/status", 20)
    proxied_http = http_latency(c, f"{base}api/status", n)
    direct_http = http_latency(direct, f"http://localhost{base}api/status", n)
    path = f"{base}api/kernels/{kernel}/channels"
    auth = {"Authorization": c.headers["Authorization"], "Origin": srv.url}
    with connect(f"ws://127.0.0.1:{srv.port}{path}", additional_headers=auth) as proxied_ws:
        proxied_msgs = ws_latency(proxied_ws, n)
    with unix_connect(socket, f"ws://localhost{path}", additional_headers={HEADER: token}) as direct_ws:
        direct_msgs = ws_latency(direct_ws, n)
    direct.close()
    print(f"HTTP GET api/status   via proxy  {ms(proxied_http)}")
    print(f"                      direct     {ms(direct_http)}")
    added = statistics.median(proxied_http) - statistics.median(direct_http)
    print(f"                      added at p50: {added * 1000:.2f} ms (target <= 2 ms)")
    print(f"WS kernel_info        via proxy  {ms(proxied_msgs)}")
    print(f"                      direct     {ms(direct_msgs)}")
    added = statistics.median(proxied_msgs) - statistics.median(direct_msgs)
    print(f"                      added at p50: {added * 1000:.2f} ms (target <= 2 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=20, help="workspaces created one after another")
    parser.add_argument("--requests", type=int, default=300, help="requests/messages per latency figure")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="corral-wsbench-")) / "home"
    srv = start_server(home, allow_unisolated=False)
    try:
        c = user_client(srv)
        print(f"create -> JupyterLab answers through the proxy, {args.count} workspaces:")
        times = readiness(c, args.count)
        print(f"ready: p50 {pct(times, 0.5):.2f} s   p95 {pct(times, 0.95):.2f} s   (target p95 < 5 s)")
        proxy_overhead(srv, c, args.requests)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
