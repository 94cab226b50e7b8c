"""The monitor config is one reloading source for the loops and the HTTP routes: a notification
channel added to monitor.yml while a real server runs receives Alertmanager's alerts at once,
without a restart (issue 17's first alert-path defect)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.monitor.config import MonitorConfigError, MonitorConfigSource
from tests.monitor.test_webhook import payload
from tests.server_fixture import start_server, wait_for
from tests.webhook_server import WebhookServer, serve_webhook

TOKEN = "reload-webhook-secret"


def channels_yaml(*hooks: tuple[str, str]) -> str:
    lines = ["channels:"]
    for name, url in hooks:
        lines += [f"  - name: {name}", "    type: webhook", f"    url: {url}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def hook() -> Iterator[WebhookServer]:
    yield from serve_webhook()


def test_channel_added_while_running_receives_webhook_alerts(tmp_path: Path, hook: WebhookServer) -> None:
    late = WebhookServer()
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


def test_source_keeps_the_last_good_config_and_reports_a_bad_edit_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "monitor.yml"
    path.write_text("channels:\n  - {name: a, type: webhook, url: 'http://x'}\n")
    source = MonitorConfigSource(path)
    assert [c.name for c in source.current().channels] == ["a"]
    path.write_text("channels:\n  - {name: a, type: webhook, url: nope}\n")
    with caplog.at_level(logging.ERROR, logger="corral.monitor.config"):
        assert [c.name for c in source.current().channels] == ["a"]
        assert [c.name for c in source.current().channels] == ["a"]
    (record,) = caplog.records  # once per bad version, not at every call
    assert "keeping the previous monitor config" in record.getMessage() and "url" in record.getMessage()
    path.write_text("channels:\n  - {name: b, type: webhook, url: 'http://y'}\n")
    assert [c.name for c in source.current().channels] == ["b"]
    path.unlink()
    assert source.current().channels == []  # no file: the defaults
    path.write_text("channels: 3\n")
    with pytest.raises(MonitorConfigError, match=r"monitor\.yml:1"):
        MonitorConfigSource(path).current()  # a first load refuses a bad file
