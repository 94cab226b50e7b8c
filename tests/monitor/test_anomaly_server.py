"""The anomaly detector inside a real server's GPU sampling loop: a temperature ramp injected with
the real `corral chaos gpu temp --ramp` CLI raises `corral_node_failure_risk` on /metrics, and the
risky-nodes view (REST and `corral node risk`) names the GPU and why. The detector's time scales
are shortened in monitor.yml along with the sample interval (shipped: 10 s samples, 5 m recent)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.server_fixture import start_server, wait_for

ANOMALY = {  # seconds; the same proportions as the defaults, 50x faster, sampled every 0.2 s
    "window": 60, "recent": 3, "trend": 6, "settle": 1, "baseline_refresh": 0.5, "ecc_window": 30,
    "min_baseline": 5,
}  # fmt: skip


def risk_on_metrics(text: str) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    nodes: dict[str, float] = {}
    gpus: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "corral_node_failure_risk":
                nodes[s.labels["node"]] = s.value
            elif s.name == "corral_gpu_anomaly_score":
                gpus[(s.labels["node"], s.labels["gpu"])] = s.value
    return nodes, gpus


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral.cli.main", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_a_chaos_temperature_ramp_raises_the_node_risk_on_metrics(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "monitor.yml").write_text(yaml.safe_dump({"anomaly": ANOMALY}))
    with start_server(home, virtual_gpus=2, extra_env={"CORRAL_MONITOR_SAMPLE_INTERVAL_S": "0.2"}) as srv:
        api = srv.client()
        # Healthy: scored (both GPUs present on /metrics), no risk, for long enough to learn a baseline.
        wait_for(lambda: len(risk_on_metrics(api.get("/metrics").text)[1]) == 2, timeout_s=20, what="scores")
        time.sleep(ANOMALY["recent"] + 2)
        nodes, gpus = risk_on_metrics(api.get("/metrics").text)
        assert nodes == {"local": 0.0} and set(gpus.values()) == {0.0}, (nodes, gpus)

        ramp = cli({**os.environ}, "chaos", "gpu", "temp", "local", "1", "--ramp", "1/s", "--home", str(home))
        assert ramp.returncode == 0, ramp.stderr
        started = time.monotonic()
        wait_for(
            lambda: risk_on_metrics(api.get("/metrics").text)[0]["local"] > 0.6,
            timeout_s=30, what="node risk above 0.6",
        )  # fmt: skip
        nodes, gpus = risk_on_metrics(api.get("/metrics").text)
        assert gpus[("local", "1")] > 0.6 and gpus[("local", "0")] == 0.0, gpus
        # Flagged while the GPU is still far below the 85 C of the static rule (35 C + 1 C/s).
        assert time.monotonic() - started < 40

        view = api.get("/api/v1/nodes/risk", params={"min_risk": 0.5}).json()
        assert [n["node"] for n in view["nodes"]] == ["local"]
        assert view["nodes"][0]["gpus"][0]["index"] == 1
        assert any("temperature" in r for r in view["nodes"][0]["reasons"]), view
        assert api.get("/api/v1/nodes/risk", params={"min_risk": 2}).status_code == 422

        env = {**os.environ, "CORRAL_URL": srv.url, "CORRAL_TOKEN": srv.token, "COLUMNS": "200"}
        table = cli(env, "node", "risk")
        assert table.returncode == 0, table.stderr
        assert "local" in table.stdout and "temperature" in table.stdout, table.stdout
