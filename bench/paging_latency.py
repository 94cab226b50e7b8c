"""Page start -> first email received: a real Corral server (its `paging` loop, leased, woken
when a page starts) sending through a real SMTP server (aiosmtpd) in this process.

Set-up: users `primary` and `secondary` with email addresses; schedule `primary` (the primary on
call); policy `bench`: the primary, wait 10 minutes, then the secondary (so within the run only
the first step runs: exactly one email per page is the right answer).

- baseline: the floor, smtplib connect + send of one message to the same SMTP server (50 times);
- sequential: 50 pages, one at a time (POST /api/v1/oncall/pages just before the clock starts),
  each timed to the arrival of its email (matched by its X-Corral-Page header);
- burst: 1,000 pages started at once (16 concurrent clients); time to the last email, and the
  check that every page got exactly one email and no page a second one (no storm).

    python bench/paging_latency.py [--pages 50] [--burst 1000]

Last line: one JSON object (p50/p99 in ms, burst seconds, emails per page).
"""

from __future__ import annotations

import argparse
import json
import smtplib
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from email import message_from_bytes
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_harness import start_server
from tests.support import free_port

SETTLE_S = 3.0  # after the last expected email: time for any duplicate to show up


class Inbox:
    def __init__(self) -> None:
        self.arrivals: dict[str, list[float]] = {}
        self.cond = threading.Condition()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd hook
        message = message_from_bytes(envelope.content)
        key = str(message.get("X-Corral-Page") or message.get("Subject"))
        with self.cond:
            self.arrivals.setdefault(key, []).append(time.time())
            self.cond.notify_all()
        return "250 OK"

    def wait(self, keys: set[str], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: keys <= self.arrivals.keys(), timeout)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def baseline(port: int, count: int, inbox: Inbox) -> list[float]:
    out = []
    for i in range(count):
        msg = EmailMessage()
        msg["Subject"], msg["From"], msg["To"] = f"baseline-{i}", "bench@example.org", "x@example.org"
        msg.set_content("floor")
        start = time.time()
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
            smtp.send_message(msg)
        inbox.wait({f"baseline-{i}"}, 10)
        out.append((inbox.arrivals[f"baseline-{i}"][0] - start) * 1000)
    return out


def set_up(client: Any) -> None:
    for name in ("primary", "secondary"):
        r = client.post("/api/v1/users", json={"name": name})
        assert r.status_code == 201, r.text
        r = client.put(f"/api/v1/users/{name}/email", json={"email": f"{name}@example.org"})
        assert r.status_code == 200, r.text
    layer = {"rotation": "weekly", "start_date": "2026-01-05", "members": ["primary"]}
    r = client.put("/api/v1/oncall/schedules/primary", json={"time_zone": "Europe/Berlin", "layers": [layer]})
    assert r.status_code == 201, r.text
    steps = [{"schedule": "primary", "wait_minutes": 10}, {"user": "secondary", "wait_minutes": 10}]
    r = client.put("/api/v1/oncall/policies/bench", json={"steps": steps})
    assert r.status_code == 201, r.text


def page(client: Any, key: str) -> float:
    """Start the page `key`; a request cut by the server closing an idle keep-alive connection
    is sent again (the key makes it idempotent: 200 when the first one got through)."""
    start = time.time()
    for attempt in range(3):
        try:
            r = client.post("/api/v1/oncall/pages", json={"policy": "bench", "subject": key, "key": key})
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
            if attempt == 2:
                raise
            continue
        assert r.status_code in (200, 201), r.text
        break
    return start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--burst", type=int, default=1000)
    args = parser.parse_args()

    from aiosmtpd.controller import Controller

    inbox = Inbox()
    smtp_port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    home = Path(tempfile.mkdtemp(prefix="corral-bench-paging-"))
    (home / "monitor.yml").write_text(
        "channels:\n"
        f"  - {{name: mail, type: email, smtp_host: 127.0.0.1, smtp_port: {smtp_port}, "
        "from: corral@example.org, to: [ops@example.org]}\n"
    )
    server = start_server(home, virtual_gpus=1, allow_unisolated=True)
    try:
        floor = baseline(smtp_port, args.pages, inbox)
        with server.client(timeout=30) as client:
            set_up(client)
            sequential = []
            for i in range(args.pages):
                key = f"seq-{i}"
                started = page(client, key)
                assert inbox.wait({key}, 30), f"no email for {key} within 30 s"
                sequential.append((inbox.arrivals[key][0] - started) * 1000)

        keys = [f"burst-{i}" for i in range(args.burst)]
        clients = [server.client(timeout=60) for _ in range(16)]
        burst_start = time.time()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda ik: page(clients[ik[0] % 16], ik[1]), enumerate(keys)))
        posted = time.time() - burst_start
        assert inbox.wait(set(keys), 300), "not every burst page was emailed within 300 s"
        last = max(inbox.arrivals[k][0] for k in keys) - burst_start
        time.sleep(SETTLE_S)
        for c in clients:
            c.close()
        per_page = Counter(len(inbox.arrivals.get(k, [])) for k in keys)
    finally:
        server.stop()
        controller.stop()

    result = {
        "baseline_smtp_send_p50_ms": round(statistics.median(floor), 1),
        "baseline_smtp_send_p99_ms": round(pct(floor, 0.99), 1),
        "page_to_email_p50_ms": round(statistics.median(sequential), 1),
        "page_to_email_p99_ms": round(pct(sequential, 0.99), 1),
        "burst_pages": args.burst,
        "burst_posted_s": round(posted, 2),
        "burst_last_email_s": round(last, 2),
        "burst_emails_per_page": {str(k): v for k, v in sorted(per_page.items())},
    }
    print(
        f"smtp floor p50 {result['baseline_smtp_send_p50_ms']} ms "
        f"p99 {result['baseline_smtp_send_p99_ms']} ms; "
        f"page->email p50 {result['page_to_email_p50_ms']} ms p99 {result['page_to_email_p99_ms']} ms "
        f"({args.pages} pages); {args.burst} pages at once: posted in {result['burst_posted_s']} s, "
        f"last email at {result['burst_last_email_s']} s, emails per page {result['burst_emails_per_page']}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
