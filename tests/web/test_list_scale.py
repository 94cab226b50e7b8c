"""List pages stay fast with 100,000 jobs in the database: the rows are seeded straight into the
server's SQLite (terminal jobs, so the control loops have nothing to do with them), then the
server is started on that database and the API calls behind the portal's list pages are timed,
as is the jobs page in the browser. Prints the figures; fails above 500 ms server time."""

from __future__ import annotations

import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.server_fixture import start_server
from tests.web.conftest import PASSWORD, launch_browser, setup_accounts

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

JOBS = 100_000
BUDGET_S = 0.5
REPEATS = 5
# The API calls the portal makes for the jobs list (filters, every sortable column, deep pages)
# and the dashboard; each must answer in under BUDGET_S.
PORTAL_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("/api/v1/jobs", {"limit": 25, "sort": "id", "order": "desc"}),  # the portal's default view
    ("/api/v1/jobs", {"limit": 100, "sort": "id", "order": "desc", "state": "failed"}),
    ("/api/v1/jobs", {"limit": 25, "sort": "id", "order": "desc", "user": "ann"}),
    ("/api/v1/jobs", {"limit": 25, "sort": "id", "order": "desc", "group": "team-b", "state": "cancelled"}),
    ("/api/v1/jobs", {"limit": 25, "sort": "id", "order": "asc", "offset": 50_000}),
    ("/api/v1/jobs", {"limit": 25, "sort": "id", "order": "desc", "user": "ben", "offset": 20_000}),
    ("/api/v1/jobs", {"limit": 25, "sort": "state", "order": "asc"}),
    ("/api/v1/jobs", {"limit": 25, "sort": "name", "order": "asc"}),
    ("/api/v1/jobs", {"limit": 20, "sort": "id", "order": "desc", "user": "root", "state": "running"}),
    ("/api/v1/cluster/summary", {}),
]
# Measured and printed for the API's owners, not asserted (the portal does not make these calls):
# unfiltered sorts by created_at (the API's default) or priority have no index to ride on.
INFO_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("/api/v1/jobs", {"limit": 25}),
    ("/api/v1/jobs", {"limit": 25, "sort": "priority", "order": "desc"}),
]


def seed_jobs(db_path: Path, count: int) -> None:
    """Bulk-insert `count` finished jobs spread over users, groups, states and 90 days."""
    engine = sa.create_engine(f"sqlite:///{db_path}")
    rng = random.Random(7)
    now = time.time()
    with engine.begin() as conn:
        users = dict(conn.execute(sa.text("SELECT name, id FROM users")).all())
        groups = dict(conn.execute(sa.text("SELECT name, id FROM groups")).all())
        owners = [
            (users["ann"], groups["team-a"]),
            (users["root"], groups["team-a"]),
            (users["ben"], groups["team-b"]),
        ]
        spec = json.dumps(
            {"name": "seeded", "tasks": {"main": {"command": "true", "resources": {"gpus": 1}}}}
        )
        rows = []
        for i in range(count):
            user_id, group_id = owners[i % 3]
            submitted = now - 90 * 86400 + i * (90 * 86400 / count)
            state = rng.choices(["succeeded", "failed", "cancelled"], [60, 25, 15])[0]
            rows.append(
                {
                    "name": f"seeded-{i:06d}-{rng.randrange(1_000_000):06d}",
                    "user_id": user_id,
                    "group_id": group_id,
                    "state": state,
                    "priority": 1,
                    "preemptible": True,
                    "spec": spec,
                    "max_retries": 0,
                    "attempt_count": 1,
                    "submitted_at": submitted,
                    "updated_at": submitted + 60,
                    "finished_at": submitted + 60,
                    "cancel_requested": False,
                    "reason": "",
                    "attained_gpu_seconds": 60.0,
                }
            )
        columns = ", ".join(rows[0])
        values = ", ".join(f":{c}" for c in rows[0])
        conn.execute(sa.text(f"INSERT INTO jobs ({columns}) VALUES ({values})"), rows)
        conn.execute(sa.text("ANALYZE"))
    engine.dispose()


def timed(client: Any, path: str, params: dict[str, Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    response = client.get(path, params=params)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed, response.json()


def test_list_pages_with_100k_jobs(playwright_instance: Any, tmp_path: Path) -> None:
    home = tmp_path / "corral-home"
    server = start_server(home)
    try:
        setup_accounts(server)
        server.stop()  # seed while nothing else writes to the database
        started = time.perf_counter()
        seed_jobs(home / "corral.db", JOBS)
        print(f"\nseeded {JOBS} jobs in {time.perf_counter() - started:.1f} s")
        server.start()

        figures: dict[str, float] = {}
        with server.client(timeout=30) as api:
            total = api.get("/api/v1/jobs", params={"limit": 1}).json()["total"]
            assert total == JOBS
            for path, params in PORTAL_QUERIES + INFO_QUERIES:
                timed(api, path, params)  # warm the page cache once
                samples = [timed(api, path, params)[0] for _ in range(REPEATS)]
                label = path.rsplit("/", 1)[1] + (
                    "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
                )
                # Best of N is the server's own cost; median and max also carry the load that other
                # work puts on the (shared, 2-core) machine at the same moment.
                if (path, params) in PORTAL_QUERIES:
                    figures[label] = min(samples)
                best, median = min(samples) * 1000, statistics.median(samples) * 1000
                print(
                    f"  {label:<82} best {best:6.1f}  median {median:6.1f}  max {max(samples) * 1000:6.1f} ms"
                )
            _, page = timed(
                api, "/api/v1/jobs", {"limit": 25, "sort": "id", "order": "asc", "offset": 50_000}
            )
            assert [j["id"] for j in page["items"]] == list(range(50_001, 50_026))

        browser_ms = measure_jobs_page(playwright_instance, server.url)
        print(
            f"  browser, /jobs page (best of 3 loads): its API call {browser_ms[0]:.1f} ms server time,"
            f" 25 rows shown after {browser_ms[1]:.1f} ms"
        )
        print(
            json.dumps(
                {
                    "jobs": JOBS,
                    "list_api_best_ms": {k: round(v * 1000, 1) for k, v in figures.items()},
                    "browser_api_ttfb_ms": round(browser_ms[0], 1),
                    "browser_rows_ms": round(browser_ms[1], 1),
                }
            )
        )
        slow = {k: v for k, v in figures.items() if v > BUDGET_S}
        assert not slow, f"list calls over {BUDGET_S * 1000:.0f} ms with {JOBS} jobs: {slow}"
        assert browser_ms[0] < BUDGET_S * 1000
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def measure_jobs_page(playwright: Any, url: str, loads: int = 3) -> tuple[float, float]:
    """Best of `loads` loads of the jobs page: (server time of its /api/v1/jobs call, from
    Resource Timing requestStart..responseStart, in ms; ms from navigation until 25 rows show)."""
    browser = launch_browser(playwright)
    try:
        page = browser.new_page()
        page.goto(url + "/login?next=%2Fjobs")
        page.fill("#username", "root")
        page.fill("#password", PASSWORD)
        page.click("form.login-form button[type=submit]")
        page.wait_for_url("**/jobs")
        server_ms, rows_ms = [], []
        for _ in range(loads):
            started = time.perf_counter()
            page.goto(url + "/jobs")
            expect(page.locator("table.jobs tbody tr")).to_have_count(25)
            rows_ms.append((time.perf_counter() - started) * 1000)
            expect(page.locator("#jobs-range")).to_have_text(f"1–25 of {JOBS}")
            server_ms.append(
                page.evaluate(
                    "performance.getEntriesByType('resource').filter(e => e.name.includes('/api/v1/jobs?'))"
                    ".map(e => e.responseStart - e.requestStart).pop()"
                )
            )
        return min(server_ms), min(rows_ms)
    finally:
        browser.close()
