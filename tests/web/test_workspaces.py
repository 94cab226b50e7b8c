"""Workspaces end to end on a real server, local engine, sandboxed: JupyterLab started by a
workspace job and reached only through Corral's proxy — by Chromium (open a notebook, run a cell
that prints CUDA_VISIBLE_DEVICES and writes a file to the home dir), by a kernel WebSocket, and
refused to another user (403) and to nobody (redirect to the login); stop/start keeps the file;
a short idle timeout stops a workspace through the idle-GPU policy."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.server_fixture import CorralServer, start_server, wait_for
from tests.server_harness import free_port
from tests.web.conftest import PASSWORD, launch_browser, screenshot

pytestmark = pytest.mark.browser
API = "/api/v1"
CELL = (
    "import os, pathlib\n"
    "print('CUDA=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))\n"
    "pathlib.Path(os.environ['HOME'], 'from-notebook.txt').write_text('kept')\n"
    "print('wrote ' + os.environ['HOME'])"
)

SSH_PORT = free_port()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    home = tmp_path_factory.mktemp("ws") / "home"
    env = {
        "CORRAL_MONITOR_IDLE_INTERVAL_S": "0.5",
        "CORRAL_MONITOR_SAMPLE_INTERVAL_S": "1",
        "CORRAL_WORKSPACE_IDLE_GRACE_S": "1",
        "CORRAL_SSH_GATEWAY_PORT": str(SSH_PORT),  # the snippet names the port this server uses
    }
    srv = start_server(home, extra_env=env)
    try:
        with srv.client() as admin:
            for group in ("team-a", "team-b"):
                quota = [{"gpu_model": "VGPU", "guaranteed": 2}]
                assert admin.post(f"{API}/groups", json={"name": group, "quotas": quota}).status_code == 201
            for name, group in (("ann", "team-a"), ("ben", "team-b")):
                body = {"name": name, "password": PASSWORD, "groups": [group], "default_group": group}
                assert admin.post(f"{API}/users", json=body).status_code == 201
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(home, ignore_errors=True)


def client_of(srv: CorralServer, user: str) -> httpx.Client:
    with srv.client() as admin:
        token = admin.post(f"{API}/tokens", json={"name": "t", "user": user}).json()["token"]
    return srv.client(token, timeout=30)


def wait_jupyter(c: httpx.Client, ws_id: int, timeout_s: float = 60) -> None:
    wait_for(
        lambda: c.get(f"/ws/{ws_id}/api/status").status_code == 200,
        timeout_s,
        interval_s=0.2,
        what=f"workspace {ws_id}'s JupyterLab through the proxy",
    )


def start_kernel(c: httpx.Client, ws_id: int) -> str:
    r = c.post(f"/ws/{ws_id}/api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def run_in_kernel(srv: CorralServer, ws_id: int, kernel: str, code: str, token: str) -> str:
    """Run `code` in the kernel over its WebSocket through the proxy; its stdout."""
    url = f"ws://127.0.0.1:{srv.port}/ws/{ws_id}/api/kernels/{kernel}/channels"
    headers = {"Authorization": f"Bearer {token}", "Origin": srv.url}
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "",
        "session": "t",
        "version": "5.3",
    }
    request = {
        "header": header,
        "parent_header": {},
        "metadata": {},
        "content": {"code": code, "silent": False},
        "channel": "shell",
    }
    out = []
    with connect(url, additional_headers=headers, open_timeout=20) as ws:
        ws.send(json.dumps(request))
        while True:
            msg = json.loads(ws.recv(timeout=30))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)


def run_first_cell(page: Any) -> Any:
    """Run the notebook's first cell and return its output element. JupyterLab may still be
    wiring its kernel session when the page looks ready (a slow 2-core machine): a run that
    produced nothing is tried again."""
    page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content")
    page.wait_for_function("document.body.innerText.includes('| Idle')", timeout=60_000)
    for attempt in range(3):
        page.click(".jp-Notebook .jp-Cell .cm-content >> nth=0")
        page.keyboard.press("Control+Enter")  # run the cell, stay on it
        try:
            return page.wait_for_selector(".jp-OutputArea-output:has-text('CUDA=')", timeout=15_000)
        except Exception:
            if attempt == 2:
                screenshot(page, "workspace-jupyterlab-failed")
                raise
    return None


def job_of(c: httpx.Client, job_id: int) -> dict[str, Any]:
    return dict(c.get(f"{API}/jobs/{job_id}").json())


def test_jupyterlab_through_the_proxy(server: CorralServer, playwright_instance: Any) -> None:
    started = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f} s  {what}")

    ann, ben = client_of(server, "ann"), client_of(server, "ben")
    r = ann.post(f"{API}/workspaces", json={"name": "nb", "gpus": 1, "memory": "2GiB"})
    assert r.status_code == 201, r.text
    ws = r.json()
    wait_jupyter(ann, ws["id"])
    mark("jupyter ready")
    job = job_of(ann, ws["job_id"])
    assert job["state"] == "running" and job["spec"]["kind"] == "workspace"
    gpu_uuids = job["attempts"][-1]["placement"][0]["gpu_uuids"]
    assert len(gpu_uuids) == 1

    mark("nobody")
    # Nobody: a redirect to the login; another user: 403 on HTTP and on the WebSocket.
    anonymous = httpx.get(f"{server.url}/ws/{ws['id']}/lab", follow_redirects=False)
    assert anonymous.status_code == 302 and anonymous.headers["location"].startswith("/login?next=/ws/")
    assert ben.get(f"/ws/{ws['id']}/lab").status_code == 403
    ben_token = ben.headers["Authorization"].split()[1]
    with pytest.raises(InvalidStatus) as refused:
        connect(
            f"ws://127.0.0.1:{server.port}/ws/{ws['id']}/api/events/subscribe",
            additional_headers={"Authorization": f"Bearer {ben_token}", "Origin": server.url},
        )
    assert refused.value.response.status_code == 403

    # The kernel WebSocket through the proxy runs code in the sandbox, with only its GPU.
    ann_token = ann.headers["Authorization"].split()[1]
    kernel = start_kernel(ann, ws["id"])
    code = "import os; print(os.getuid(), os.environ['CUDA_VISIBLE_DEVICES'])"
    printed = run_in_kernel(server, ws["id"], kernel, code, ann_token)
    uid, cuda = printed.split()
    assert cuda == gpu_uuids[0] and int(uid) != 0

    mark("chromium")
    # Chromium: log in through the redirect, open a notebook, run the cell, see its output.
    notebook = {
        "type": "notebook",
        "content": {
            "cells": [
                {"cell_type": "code", "source": CELL, "metadata": {}, "outputs": [], "execution_count": None}
            ],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        },
    }
    assert ann.put(f"/ws/{ws['id']}/api/contents/probe.ipynb", json=notebook).status_code in (200, 201)
    browser = launch_browser(playwright_instance)
    try:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(90_000)  # JupyterLab loads ~40 JS chunks; slow on a busy 2-core machine
        page.goto(f"{server.url}/ws/{ws['id']}/lab/tree/probe.ipynb")
        page.wait_for_url("**/login**")
        page.fill("#username", "ann")
        page.fill("#password", PASSWORD)
        page.click("form.login-form button[type=submit]")
        page.wait_for_url(f"**/ws/{ws['id']}/lab/**")
        output = run_first_cell(page)
        text = output.inner_text()
        assert f"CUDA={gpu_uuids[0]}" in text and "wrote /home" in text
        screenshot(page, "workspace-jupyterlab")
        listing = context.new_page()  # the portal's Workspaces page, same session
        listing.goto(f"{server.url}/workspaces")
        listing.wait_for_selector("#ws-list td:has-text('running')")
        assert listing.get_attribute("a.ws-open", "href") == f"/ws/{ws['id']}/lab"
        snippet = listing.inner_text("#ws-ssh-config")
        assert "User ann+nb" in snippet and f"Port {SSH_PORT}" in snippet
        screenshot(listing, "workspaces-page")
        other = browser.new_page()
        other.goto(f"{server.url}/login")
        other.fill("#username", "ben")
        other.fill("#password", PASSWORD)
        other.click("form.login-form button[type=submit]")
        other.wait_for_selector("#topbar:not([hidden])")
        answer = other.goto(f"{server.url}/ws/{ws['id']}/lab")
        assert answer is not None and answer.status == 403
    finally:
        browser.close()

    mark("stop")
    # Stop, start: a new job, the file is still in the home.
    assert ann.post(f"{API}/workspaces/nb/stop").status_code == 200
    wait_for(lambda: job_of(ann, ws["job_id"])["state"] == "cancelled", 30, what="the stop")
    restarted = ann.post(f"{API}/workspaces/nb/start").json()
    assert restarted["job_id"] != ws["job_id"]
    wait_jupyter(ann, ws["id"])
    mark("restarted")
    kept = ann.get(f"/ws/{ws['id']}/api/contents/from-notebook.txt")
    assert kept.status_code == 200 and kept.json()["content"] == "kept"

    # A server SIGKILL and restart: the workspace keeps running (the engine adopts it), the proxy
    # serves it again and the kernel still has its variables.
    kernel = start_kernel(ann, ws["id"])
    assert run_in_kernel(server, ws["id"], kernel, "x = 41; print('set')", ann_token).strip() == "set"
    job_before = job_of(ann, restarted["job_id"])["attempts"][-1]["number"]
    server.kill()
    server.start()
    mark("server restarted")
    wait_jupyter(ann, ws["id"], timeout_s=30)
    assert run_in_kernel(server, ws["id"], kernel, "print(x + 1)", ann_token).strip() == "42"
    after = job_of(ann, restarted["job_id"])
    assert after["state"] == "running" and after["attempts"][-1]["number"] == job_before
    assert ann.delete(f"{API}/workspaces/nb").status_code == 204


def test_idle_workspace_is_stopped(server: CorralServer) -> None:
    ann = client_of(server, "ann")
    r = ann.post(f"{API}/workspaces", json={"name": "idle", "idle_timeout": "2s"})
    assert r.status_code == 201, r.text
    ws = r.json()  # no kernel, no terminal, no GPU: idle from the start
    wait_for(
        lambda: job_of(ann, ws["job_id"])["state"] == "cancelled", 40, interval_s=0.3, what="the idle stop"
    )
    events = ann.get(f"{API}/jobs/{ws['job_id']}/events").json()
    assert any(e["kind"] == "idle_gpu" and "stopped" in e["message"] for e in events), events
    assert ann.get(f"{API}/workspaces/idle").json()["state"] == "stopped"
