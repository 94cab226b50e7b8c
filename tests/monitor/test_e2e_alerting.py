"""Everything real: a Corral server subprocess, Prometheus scraping it with the shipped rules,
Alertmanager with the shipped config (addresses and timings shortened), Corral's webhook and an
aiosmtpd SMTP server. A GPU ECC error injected through the virtual provider (by the `corral chaos`
CLI) fires, travels Prometheus -> Alertmanager -> Corral, is stored and mailed; clearing it
resolves it. Every Grafana panel's PromQL is run against this Prometheus while the alert fires."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from corral.services.remediation_rules import DEFAULT_RULES
from tests.monitor.test_channels import Inbox
from tests.server_fixture import start_server, wait_for
from tests.support import free_port, require_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TOKEN = "e2e-webhook-secret"
SCRAPE_TOKEN = "e2e-scrape-secret"
ALERT = "CorralGpuEccErrors"
INTERVALS = {  # the test's shortened intervals (shipped: 15 s scrape/eval, 30 s group_wait, 10 s sample)
    "sample": "0.5", "scrape": "1s", "group_wait": "1s", "group_interval": "1s",
}  # fmt: skip


@contextmanager
def daemon(argv: list[str], log: Path, ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """Start a daemon, wait for its readiness URL, stop it (by its pid) afterwards."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"{argv[0]} exited: {log.read_text()[-2000:]}"
            try:
                return httpx.get(ready_url, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s=30, interval_s=0.2, what=f"{Path(argv[0]).name} ready")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def alertmanager_config(path: Path, corral_url: str, token_file: Path, smtp_port: int) -> None:
    """The shipped config with this test's addresses and shortened timings."""
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    config["global"]["smtp_smarthost"] = f"127.0.0.1:{smtp_port}"
    config["route"]["group_wait"] = INTERVALS["group_wait"]
    config["route"]["group_interval"] = INTERVALS["group_interval"]
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{corral_url}/api/v1/alerts/webhook"
            hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    path.write_text(yaml.safe_dump(config))


def prometheus_config(path: Path, corral_port: int, am_port: int, scrape_token_file: Path) -> None:
    """The shipped config (scrape token included) with this test's addresses and timings."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": INTERVALS["scrape"], "evaluation_interval": INTERVALS["scrape"]}
    config["rule_files"] = [str(p) for p in sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{am_port}"]}]
    (scrape,) = config["scrape_configs"]
    scrape["static_configs"] = [{"targets": [f"127.0.0.1:{corral_port}"]}]
    scrape["authorization"]["credentials_file"] = str(scrape_token_file)
    path.write_text(yaml.safe_dump(config))


def chaos(home: Path, *args: str) -> None:
    """The real CLI, as a separate process, writing into the running server's fault file."""
    result = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "chaos", "gpu", *args, "--home", str(home)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def stored(api: httpx.Client, status: str) -> dict[str, Any] | None:
    items = api.get("/api/v1/alerts", params={"name": "CorralGpuEccErrors", "status": status}).json()["items"]
    return next((a for a in items if a["source"] == "alertmanager"), None)


def panel_queries() -> list[tuple[str, str, list[str]]]:
    out = []
    for path in sorted((DEPLOY / "grafana").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            out.append((path.name, panel["title"], [t["expr"] for t in panel["targets"]]))
    return out


def substitute(expr: str, job_id: str) -> str:
    expr = expr.replace("$__rate_interval", "10s").replace("$job_id", job_id)
    return re.sub(r"\$(node|user|group)\b", ".*", expr)


def check_dashboards(prom: str, job_id: str) -> list[str]:
    """Run every panel's PromQL; each must parse, and each panel must return data."""
    problems = []
    for board, title, exprs in panel_queries():
        returned = False
        for expr in exprs:
            body = httpx.get(
                f"{prom}/api/v1/query", params={"query": substitute(expr, job_id)}, timeout=10
            ).json()
            if body.get("status") != "success":
                problems.append(f"{board} / {title}: {expr!r} does not run: {body.get('error')}")
                continue
            returned = returned or bool(body["data"]["result"])
        if not returned:
            problems.append(f"{board} / {title}: no data")
    return problems


def test_ecc_error_alert_round_trip(tmp_path: Path) -> None:
    from aiosmtpd.controller import Controller

    prometheus = require_binary("prometheus")
    alertmanager = require_binary("prometheus-alertmanager")
    home = tmp_path / "corral-home"
    home.mkdir()
    smtp_port = free_port()
    (home / "monitor.yml").write_text(
        f"channels:\n  - {{name: ops-email, type: email, smtp_host: 127.0.0.1, smtp_port: {smtp_port},"
        " from: corral@example.org, to: [oncall@example.org]}\n"
    )
    token_file = tmp_path / "webhook_token"
    token_file.write_text(TOKEN)
    scrape_token_file = tmp_path / "metrics_token"  # /metrics refuses scrapes without it
    scrape_token_file.write_text(SCRAPE_TOKEN + "\n")
    inbox = Inbox()
    env = {
        "CORRAL_MONITOR_WEBHOOK_TOKEN": TOKEN, "CORRAL_MONITOR_SAMPLE_INTERVAL_S": INTERVALS["sample"],
        "CORRAL_MONITOR_HEALTH_INTERVAL_S": "1", "CORRAL_MONITOR_DELIVERY_INTERVAL_S": "0.5",
        "CORRAL_METRICS_TOKEN_FILE": str(scrape_token_file),
    }  # fmt: skip
    with ExitStack() as stack:
        smtp = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
        smtp.start()
        stack.callback(smtp.stop)
        srv = start_server(home, extra_env=env)
        stack.callback(srv.stop)
        api = stack.enter_context(
            httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token}"})
        )

        # The job must keep its GPU while Prometheus' alert goes round (job_id label, job panels):
        # the remediation rules (docs/operations.md) only record what they would do here.
        dry = DEFAULT_RULES.replace("dry_run: false", "dry_run: true", 1)
        assert api.put("/api/v1/remediation/rules", json={"text": dry}).is_success
        # A real job holding one virtual GPU, so per-job labels and panels have something to show.
        assert api.put("/api/v1/groups/default/quota", json={"gpu_model": "VGPU", "guaranteed": 2}).is_success
        job = api.post("/api/v1/jobs", json={
            "name": "holder", "command": "sleep 300", "resources": {"gpus": 1, "cpus": 1, "memory": "128MiB"},
        }).json()  # fmt: skip
        job_id = str(job["id"])
        wait_for(
            lambda: api.get(f"/api/v1/jobs/{job_id}").json()["state"] == "running", 60, 0.2, "job running"
        )
        gpus = [
            g for n in api.get("/api/v1/nodes").json() for g in n["gpus"] if str(g.get("job_id")) == job_id
        ]
        node, index = "local", str(gpus[0]["index"])
        chaos(home, "util", node, index, "42")

        am_port, prom_port = free_port(), free_port()
        alertmanager_config(tmp_path / "am.yml", srv.url, token_file, smtp_port)
        stack.enter_context(daemon([
            alertmanager, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
        ], tmp_path / "am.log", f"http://127.0.0.1:{am_port}/-/ready"))  # fmt: skip
        assert httpx.get(f"{srv.url}/metrics").status_code == 401  # nobody else scrapes
        prometheus_config(tmp_path / "prom.yml", srv.port, am_port, scrape_token_file)
        prom = f"http://127.0.0.1:{prom_port}"
        prom_argv = [
            prometheus,
            f"--config.file={tmp_path / 'prom.yml'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        prom_argv.append(f"--storage.tsdb.path={tmp_path / 'prom-data'}")
        stack.enter_context(daemon(prom_argv, tmp_path / "prom.log", f"{prom}/-/ready"))

        def scraped() -> bool:
            q = f'corral_gpu_utilization_percent{{job_id="{job_id}"}}'
            result = httpx.get(f"{prom}/api/v1/query", params={"query": q}).json()["data"]["result"]
            return bool(result) and float(result[0]["value"][1]) == 42.0

        try:
            wait_for(scraped, 30, 0.2, "Prometheus to scrape the job's GPU")
        except BaseException:
            targets = httpx.get(f"{prom}/api/v1/targets").json()["data"]["activeTargets"]
            print(
                "targets:",
                [(t["health"], t["lastError"]) for t in targets],
                "\nserver log:",
                srv.log_text()[-3000:],
            )
            raise
        time.sleep(3)  # a few scrapes, so rate() panels have two samples in their window

        injected = time.monotonic()
        chaos(home, "ecc", node, index, "--count", "2")
        alert = wait_for(lambda: stored(api, "firing"), 60, 0.1, "Corral to receive the firing alert")
        latency = time.monotonic() - injected
        print(
            f"\ninjection -> Corral received the firing alert: {latency:.1f} s (test intervals {INTERVALS})"
        )
        job_now = api.get(f"/api/v1/jobs/{job_id}").json()
        assert alert["labels"].get("job_id") == job_id, (
            job_now["state"],
            job_now.get("events"),
            alert["labels"],
        )
        assert alert["labels"]["node"] == node
        assert alert["labels"]["gpu"] == index and alert["severity"] == "critical"
        assert "runbook_url" in alert["annotations"]

        problems = check_dashboards(prom, job_id)
        assert problems == [], "\n".join(problems)

        def mails(sender: str, status: str) -> list[Any]:
            return [m for m in inbox.messages if sender in m["From"] and status in m["Subject"]
                    and "CorralGpuEccErrors" in m["Subject"]]  # fmt: skip

        wait_for(lambda: mails("corral@", "[FIRING]"), 30, 0.2, "Corral's email")
        wait_for(lambda: mails("alertmanager@", "[FIRING"), 30, 0.2, "Alertmanager's email")

        cleared = time.monotonic()
        chaos(home, "clear", node, index)
        resolved = wait_for(lambda: stored(api, "resolved"), 60, 0.1, "Corral to receive the resolution")
        print(f"clear -> Corral received the resolution: {time.monotonic() - cleared:.1f} s")
        assert resolved["fingerprint"] == alert["fingerprint"] and resolved["ends_at"] is not None
        wait_for(lambda: mails("corral@", "[RESOLVED]"), 30, 0.2, "Corral's resolved email")

        cli_env = {**os.environ, "CORRAL_URL": srv.url, "CORRAL_TOKEN": srv.token, "COLUMNS": "250"}

        def corral(*args: str) -> str:
            result = subprocess.run(
                [sys.executable, "-m", "corral.cli.main", *args],
                capture_output=True,
                text=True,
                timeout=60,
                env=cli_env,
            )
            assert result.returncode == 0, result.stderr
            return result.stdout

        sources = {
            a["source"] for a in json.loads(corral("alert", "ls", "-o", "json", "--name", ALERT))["items"]
        }
        assert sources == {"alertmanager", "corral"}  # Prometheus' alert and Corral's own health check
        table = corral("alert", "ls", "--status", "resolved")
        assert ALERT in table and "alertmanager" in table
        channels = json.loads(corral("alert", "channels", "-o", "json"))["items"]
        assert (
            channels[0]["name"] == "ops-email" and channels[0]["state"] == "ok" and channels[0]["sent"] >= 2
        )
