"""Workspaces end to end on a real server, local engine, sandboxed: JupyterLab started by a
workspace job and reached only through Corral's proxy — by Chromium (open a notebook, run a cell
that prints CUDA_VISIBLE_DEVICES and writes a file to the home dir), by a kernel WebSocket, and
refused to another user (404, as a missing one) and to nobody (redirect to the login);
stop/start keeps the file; a short idle timeout stops a workspace through the idle-GPU policy;
the owner's training logs are readable (read-only) at /logs inside the workspace; a server
SIGKILL and restart keeps the workspace, its kernel and a new ssh through the gateway working."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.server_fixture import CorralServer, start_server, wait_for
from tests.server_harness import free_port
from tests.web.conftest import PASSWORD, launch_browser, screenshot
from tests.workspaces import kernel_client

pytestmark = pytest.mark.browser
API = "/api/v1"
CELL = (
    "import os, pathlib\n"
    "print('CUDA=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))\n"
    "pathlib.Path(os.environ['HOME'], 'from-notebook.txt').write_text('kept')\n"
    "print('wrote ' + os.environ['HOME'])"
)

SSH_PORT = free_port()
LAB_PORT = free_port()  # the workspaces' own origin (CORRAL_WORKSPACE_PORT): JupyterLab is served there
LAB_URL = f"http://127.0.0.1:{LAB_PORT}"
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"]
SSH_OPTS += ["-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    home = tmp_path_factory.mktemp("ws") / "home"
    env = {
        "CORRAL_MONITOR_IDLE_INTERVAL_S": "0.5",
        "CORRAL_MONITOR_SAMPLE_INTERVAL_S": "1",
        "CORRAL_WORKSPACE_IDLE_GRACE_S": "1",
        "CORRAL_SSH_GATEWAY_PORT": str(SSH_PORT),  # the snippet names the port this server uses
        "CORRAL_WORKSPACE_PORT": str(LAB_PORT),
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


def lab_of(c: httpx.Client) -> httpx.Client:
    """`c`'s token on the workspace origin, where JupyterLab is served (the portal only hands over)."""
    return httpx.Client(base_url=LAB_URL, headers={"Authorization": c.headers["Authorization"]}, timeout=30)


def wait_jupyter(c: httpx.Client, ws_id: int, timeout_s: float = 60) -> None:
    with lab_of(c) as lab:
        wait_for(
            lambda: lab.get(f"/ws/{ws_id}/api/status").status_code == 200,
            timeout_s,
            interval_s=0.2,
            what=f"workspace {ws_id}'s JupyterLab through the proxy",
        )


def start_kernel(c: httpx.Client, ws_id: int) -> str:
    with lab_of(c) as lab:
        r = lab.post(f"/ws/{ws_id}/api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def run_in_kernel(srv: CorralServer, ws_id: int, kernel: str, code: str, token: str) -> str:
    del srv  # the kernel's WebSocket is on the workspace origin
    return kernel_client.run_in_kernel(LAB_URL, ws_id, kernel, code, token)


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


def ssh_key_of(c: httpx.Client, tmp_path: Path) -> Path:
    """A new ed25519 key, its public half registered for `c`'s user."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    r = c.post(f"{API}/ssh-keys", json={"name": "laptop", "public_key": key.with_suffix(".pub").read_text()})
    assert r.status_code == 201, r.text
    return key


def ssh_into(key: Path, login: str, command: str) -> subprocess.CompletedProcess[str]:
    """Debian's OpenSSH client through the gateway, one command."""
    argv = ["ssh", "-p", str(SSH_PORT), "-i", str(key), *SSH_OPTS, f"{login}@127.0.0.1", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)


def test_jupyterlab_through_the_proxy(server: CorralServer, playwright_instance: Any, tmp_path: Path) -> None:
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
    # Nobody: a redirect to the login; another user: a missing workspace's 404 on HTTP, 403 on the
    # WebSocket (a refused handshake, as for a missing one).
    anonymous = httpx.get(f"{server.url}/ws/{ws['id']}/lab", follow_redirects=False)
    assert anonymous.status_code == 302 and anonymous.headers["location"].startswith("/login?next=/ws/")
    assert ben.get(f"/ws/{ws['id']}/lab").status_code == 404
    with lab_of(ben) as bens_lab:
        assert bens_lab.get(f"/ws/{ws['id']}/lab").status_code == 404
    ben_token = ben.headers["Authorization"].split()[1]
    with pytest.raises(InvalidStatus) as refused:
        connect(
            f"ws://127.0.0.1:{LAB_PORT}/ws/{ws['id']}/api/events/subscribe",
            additional_headers={"Authorization": f"Bearer {ben_token}", "Origin": LAB_URL},
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
    with lab_of(ann) as lab:
        assert lab.put(f"/ws/{ws['id']}/api/contents/probe.ipynb", json=notebook).status_code in (200, 201)
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
        # Handed over by the portal to the workspace origin (its state cookie, a one-time ticket bound
        # to it, then its cookie).
        page.wait_for_url(f"{LAB_URL}/ws/{ws['id']}/lab/**")
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
        assert answer is not None and answer.status == 404
        # A browser gets a page, not JSON: the refusal's words and the way back to the portal.
        assert other.inner_text("p") == f"there is no workspace {ws['id']}"
        assert other.get_attribute("a", "href") == "/workspaces"
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
    with lab_of(ann) as lab:
        kept = lab.get(f"/ws/{ws['id']}/api/contents/from-notebook.txt")
    assert kept.status_code == 200 and kept.json()["content"] == "kept"

    # A server SIGKILL and restart: the workspace keeps running (the engine adopts it), a new
    # OpenSSH connection through the gateway gets in within 10 s of the server being back, the
    # proxy serves JupyterLab again and the kernel still has its variables.
    key = ssh_key_of(ann, tmp_path)
    assert ssh_into(key, "ann+nb", "echo in-$CORRAL_WORKSPACE").stdout.strip() == "in-nb"
    kernel = start_kernel(ann, ws["id"])
    assert run_in_kernel(server, ws["id"], kernel, "x = 41; print('set')", ann_token).strip() == "set"
    job_before = job_of(ann, restarted["job_id"])["attempts"][-1]["number"]
    server.kill()
    server.start()
    back = time.monotonic()
    mark("server restarted")
    answer = wait_for(
        lambda: (r := ssh_into(key, "ann+nb", "echo in-$CORRAL_WORKSPACE")).returncode == 0 and r,
        10,
        interval_s=0.2,
        what="a new ssh through the gateway after the restart",
    )
    assert answer.stdout.strip() == "in-nb" and time.monotonic() - back < 10
    mark(f"ssh after restart in {time.monotonic() - back:.1f} s")
    wait_jupyter(ann, ws["id"], timeout_s=30)
    assert run_in_kernel(server, ws["id"], kernel, "print(x + 1)", ann_token).strip() == "42"
    after = job_of(ann, restarted["job_id"])
    assert after["state"] == "running" and after["attempts"][-1]["number"] == job_before
    assert ann.delete(f"{API}/workspaces/nb").status_code == 204


def test_idle_workspace_is_stopped(server: CorralServer, playwright_instance: Any) -> None:
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

    # The GPU-hours reclaimed: a counter per group in /metrics, their sum on the portal dashboard.
    exposition = httpx.get(f"{server.url}/metrics").text
    samples = [
        float(line.split()[-1])
        for line in exposition.splitlines()
        if line.startswith("corral_workspace_gpu_hours_reclaimed_total{")
    ]
    assert 'corral_workspace_gpu_hours_reclaimed_total{group="team-a"}' in exposition
    browser = launch_browser(playwright_instance)
    try:
        page = browser.new_page()
        page.goto(f"{server.url}/login")
        page.fill("#username", "ann")
        page.fill("#password", PASSWORD)
        page.click("form.login-form button[type=submit]")
        shown = page.wait_for_selector("#gpu-hours-reclaimed .stat-value").inner_text()
        assert shown == f"{sum(samples):.1f}", (shown, samples)
        label = page.text_content("#gpu-hours-reclaimed .stat-label")  # shown upper-case by CSS
        assert label == "GPU-hours reclaimed from idle workspaces"
    finally:
        browser.close()


def submit_and_wait(c: httpx.Client, command: str) -> int:
    spec = {"name": "train", "tasks": {"main": {"command": command}}}
    r = c.post(f"{API}/jobs", json=spec)
    assert r.status_code == 201, r.text
    job_id = int(r.json()["id"])
    wait_for(lambda: job_of(c, job_id)["state"] == "succeeded", 60, interval_s=0.3, what=f"job {job_id}")
    return job_id


LOGS_CELL = """
import os
mine = {mine}
print(sorted(os.listdir('/logs')))
print(open(f'/logs/{{mine}}/rank-0.log').read().strip(), os.listdir(f'/logs/{{mine}}/attempt-1'))
for write in (lambda: open(f'/logs/{{mine}}/rank-0.log', 'a'), lambda: os.mkdir('/logs/mine')):
    try:
        write()
        print('written')
    except OSError as exc:
        print('refused', exc.errno)
"""


def test_training_logs_are_read_only_in_the_workspace(server: CorralServer) -> None:
    """Jobs submitted after the workspace started: the owner's logs appear at /logs/<job id>/
    without a restart of the workspace, nobody else's do, and nothing there can be written."""
    ann, ben = client_of(server, "ann"), client_of(server, "ben")
    r = ann.post(f"{API}/workspaces", json={"name": "logs", "memory": "2GiB"})
    assert r.status_code == 201, r.text
    ws = r.json()
    wait_jupyter(ann, ws["id"])
    mine = submit_and_wait(ann, "echo loss=0.125")
    theirs = submit_and_wait(ben, "echo ben-only")
    kernel = start_kernel(ann, ws["id"])
    token = ann.headers["Authorization"].split()[1]
    listing, content, *writes = run_in_kernel(
        server, ws["id"], kernel, LOGS_CELL.format(mine=mine), token
    ).splitlines()
    listed = json.loads(listing.replace("'", '"'))
    assert {str(ws["job_id"]), str(mine)} <= set(listed) and str(theirs) not in listed, listed
    assert all(job_of(ann, int(job_id))["user"] == "ann" for job_id in listed), listed
    assert content == "loss=0.125 ['rank-0.log']", content
    assert len(writes) == 2 and all(w in ("refused 13", "refused 30") for w in writes), writes
    linked = server.home / "storage" / "logs" / "ann" / str(mine)
    assert linked.is_dir() and ann.delete(f"{API}/jobs/{mine}").status_code == 204
    assert not linked.exists()  # the links go with the job
    assert ann.delete(f"{API}/workspaces/logs").status_code == 204
