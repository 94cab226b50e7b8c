"""The monitor config is one reloading source for the loops and the HTTP routes: a notification
channel added to monitor.yml while a real server runs receives Alertmanager's alerts at once,
without a restart (issue 17's first alert-path defect)."""

from __future__ import annotations

from pathlib import Path

from tests.monitor.test_channels import Hook, hook  # noqa: F401  (fixture)
from tests.monitor.test_webhook import payload
from tests.server_fixture import start_server, wait_for

TOKEN = "reload-webhook-secret"


def channels_yaml(*hooks: tuple[str, str]) -> str:
    lines = ["channels:"]
    for name, url in hooks:
        lines += [f"  - name: {name}", "    type: webhook", f"    url: {url}"]
    return "\n".join(lines) + "\n"


def test_channel_added_while_running_receives_webhook_alerts(tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    late = Hook()
    hook.status = late.status = 200
    home = tmp_path / "home"
    home.mkdir()
    (home / "monitor.yml").write_text(channels_yaml(("first", hook.url)))
    env = {"CORRAL_MONITOR_WEBHOOK_TOKEN": TOKEN, "CORRAL_MONITOR_DELIVERY_INTERVAL_S": "0.2"}
    try:
        with start_server(home, virtual_gpus=1, extra_env=env) as srv, srv.client() as c:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            r = c.post("/api/v1/alerts/webhook", json=payload(gpu="0"), headers=auth)
            assert r.status_code == 200 and r.json()["changed"] == 1, r.text
            wait_for(lambda: hook.bodies, timeout_s=15, what="the first channel's notification")

            (home / "monitor.yml").write_text(channels_yaml(("first", hook.url), ("late", late.url)))
            r = c.post("/api/v1/alerts/webhook", json=payload(gpu="1"), headers=auth)
            assert r.status_code == 200 and r.json()["changed"] == 1, r.text
            wait_for(lambda: late.bodies, timeout_s=15, what="the added channel's notification")
            (body,) = late.bodies
            assert body["status"] == "firing" and body["alert"]["labels"]["gpu"] == "1"
            wait_for(lambda: len(hook.bodies) == 2, timeout_s=15, what="the first channel's second one")
            names = [ch["name"] for ch in c.get("/api/v1/alerts/channels").json()["items"]]
            assert names == ["first", "late"]
    finally:
        late.close()
