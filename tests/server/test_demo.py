"""`corral up --demo` end to end: demo users and groups, and the example job really trains."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from corral.config import Settings
from corral.engine.local.engine import LocalEngine
from corral.monitor.config import generate_webhook_token, webhook_token
from corral.server.demo import demo_settings, isolation_line
from tests.server.test_e2e import TERMINAL, logs, wait_state
from tests.server_fixture import start_server, wait_for
from tests.support import require


def test_corral_up_demo_trains_the_example_and_survives_a_restart(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home", demo=True, via_cli=True)
    try:
        banner = srv.log_text()
        assert "Corral demo" in banner and "alice (alice-demo)" in banner and "corral ls" in banner
        config = srv.home / "config.yaml"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert yaml.safe_load(config.read_text())["token"] == srv.token
        # The demo made its own webhook secret: no start-up warning, and the webhook takes it.
        assert "no alert webhook token configured" not in banner, banner
        webhook_token = (srv.home / "alert_webhook_token").read_text().strip()
        assert stat.S_IMODE((srv.home / "alert_webhook_token").stat().st_mode) == 0o600
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {webhook_token}"}) as am:
            r = am.post("/api/v1/alerts/webhook", json={"alerts": []})  # past the token: the body's 400
            assert r.status_code == 400 and "malformed alert payload" in r.text, r.text
        with srv.client() as c:
            # The example runs in the demo's own environment, submitted once its build is done.
            demo = wait_for(
                lambda: next(
                    (j for j in c.get("/api/v1/jobs").json()["items"] if j["name"] == "digits-demo"), None
                ),
                180,
                what="the digits job, after the sklearn environment's build",
            )
            assert demo["user"] == "alice" and demo["group"] == "vision"
            assert demo["environment_version"] == "sklearn@1"
            envs = {e["name"]: e for e in c.get("/api/v1/environments").json()}
            assert envs["sklearn"]["official"] and envs["sklearn"]["latest_ready"] == 1
            done = wait_state(c, demo["id"], TERMINAL, timeout_s=150)
            out = logs(c, demo["id"])
            assert done["state"] == "succeeded", out
            accuracy = float(out.split("final test accuracy")[1].split()[0])
            assert accuracy > 0.85 and "epoch  30" in out
            assert done["attempts"][0]["placement"][0]["gpu_uuids"], "the demo job holds a virtual GPU"
        with httpx.Client(base_url=srv.url) as anon:
            r = anon.post("/api/v1/auth/login", json={"username": "bob", "password": "bob-demo"})
            assert r.status_code == 200, r.text
            # the bootstrap admin gets a one-time password too, so it can use the portal
            password = re.search(r"Admin password \(shown once; portal user 'admin'\): (\S+)", banner)
            assert password is not None, banner
            r = anon.post("/api/v1/auth/login", json={"username": "admin", "password": password.group(1)})
            assert r.status_code == 200 and r.json()["user"]["name"] == "admin", r.text
        srv.kill()
        srv.start()
        with srv.client() as c:
            wait_for(lambda: c.get("/api/v1/nodes").status_code == 200, 10)
            names = [j["name"] for j in c.get("/api/v1/jobs").json()["items"]]
            assert names.count("digits-demo") == 1
    finally:
        srv.stop()
    require("NOT isolated" not in banner, "job isolation (bubblewrap and cgroups)")
    assert "isolation: isolated: bubblewrap + setpriv" in banner  # the demo's job ran sandboxed


def test_the_demo_keeps_isolation_and_says_when_jobs_cannot_run(tmp_path: Path) -> None:
    """The demo used to switch allow_unisolated on, so on a machine without bubblewrap it ran
    jobs unsandboxed without being asked; now only the user's CORRAL_ALLOW_UNISOLATED does."""
    settings = Settings(home=tmp_path / "home", database_url="sqlite:///unused", virtual_gpus=2)
    assert demo_settings(settings).allow_unisolated is False
    (tmp_path / "no-cgroups").mkdir()
    engine = LocalEngine(tmp_path / "home", "n", virtual_gpus=0, cgroup_root=tmp_path / "no-cgroups")
    try:
        line = isolation_line(engine)
    finally:
        engine.close()
    assert line is not None and line.startswith("NOT STARTING JOBS: NOT isolated: ")
    assert "no usable cgroup" in line and "CORRAL_ALLOW_UNISOLATED=true" in line


def test_corral_up_on_a_port_in_use_fails_first_and_writes_nothing(tmp_path: Path) -> None:
    """Found by trying it: the demo data and the database were written, then uvicorn failed to bind."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update({"CORRAL_HOME": str(home), "CORRAL_VIRTUAL_GPUS": "1", "CORRAL_ALLOW_UNISOLATED": "true"})
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "corral.cli.main", "up", "--demo", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr and "Admin token" not in proc.stdout
    assert not home.exists() or not any(home.iterdir()), list(home.iterdir())


def test_the_demos_webhook_secret_is_made_once_and_never_over_a_configured_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_MONITOR_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("CORRAL_MONITOR_WEBHOOK_TOKEN_FILE", raising=False)
    settings = Settings(home=tmp_path, database_url="sqlite:///unused")
    assert webhook_token(settings) is None
    path = generate_webhook_token(settings)
    assert path == tmp_path / "alert_webhook_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    made = webhook_token(settings)
    assert made is not None and len(made) >= 40
    assert generate_webhook_token(settings) is None and webhook_token(settings) == made  # a restart keeps it
    other = Settings(home=tmp_path / "other", database_url="sqlite:///unused")
    (tmp_path / "other").mkdir()
    monkeypatch.setenv("CORRAL_MONITOR_WEBHOOK_TOKEN", "operators-own")
    assert generate_webhook_token(other) is None
    assert not (tmp_path / "other" / "alert_webhook_token").exists()
