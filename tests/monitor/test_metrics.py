"""/metrics: rendered from the database, consistent with it, parseable by Prometheus' own parser."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from corral.db.models import Gpu as GpuRow
from corral.db.models import GpuClaim, Group, Job, User
from corral.db.session import downgrade, upgrade
from corral.monitor.collector import DbStateCollector
from corral.monitor.metrics import record_scheduler_cycle
from corral.monitor.middleware import install
from corral.services.lifecycle import GpuHealth, move_gpu
from corral.services.nodes import set_gpu_health as node_set_gpu_health
from tests.monitor.conftest import Mon

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(text: str) -> Samples:
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def one(samples: Samples, name: str, **labels: str) -> float:
    found = [v for lab, v in samples[name] if all(lab.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def test_metrics_match_the_database(mon: Mon) -> None:
    with mon.app_client() as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = scrape(response.text)

    # No series twice: Prometheus would reject the scrape.
    for name, samples in m.items():
        keys = Counter(tuple(sorted(lab.items())) for lab, _ in samples)
        assert max(keys.values()) == 1, name

    assert len(m["corral_gpu_info"]) == 8
    assert sum(v for _, v in m["corral_node_gpus"]) == 8
    assert sum(v for _, v in m["corral_node_gpus_allocated"]) == mon.seeded["claimed"] == 4
    assert sum(v for _, v in m["corral_node_gpus_free"]) == 4
    with mon.factory() as db:
        claims = db.execute(
            select(GpuClaim.node, GpuClaim.gpu_index, GpuClaim.job_id, User.name, Group.name)
            .join(Job, Job.id == GpuClaim.job_id)
            .join(User, User.id == Job.user_id)
            .join(Group, Group.id == Job.group_id)
        ).all()
        by_state = dict(db.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    for node, index, job_id, user, group in claims:
        # Per-GPU readings carry who holds the GPU, so per-job/per-user PromQL needs no join.
        assert one(m, "corral_gpu_allocated", node=node, gpu=str(index)) == 1
        util = one(
            m, "corral_gpu_utilization_percent", node=node, gpu=str(index), job_id=str(job_id), user=user
        )
        assert 0 <= util <= 100
        one(
            m,
            "corral_gpu_ecc_errors",
            node=node,
            gpu=str(index),
            group=group,
            counter="aggregate",
            type="corrected",
        )
    free = [lab for lab, v in m["corral_gpu_allocated"] if v == 0]
    assert len(free) == 4 and all(lab["job_id"] == "" for lab in free)

    for state, n in by_state.items():
        assert sum(v for lab, v in m["corral_jobs"] if lab["state"] == state) == n
    assert sum(v for _, v in m["corral_queue_length"]) == by_state["queued"] == 3
    assert max(v for _, v in m["corral_queue_oldest_wait_seconds"]) > 0
    # Quota: used per group equals the GPUs its jobs hold; guaranteed comes from group_quotas.
    used = defaultdict(int)
    for *_, group in claims:
        used[group] += 1
    for group, n in used.items():
        assert one(m, "corral_group_gpus_used", group=group, model="A100") == n
        assert one(m, "corral_group_gpus_guaranteed", group=group, model="A100") == 16
    # Node CPU/memory allocation comes from the live attempts' placements (8 CPUs each).
    assert sum(v for _, v in m["corral_node_cpus_allocated"]) == 16
    assert sum(v for _, v in m["corral_node_cpus_free"]) == 2 * 64 - 16
    assert one(m, "corral_node_state", node="node0000", state="ready") == 1
    assert one(m, "corral_node_state", node="node0000", state="down") == 0
    assert 0 <= one(m, "corral_node_heartbeat_age_seconds", node="node0000") < 60
    assert one(m, "corral_state_dir_free_bytes", path=str(mon.home)) > 0
    assert one(m, "corral_scheduler_last_cycle_timestamp_seconds") >= 0


def test_quarantined_and_lost_gpus_are_not_healthy_nor_free(mon: Mon) -> None:
    """docs/metrics.md: corral_gpu_healthy is 1 when the scheduler may place work on the GPU, and
    corral_node_gpus_free counts healthy free GPUs; a GPU Corral quarantined or declared lost is
    neither, though the engine still reports it healthy."""
    with mon.factory() as db:
        claimed = {(node, index) for node, index in db.execute(select(GpuClaim.node, GpuClaim.gpu_index))}
        free = db.execute(
            select(GpuRow).where(GpuRow.healthy.is_(True)).order_by(GpuRow.node_name, GpuRow.index)
        ).scalars()
        quarantined, lost = [g for g in free if (g.node_name, g.index) not in claimed][:2]
        node_set_gpu_health(db, quarantined.node_name, quarantined.index, "quarantine")
        assert move_gpu(db, lost, GpuHealth.LOST)
        db.commit()
        out = [(quarantined.node_name, str(quarantined.index)), (lost.node_name, str(lost.index))]
    with mon.app_client() as client:
        m = scrape(client.get("/metrics").text)
    for node, gpu in out:
        assert one(m, "corral_gpu_healthy", node=node, gpu=gpu) == 0, (node, gpu)
    assert sum(v for _, v in m["corral_gpu_healthy"]) == 8 - 2
    assert sum(v for _, v in m["corral_node_gpus_free"]) == 4 - 2


def test_collector_and_metrics_agree(mon: Mon) -> None:
    registry = CollectorRegistry()
    registry.register(DbStateCollector(mon.factory, mon.home))
    via_client = scrape(generate_latest(registry).decode())
    with mon.app_client() as client:
        via_http = scrape(client.get("/metrics").text)
    for name in ("corral_gpu_allocated", "corral_jobs", "corral_group_gpus_used", "corral_node_cpus"):
        assert _normal(via_client[name]) == _normal(via_http[name]), name


def _normal(samples: list[tuple[dict[str, str], float]]) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    return sorted((tuple(sorted(lab.items())), float(v)) for lab, v in samples)


def test_scheduler_metrics_reported_by_the_loops(mon: Mon) -> None:
    with mon.app_client() as client:
        before = scrape(client.get("/metrics").text)
        record_scheduler_cycle(0.03, placements=3)
        after = scrape(client.get("/metrics").text)
    placed = one(after, "corral_scheduler_placements_total") - one(
        before, "corral_scheduler_placements_total"
    )
    assert placed == 3
    assert (
        one(after, "corral_scheduler_cycle_seconds_count")
        == one(before, "corral_scheduler_cycle_seconds_count") + 1
    )
    assert abs(one(after, "corral_scheduler_last_cycle_timestamp_seconds") - time.time()) < 60


def test_api_middleware_counts_latency_and_errors() -> None:
    app = FastAPI()
    install(app)
    install(app)  # idempotent

    @app.get("/things/{thing_id}")
    def thing(thing_id: int) -> dict[str, int]:
        if thing_id == 13:
            raise RuntimeError("unlucky")
        return {"id": thing_id}

    def count(name: str, **labels: str) -> float:
        from corral.monitor.metrics import REGISTRY

        return REGISTRY.get_sample_value(name, labels) or 0.0

    ok_before = count("corral_api_requests_total", method="GET", route="/things/{thing_id}", status="200")
    err_before = count(
        "corral_api_request_errors_total", method="GET", route="/things/{thing_id}", status="500"
    )
    lat_before = count("corral_api_request_duration_seconds_count", method="GET", route="/things/{thing_id}")
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/things/1").status_code == 200
        assert client.get("/things/2").status_code == 200
        assert client.get("/things/13").status_code == 500
        assert client.get("/nowhere/at/all").status_code == 404
    # Route templates, not raw paths, so label values stay few.
    assert (
        count("corral_api_requests_total", method="GET", route="/things/{thing_id}", status="200")
        == ok_before + 2
    )
    assert (
        count("corral_api_request_errors_total", method="GET", route="/things/{thing_id}", status="500")
        == err_before + 1
    )
    assert (
        count("corral_api_request_duration_seconds_count", method="GET", route="/things/{thing_id}")
        == lat_before + 3
    )
    assert count("corral_api_requests_total", method="GET", route="(unmatched)", status="404") >= 1


def test_migration_0002_down_and_up(mon: Mon) -> None:
    import sqlalchemy as sa

    url = mon.settings.db_url
    mon.engine.dispose()
    downgrade(url, "0001_core")
    tables = set(sa.inspect(sa.create_engine(url)).get_table_names())
    assert "alerts" not in tables and "gpu_readings" not in tables and "jobs" in tables
    upgrade(url, "0002_monitor")
    tables = set(sa.inspect(sa.create_engine(url)).get_table_names())
    assert {"alerts", "alert_notifications", "gpu_readings", "idle_gpu_watch", "monitor_state"} <= tables
