"""A job's notifications, labels and metrics in a real browser (real server, Chromium): the job
page's summary shows its spec's `notify`, and its timeline the `notify` event the notification loop
recorded (here: its owner has no contact of the kind asked for, so nothing was sent, and the page
says so); a long history's timeline, its newest events and how many earlier ones it leaves out. The
jobs list shows labels as chips and filters by them (the text box, a chip); the job
page shows its labels and draws the metrics the job wrote to $CORRAL_OUTPUTS/metrics.jsonl."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from corral.db.session import make_engine, make_session_factory
from corral.services.lifecycle import record_event
from tests.server_fixture import wait_for
from tests.web.conftest import Portal

RESOURCES = {"cpus": 0.25, "memory": "128MiB"}
# Three points of two metrics, the last with a name the others lack; a stray line skipped.
REPORTS = (
    '{"step": 10, "loss": 0.9, "acc": 0.5}\n{"step": 20, "loss": 0.6}\nnot json\n'
    '{"step": 30, "loss": 0.25, "acc": 0.75}\n'
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SPEC = {
    "name": "told-one",
    "group": "team-a",
    "tasks": {"main": {"command": "exit 3", "resources": {"cpus": 0.25, "memory": "128MiB"}}},
    "notify": {"on": ["fail"], "to": ["slack"]},
}


def test_the_job_page_shows_notify_and_what_it_sent(portal: Portal) -> None:
    with portal.api() as api:
        r = api.post("/api/v1/jobs", json=SPEC)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_for(
            lambda: any(e["kind"] == "notify" for e in api.get(f"/api/v1/jobs/{job_id}").json()["events"]),
            60,
            0.2,
            "the job's notify event",
        )
    page = portal.login("root", path=f"/jobs/{job_id}")
    expect(page.locator("dl.summary")).to_contain_text("failed to slack")
    expect(page.locator("ol.timeline")).to_contain_text(
        "no notification of 'failed' sent: admin has no contact of kind slack"
    )
    assert page.js_errors == []


def test_the_timeline_of_a_long_history_shows_its_newest_events_and_says_what_it_leaves_out(
    portal: Portal,
) -> None:
    """review112 #3: the timeline read the job's oldest 500 events, so after many label edits
    its latest ones were not there, without a word. The edits' events are written in the
    server's own database as an edit writes them, which is quicker than 510 edits."""
    with portal.api() as api:
        spec = {
            "name": "relabelled",
            "group": "team-a",
            "tasks": {"main": {"command": "true", "resources": RESOURCES}},
        }
        r = api.post("/api/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    engine = make_engine(f"sqlite:///{portal.server.home / 'corral.db'}")
    try:
        with make_session_factory(engine)() as db:
            for step in range(1, 511):
                record_event(db, job_id, time.time(), f"labels changed by root: trial={step}", kind="labels")
            db.commit()
    finally:
        engine.dispose()
    page = portal.login("root", path=f"/jobs/{job_id}")
    expect(page.locator("ol.timeline")).to_contain_text("labels changed by root: trial=510")
    expect(page.locator("p.earlier-events")).to_have_text(
        re.compile(rf"^\d+ earlier events? not shown: corral events {job_id} --before \d+$")
    )
    assert page.js_errors == []


def reporting(trial: int, lines: str) -> dict[str, object]:
    """A job of experiment pl1 that appends `lines` to its metrics.jsonl."""
    command = f"printf '{lines}' >> $CORRAL_OUTPUTS/metrics.jsonl"
    return {
        "name": f"reporter-{trial}",
        "group": "team-a",
        "labels": {"experiment": "pl1", "trial": trial},
        "tasks": {"main": {"command": command, "resources": RESOURCES}},
    }


def test_labels_are_shown_and_filtered_and_metrics_drawn(portal: Portal) -> None:
    silent = {
        "name": "silent",
        "group": "team-a",
        "labels": {"experiment": "pl2"},
        "tasks": {"main": {"command": "true", "resources": RESOURCES}},
    }
    with portal.api() as api:
        ids = []
        for spec in (reporting(1, REPORTS), silent, reporting(2, '{"step": 5, "loss": 0.5}\\n')):
            r = api.post("/api/v1/jobs", json=spec)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        wait_for(
            lambda: all(api.get(f"/api/v1/jobs/{i}").json()["state"] == "succeeded" for i in ids),
            60,
            0.2,
            "both jobs to succeed",
        )
    reporter_id, silent_id, second_id = ids
    page = portal.login("root", path="/jobs")
    row = page.locator(f"#jobs-results tr[data-job-id='{reporter_id}'] td.job-labels .chip")
    expect(row).to_have_text(["experiment=pl1", "trial=1"])
    page.fill("#filter-label", "experiment=pl1 trial=1")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/jobs?label=experiment%3Dpl1&label=trial%3D1")
    expect(page.locator("#jobs-results tbody tr")).to_have_count(1)
    expect(page.locator(f"#jobs-results tr[data-job-id='{reporter_id}']")).to_be_visible()
    page.goto(f"{portal.url}/jobs")
    page.locator(f"#jobs-results tr[data-job-id='{silent_id}'] a.chip", has_text="experiment=pl2").click()
    page.wait_for_url("**/jobs?label=experiment%3Dpl2")
    expect(page.locator("#filter-label")).to_have_value("experiment=pl2")
    expect(page.locator("#jobs-results tbody tr")).to_have_count(1)
    expect(page.locator(f"#jobs-results tr[data-job-id='{silent_id}']")).to_be_visible()

    page.goto(f"{portal.url}/jobs/{reporter_id}")
    expect(page.locator("#job-labels .chip")).to_have_text(["experiment=pl1", "trial=1"])
    charts = page.locator("#job-metrics figure.metric-chart")
    expect(charts).to_have_count(2)
    loss = page.locator("#job-metrics figure[data-metric='loss']")
    expect(loss.locator("h3")).to_have_text("loss 0.25")
    # three points: a path of three segments' ends (M, L, L) over steps 10 to 30
    assert loss.locator("svg path.series").get_attribute("d").count("L") == 2
    expect(loss.locator("svg text.axis").last).to_have_text("step 30")
    acc = page.locator("#job-metrics figure[data-metric='acc']")
    assert acc.locator("svg path.series").get_attribute("d").count("L") == 1
    expect(page.locator("#metrics-notes")).to_have_text("1 line skipped (not an object of names to numbers).")
    page.goto(f"{portal.url}/jobs/{silent_id}")
    expect(page.locator("#job-metrics")).to_contain_text("No metrics reported.")
    expect(page.locator("#job-metrics svg")).to_have_count(0)

    # The experiment view: each trial's final loss, sorted (ascending first), then another metric.
    page.goto(f"{portal.url}/jobs?label=experiment=pl1")
    trials = page.locator("#experiment tbody tr")
    expect(trials).to_have_count(2)
    expect(page.locator("#experiment-metric")).to_have_value("acc")  # the first name
    expect(trials.locator("td.metric-value")).to_have_text(["0.75", "—"])
    page.select_option("#experiment-metric", "loss")
    page.wait_for_url("**/jobs?label=experiment%3Dpl1&metric=loss")
    expect(page.locator("#experiment tbody tr td.metric-value")).to_have_text(["0.25", "0.5"])
    expect(page.locator("#experiment tbody tr").first).to_have_attribute("data-job-id", str(reporter_id))
    expect(page.locator("#experiment tbody tr").first.locator(".chip")).to_have_text("trial=1")
    page.click("#experiment-sort")
    page.wait_for_url("**/jobs?label=experiment%3Dpl1&metric=loss&morder=desc")
    expect(page.locator("#experiment tbody tr td.metric-value")).to_have_text(["0.5", "0.25"])
    expect(page.locator("#experiment tbody tr").first).to_have_attribute("data-job-id", str(second_id))
    assert page.js_errors == []
