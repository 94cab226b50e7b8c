"""Fault -> incident latency with the shipped default intervals, and an alert storm.

One real server (local engine, `--gpus` virtual GPUs, the SHIPPED intervals: GPU sampling every
10 s, diagnosis watch every 10 s) and the shipped rules with the blast-radius guard opened
(`max_fraction: 1.0`: the bench quarantines many GPUs on purpose; the guard is tested apart).

1. `--faults` uncorrectable ECC errors, injected as `corral chaos gpu ecc` does (the fault file),
   one per GPU at random moments. For each: fault -> alert (`first_received_at` of its
   CorralGpuEccErrors alert: the baseline, what Corral did before incidents) and fault ->
   incident (`opened_at` of its incident); p50/p99 of both and of their difference (what the
   incident pipeline adds). Target: fault -> incident <= 10 s.
   Fault -> first page email: an `incidents` escalation policy pages one person whose address
   is on a real SMTP server (aiosmtpd) in this process; each incident's page email (header
   X-Corral-Page: incident:<id>) is timed on arrival, with the shipped paging loop (1 s).
2. `--storm` distinct alerts in ONE Alertmanager webhook delivery: the time the delivery takes,
   the number of incidents (one per alert expected), and the same delivery repeated (a
   re-notification): no new incident (the policy is deleted first: nobody is paged). Baseline,
   same run: the same storm (other alert names) with an empty rule set, i.e. storing the alerts
   alone, as Corral did before incidents.

    python bench/incident_pipeline.py [--faults 50] [--gpus 50] [--storm 1000]

Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corral.monitor.gpu import update_fault
from corral.services.remediation_rules import DEFAULT_RULES
from tests.server_harness import start_server
from tests.support import free_port

TOKEN = "bench-webhook-token"


class PageInbox:
    """aiosmtpd handler: when each incident's first page email arrived (key -> time)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd hook
        from email import message_from_bytes

        key = message_from_bytes(envelope.content)["X-Corral-Page"]
        with self.lock:
            if key and key not in self.first:
                self.first[str(key)] = time.time()
        return "250 OK"


def page_one_person(c: httpx.Client) -> None:
    c.post("/api/v1/users", json={"name": "oncall"}).raise_for_status()
    c.put("/api/v1/users/oncall/email", json={"email": "oncall@example.org"}).raise_for_status()
    steps = [{"user": "oncall", "wait_minutes": 60}]
    c.put("/api/v1/oncall/policies/incidents", json={"steps": steps}).raise_for_status()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def all_items(c: httpx.Client, path: str, **params: Any) -> list[dict[str, Any]]:
    r = c.get(path, params={"limit": 1000, **params})
    r.raise_for_status()
    return list(r.json()["items"])


def faults(c: httpx.Client, home: Path, count: int, inbox: PageInbox) -> dict[str, float]:
    injected: dict[int, float] = {}
    order = list(range(count))
    random.shuffle(order)
    for gpu in order:  # one fault every ~0.7 s: they land at every phase of the 10 s sampling
        time.sleep(random.uniform(0.2, 1.2))
        update_fault(home, "local", gpu, ecc_uncorrected=1)
        injected[gpu] = time.time()
    deadline = time.time() + 60
    while time.time() < deadline:
        opened = {i["links"]["gpus"][0]: i for i in all_items(c, "/api/v1/incidents") if i["links"]["gpus"]}
        if len(opened) >= count and len(inbox.first) >= count:
            break
        time.sleep(0.5)
    alerts = {
        f"{a['labels']['node']}/{a['labels']['gpu']}": a["first_received_at"]
        for a in all_items(c, "/api/v1/alerts", name="CorralGpuEccErrors")
    }
    to_alert, to_incident, added, to_email = [], [], [], []
    for gpu, at in injected.items():
        key = f"local/{gpu}"
        if key not in opened or key not in alerts:
            continue
        to_alert.append(alerts[key] - at)
        to_incident.append(opened[key]["opened_at"] - at)
        added.append(opened[key]["opened_at"] - alerts[key])
        emailed = inbox.first.get(f"incident:{opened[key]['id']}")
        if emailed is not None:
            to_email.append(emailed - at)
    return {
        "faults": count,
        "incidents": len(to_incident),
        "fault_to_alert_p50_s": round(pct(to_alert, 0.5), 2),
        "fault_to_alert_p99_s": round(pct(to_alert, 0.99), 2),
        "fault_to_incident_p50_s": round(pct(to_incident, 0.5), 2),
        "fault_to_incident_p99_s": round(pct(to_incident, 0.99), 2),
        "fault_to_incident_max_s": round(max(to_incident, default=float("nan")), 2),
        "incident_added_p50_ms": round(statistics.median(added) * 1000, 1) if added else float("nan"),
        "incident_added_p99_ms": round(pct(added, 0.99) * 1000, 1),
        "page_emails": len(to_email),
        "fault_to_first_email_p50_s": round(pct(to_email, 0.5), 2),
        "fault_to_first_email_p99_s": round(pct(to_email, 0.99), 2),
    }


def total(c: httpx.Client) -> int:
    r = c.get("/api/v1/incidents", params={"limit": 1})
    r.raise_for_status()
    return int(r.json()["total"])


def deliver(c: httpx.Client, name: str, count: int) -> float:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    alerts = [
        {"status": "firing", "labels": {"alertname": name, "severity": "warning", "instance": f"h{i}"},
         "annotations": {"summary": f"{name} {i}"}, "startsAt": now}
        for i in range(count)
    ]  # fmt: skip
    body = {"version": "4", "status": "firing", "receiver": "corral", "alerts": alerts}
    started = time.perf_counter()
    r = c.post("/api/v1/alerts/webhook", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - started


def storm(c: httpx.Client, count: int, rules: str) -> dict[str, float]:
    c.delete("/api/v1/oncall/policies/incidents").raise_for_status()
    c.put("/api/v1/remediation/rules", json={"text": "version: 1\nrules: []\n"}).raise_for_status()
    baseline = deliver(c, "BaselineStorm", count)
    c.put("/api/v1/remediation/rules", json={"text": rules}).raise_for_status()
    before = total(c)
    took = deliver(c, "BenchStorm", count)
    after_first = total(c)
    repeat_took = deliver(c, "BenchStorm", count)
    return {
        "storm_alerts": count,
        "baseline_storm_delivery_s": round(baseline, 2),
        "storm_delivery_s": round(took, 2),
        "storm_alerts_per_s": round(count / took, 1),
        "storm_new_incidents": after_first - before,
        "storm_repeat_delivery_s": round(repeat_took, 2),
        "storm_new_incidents_on_repeat": total(c) - after_first,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=50)
    parser.add_argument("--storm", type=int, default=1000)
    args = parser.parse_args()
    if args.faults > args.gpus:
        parser.error("--faults must be at most --gpus (one fault per GPU)")
    from aiosmtpd.controller import Controller

    inbox = PageInbox()
    smtp_port = free_port()
    smtp = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    home = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    (home / "monitor.yml").write_text(
        "channels:\n"
        f"  - {{name: mail, type: email, smtp_host: 127.0.0.1, smtp_port: {smtp_port}, "
        "from: corral@example.org, to: [ops@example.org]}\n"
    )
    srv = start_server(home, virtual_gpus=args.gpus, extra_env={"CORRAL_MONITOR_WEBHOOK_TOKEN": TOKEN})
    try:
        with srv.client() as c:
            rules = DEFAULT_RULES.replace("max_fraction: 0.10", "max_fraction: 1.0")
            c.put("/api/v1/remediation/rules", json={"text": rules}).raise_for_status()
            page_one_person(c)
            time.sleep(12)  # one sampling pass: the GPUs' first readings (no fault is news before)
            figures = {**faults(c, srv.home, args.faults, inbox), **storm(c, args.storm, rules)}
    finally:
        srv.stop()
        smtp.stop()
    for key, value in figures.items():
        print(f"{key:>40}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
