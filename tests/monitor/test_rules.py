"""Shipped Prometheus rules (promtool check + unit tests), Alertmanager config and dashboards."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient

from corral.monitor.runbooks import router as runbooks_router
from corral.monitor.runbooks import runbook_url, runbooks
from tests.support import require_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
DASHBOARDS = sorted((DEPLOY / "grafana").glob("*.json"))
REQUIRED_ALERTS = {
    "CorralNodeDown",
    "CorralGpuEccErrors",
    "CorralGpuTemperatureHigh",
    "CorralGpuLost",
    "CorralJobPendingTooLong",
    "CorralGpuAllocatedIdle",
    "CorralQuotaNearlyExhausted",
    "CorralSchedulerStalled",
    "CorralApiErrorRate",
    "CorralApiLatencyHigh",
    "CorralStateDiskNearlyFull",
}

pytestmark = pytest.mark.prometheus


def all_rules() -> list[dict[str, object]]:
    return [
        rule
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def test_promtool_check_rules() -> None:
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "rules", *map(str, RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "test", "rules", *map(str, TESTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TESTS)


def test_every_rule_has_for_runbook_and_tests_firing_and_not_firing() -> None:
    rules = all_rules()
    names = {str(r["alert"]) for r in rules}
    assert names >= REQUIRED_ALERTS
    tested_firing: set[str] = set()
    tested_quiet: set[str] = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (tested_firing if check.get("exp_alerts") else tested_quiet).add(check["alertname"])
    for rule in rules:
        assert "for" in rule, rule["alert"]
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook_url"] == "{{ $externalLabels.corral_url }}/runbooks/" + str(rule["alert"])
        assert rule["alert"] in tested_firing, f"{rule['alert']} never tested firing"
        assert rule["alert"] in tested_quiet, f"{rule['alert']} never tested not firing"


def test_alertmanager_config_is_valid_and_routes_to_corral_and_email() -> None:
    amtool = require_binary("amtool")
    path = DEPLOY / "alertmanager" / "alertmanager.yml"
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(path.read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    hooks = [w["url"] for r in receivers.values() for w in r.get("webhook_configs", [])]
    assert hooks and all(url.endswith("/api/v1/alerts/webhook") for url in hooks)
    assert all(
        w["http_config"]["authorization"]["credentials_file"]
        for r in receivers.values()
        for w in r.get("webhook_configs", [])
    )
    assert any(r.get("email_configs") for r in receivers.values())
    assert {"alertname", "node"} <= set(config["route"]["group_by"])


def test_dashboards_are_grafana_json_with_prometheus_targets() -> None:
    assert {p.name for p in DASHBOARDS} >= {
        "corral-cluster-overview.json",
        "corral-node-gpus.json",
        "corral-users-groups.json",
        "corral-job.json",
    }
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] and board["title"].startswith("Corral /")
        assert board["panels"], path.name
        for panel in board["panels"]:
            assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def test_workspace_gpu_hours_reclaimed_panel_evaluates_in_promtool(tmp_path: Path) -> None:
    """The dashboard line for idle reclamation: its query parses and sums the counter per group
    (promtool evaluates it over made-up series, with Grafana's $group variable set to all)."""
    promtool = require_binary("promtool")
    board = json.loads((DEPLOY / "grafana" / "corral-users-groups.json").read_text())
    panels = [
        p
        for p in board["panels"]
        if any("corral_workspace_gpu_hours_reclaimed_total" in t["expr"] for t in p["targets"])
    ]
    assert len(panels) == 1 and panels[0]["type"] == "timeseries", [p["title"] for p in panels]
    expr = panels[0]["targets"][0]["expr"].replace("$group", ".*")
    series = "corral_workspace_gpu_hours_reclaimed_total"
    unit_test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'{series}{{group="vision"}}', "values": "0 0.5 1.5"},
                    {"series": f'{series}{{group="nlp"}}', "values": "2 2 2"},
                ],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "2m",
                        "exp_samples": [
                            {"labels": '{group="vision"}', "value": 1.5},
                            {"labels": '{group="nlp"}', "value": 2},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "panel_test.yml"
    path.write_text(yaml.safe_dump(unit_test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def corral_own_alert_names() -> set[str]:
    """Alert names Corral's own health checks raise (source "corral")."""
    names: set[str] = set()
    for path in (Path(__file__).resolve().parents[2] / "src" / "corral" / "monitor").glob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r'"alertname": "(Corral\w+)"', text))
        names |= set(re.findall(r'_labels\("(Corral\w+)"', text))
    return names


def test_every_alert_has_a_runbook_that_corral_serves() -> None:
    """The runbook links were placeholders (https://corral.example.org/...) that led nowhere."""
    own = corral_own_alert_names()
    assert {"CorralNodeLost", "CorralJobOOM", "CorralGpuXid", "CorralJobGpuIdle"} <= own
    wanted = {str(r["alert"]) for r in all_rules()} | own
    books = runbooks()
    assert wanted <= set(books), f"alerts without a runbook: {sorted(wanted - set(books))}"
    for name in wanted:
        text = books[name]  # what it means, what to check, what to do
        assert "**Means:**" in text and (
            ("**Check:**" in text and "**Do:**" in text) or "**Check and do:**" in text
        )
    app = FastAPI()
    app.include_router(runbooks_router)
    with TestClient(app) as client:
        r = client.get("/runbooks/CorralNodeDown")
        assert (
            r.status_code == 200 and r.text.startswith("## CorralNodeDown") and "corral node cordon" in r.text
        )
        assert "## CorralGpuLost" not in r.text
        assert client.get("/runbooks").text.count("\n## ") == len(books)
        missing = client.get("/runbooks/CorralNope")
        assert missing.status_code == 404 and "CorralNodeDown" in missing.text


def test_corral_own_alerts_link_to_the_public_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "https://corral.lab.test/")
    assert runbook_url("CorralNodeLost") == "https://corral.lab.test/runbooks/CorralNodeLost"
    monkeypatch.delenv("CORRAL_PUBLIC_URL")
    assert runbook_url("CorralNodeLost") == "/runbooks/CorralNodeLost"


def test_the_deploy_guide_puts_rules_and_secrets_where_the_shipped_configs_read_them() -> None:
    """docs/deploy.md copied the rules to /etc/prometheus/rules/ while prometheus.yml loads
    /etc/prometheus/corral/rules/*.yml (no rules, and no error), and left the scrape token and the
    webhook secret under the 0700 CORRAL_HOME, which Prometheus and Alertmanager cannot read."""
    guide = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (rules_glob,) = prometheus["rule_files"]
    assert f"install -m 644 deploy/prometheus/rules/*.yml {rules_glob.rsplit('/', 1)[0]}/" in guide
    (scrape,) = prometheus["scrape_configs"]
    token = scrape["authorization"]["credentials_file"]
    alertmanager = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    secrets = {
        w["http_config"]["authorization"]["credentials_file"]
        for r in alertmanager["receivers"]
        for w in r.get("webhook_configs", [])
    }
    assert len(secrets) == 1
    for variable, path in [
        ("CORRAL_METRICS_TOKEN_FILE", token),
        ("CORRAL_MONITOR_WEBHOOK_TOKEN_FILE", *secrets),
    ]:
        assert not path.startswith("/var/lib/corral/"), path  # CORRAL_HOME: 0700
        assert f"{variable}={path}" in guide, variable
