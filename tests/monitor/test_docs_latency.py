"""docs/metrics.md's alert-latency figures are sums of the shipped intervals: each interval the
text names is the one Corral (MonitorSettings), Prometheus (deploy/prometheus/prometheus.yml) and
Alertmanager (deploy/alertmanager/alertmanager.yml) ship, so the text follows a changed default."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from corral.monitor.config import MonitorSettings, parse_duration

ROOT = Path(__file__).resolve().parents[2]


def latency_section() -> str:
    text = (ROOT / "docs" / "metrics.md").read_text()
    return text.split("## Alert latency", 1)[1].split("\n## ", 1)[0]


def seconds_named(text: str, what: str) -> float:
    match = re.search(re.escape(what) + r" \((\d+) s\)", text)
    assert match, f"docs/metrics.md's 'Alert latency' names no '{what} (N s)'"
    return float(match.group(1))


def test_the_latency_path_names_the_shipped_intervals() -> None:
    text = " ".join(latency_section().split())
    deploy = ROOT / "deploy"
    prometheus = yaml.safe_load((deploy / "prometheus" / "prometheus.yml").read_text())["global"]
    alertmanager = yaml.safe_load((deploy / "alertmanager" / "alertmanager.yml").read_text())["route"]
    sample = MonitorSettings.model_fields["sample_interval_s"].default
    assert seconds_named(text, "GPU sample") == sample
    assert seconds_named(text, "scrape") == parse_duration(prometheus["scrape_interval"])
    assert seconds_named(text, "rule evaluation") == parse_duration(prometheus["evaluation_interval"])
    assert seconds_named(text, "`group_wait`") == parse_duration(alertmanager["group_wait"])
    intervals = (prometheus["scrape_interval"], prometheus["evaluation_interval"], alertmanager["group_wait"])
    worst = sample + sum(parse_duration(i) for i in intervals)
    assert f"{worst:.0f} s at worst" in text
    assert f"within one sample interval (≤ {sample:.0f} s)" in text
