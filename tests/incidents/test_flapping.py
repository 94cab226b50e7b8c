"""Flapping incidents (corral.services.incident_flapping, corral.services.incident_paging): an
incident that keeps resolving and firing again pages once when it begins flapping, not at every
reopen; every reopen is still on its timeline; the quiet period ends the flapping and a later
reopen pages again, to whoever acknowledged it first. On the real app and SQLite, with the
incident's clock given by the test (the paging bridge installed as the server installs it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from corral.cli.main import app as cli
from corral.db.models import User
from corral.db.oncall_models import Page, PageNotification
from corral.services import incident_paging, incidents, paging
from corral.services.incident_flapping import FlapPolicy
from tests.oncall.conftest import Env
from tests.support import served

BOTH_DATABASES = pytest.mark.parametrize("env", ["sqlite", "postgres"], indirect=True)  # tests/pg.py

ALERT = "alert-gpu-n1-0"
# Quiet shorter than the reopen window here, so that a reopen after the quiet period is still a
# reopen of this incident (with the shipped 30 min quiet it would be a new incident, paged anyway).
QUICK = FlapPolicy(reopen_window_s=900.0, reopens=3, within_s=3600.0, quiet_s=600.0)


@pytest.fixture
def bridged(env: Env) -> Iterator[Env]:
    env.put("/oncall/policies/incidents", {"steps": [{"user": "bob", "wait_minutes": 5}], "repeat": 1})
    incident_paging.install()
    try:
        yield env
    finally:
        incident_paging.uninstall()


def fire(env: Env, now: float, flap: FlapPolicy = QUICK) -> int:
    with env.factory() as db:
        incident = incidents.open_or_update(
            db, fingerprint="gpu/n1/0", title="GPU 0 on n1: ECC", severity="SEV2", source="rule:gpu-fault",
            labels={}, links={"gpus": ["n1/0"]}, now=now, alert=ALERT, why="ECC error", flap=flap,
        )  # fmt: skip
        db.commit()
        return incident.id


def clear(env: Env, now: float) -> None:
    with env.factory() as db:
        assert incidents.alert_resolved(db, ALERT, now), "the incident should have resolved"
        db.commit()


def quiet_pass(env: Env, now: float, flap: FlapPolicy = QUICK) -> list[int]:
    """The incidents loop's flapping pass (corral.monitor.loops.incident_tick)."""
    with env.factory() as db:
        ended = incidents.end_quiet_flapping(db, now, flap)
        db.commit()
        return ended


def shown(env: Env, incident_id: int) -> dict[str, Any]:
    r = env.client.get(f"/api/v1/incidents/{incident_id}", headers=env.admin)
    assert r.status_code == 200, r.text
    return dict(r.json())


def timeline(env: Env, incident_id: int, kind: str) -> list[str]:
    return [e["text"] for e in shown(env, incident_id)["timeline"] if e["kind"] == kind]


def pages(env: Env, incident_id: int) -> dict[str, str]:
    with env.factory() as db:
        rows = db.scalars(select(Page).where(Page.key.like(f"incident:{incident_id}%")).order_by(Page.id))
        return {p.key: p.state for p in rows}


@BOTH_DATABASES
def test_a_flapping_incident_pages_once_then_quiet_ends_it_and_a_reopen_pages_again(bridged: Env) -> None:
    env, t0 = bridged, time.time()
    incident_id = fire(env, t0)
    for n in (1, 2):  # two reopens: paged each time, as before
        clear(env, t0 + n * 600 - 300)
        assert fire(env, t0 + n * 600) == incident_id
        assert pages(env, incident_id)[f"incident:{incident_id}/reopen-{n}"] == "triggered"
        assert not shown(env, incident_id)["flapping"]
    clear(env, t0 + 1500)
    assert fire(env, t0 + 1800) == incident_id  # the 3rd reopen within the hour: flapping
    after_third = pages(env, incident_id)
    assert after_third[f"incident:{incident_id}/reopen-3"] == "triggered", after_third
    view = shown(env, incident_id)
    assert view["flapping"] is True and view["flapping_since"] == t0 + 1800
    assert timeline(env, incident_id, "flapping") == ["flapping: reopened 3 times in 20 min"]
    with env.factory() as db:
        page = paging.page_by_key(db, f"incident:{incident_id}/reopen-3")
        assert page.subject == "[SEV2] flapping: GPU 0 on n1: ECC"
        assert "flapping: reopened 3 times in 20 min; its further reopens page nobody" in page.body
    assert timeline(env, incident_id, "paging")[-1] == (
        "flapping: reopened 3 times in 20 min: paged once via policy incidents"
    )

    # While it flaps: resolving keeps the page, reopens page nobody but are all on the timeline.
    for n in (1, 2, 3):
        clear(env, t0 + 1800 + n * 120 - 60)
        assert fire(env, t0 + 1800 + n * 120) == incident_id
    assert pages(env, incident_id) == after_third
    assert len(timeline(env, incident_id, "reopened")) == 6
    assert (
        timeline(env, incident_id, "paging")[-3:]
        == ["not paged: the incident is flapping (until quiet for 10 min)"] * 3
    )
    assert timeline(env, incident_id, "flapping") == ["flapping: reopened 3 times in 20 min"]  # once

    # Resolved, then quiet for 10 min: the flapping ends (and its page goes, the fault being over).
    clear(env, t0 + 2400)
    assert quiet_pass(env, t0 + 2400 + 599) == []
    assert quiet_pass(env, t0 + 2400 + 600) == [incident_id]
    assert not shown(env, incident_id)["flapping"]
    assert timeline(env, incident_id, "flapping_ended") == [
        "stopped flapping: stayed resolved for 10 min; a reopen pages again"
    ]
    assert pages(env, incident_id)[f"incident:{incident_id}/reopen-3"] == "cancelled"
    assert "page cancelled: the incident stopped flapping, resolved" in timeline(env, incident_id, "paging")

    # A later reopen pages as before (its earlier reopens no longer count towards flapping).
    assert fire(env, t0 + 2400 + 700) == incident_id
    assert pages(env, incident_id)[f"incident:{incident_id}/reopen-4"] == "triggered"
    assert timeline(env, incident_id, "paging")[-1] == "reopened: paged again via policy incidents"
    assert not shown(env, incident_id)["flapping"]


@BOTH_DATABASES
def test_the_quiet_period_is_checked_at_the_reopen_too(bridged: Env) -> None:
    """A reopen that comes after the quiet period but before the loop noticed it ends the
    flapping first (its timeline line, then the reopen), and is paged."""
    env, t0 = bridged, time.time()
    incident_id = fire(env, t0)
    for n in (1, 2, 3):
        clear(env, t0 + n * 60 - 30)
        fire(env, t0 + n * 60)
    assert shown(env, incident_id)["flapping"]
    clear(env, t0 + 200)
    assert fire(env, t0 + 200 + 601) == incident_id
    kinds = [e["kind"] for e in shown(env, incident_id)["timeline"]]
    assert kinds.index("flapping_ended") < len(kinds) - 1 - kinds[::-1].index("reopened")
    assert not shown(env, incident_id)["flapping"]
    assert pages(env, incident_id)[f"incident:{incident_id}/reopen-4"] == "triggered"


@BOTH_DATABASES
def test_staying_open_ends_flapping_and_a_reopen_goes_to_who_acknowledged_it(bridged: Env) -> None:
    env, t0 = bridged, time.time()
    incident_id = fire(env, t0)
    for n in (1, 2, 3):
        clear(env, t0 + n * 60 - 30)
        fire(env, t0 + n * 60)
    with env.factory() as db:  # alice answers the flapping page (its link, or `corral incident ack`)
        incidents.acknowledge(db, incident_id, "alice", t0 + 200)
        db.commit()
    assert pages(env, incident_id)[f"incident:{incident_id}/reopen-3"] == "acknowledged"

    # Still firing 10 min after its last reopen: no longer flapping.
    assert quiet_pass(env, t0 + 180 + 599) == []
    assert quiet_pass(env, t0 + 180 + 600) == [incident_id]
    assert timeline(env, incident_id, "flapping_ended") == [
        "stopped flapping: stayed open (firing) for 10 min; a reopen pages again"
    ]

    # It resolves and fires again: paged to alice first, then the policy (bob) from its top.
    clear(env, t0 + 900)
    assert fire(env, t0 + 960) == incident_id
    key = f"incident:{incident_id}/reopen-4"
    assert pages(env, incident_id)[key] == "triggered"
    with env.factory() as db:
        alice, bob = (db.scalars(select(User).where(User.name == n)).one() for n in ("alice", "bob"))
        page = paging.page_by_key(db, key)
        assert [s["user_id"] for s in page.steps] == [alice.id, bob.id]
        assert page.steps[0]["wait_s"] == page.steps[1]["wait_s"] == 300.0
        assert "Reopened after alice acknowledged it: paged to alice first." in page.body
        assert paging.escalate_due(db, t0 + 960) == 1
        notified = db.scalars(select(PageNotification.user_id).where(PageNotification.page_id == page.id))
        assert set(notified) == {alice.id}  # bob only if alice does not answer within 5 min
        for minutes in (5.1, 10.2, 15.3):  # then bob; the policy's repeat round is bob's alone
            paging.escalate_due(db, t0 + 960 + minutes * 60)
        notified = db.scalars(
            select(PageNotification.user_id).where(PageNotification.page_id == page.id)
            .order_by(PageNotification.id)
        )  # fmt: skip
        assert list(notified) == [alice.id, bob.id, bob.id]
        assert paging.page_by_key(db, key).state == "exhausted"
    assert (
        timeline(env, incident_id, "paging")[-1]
        == "reopened: paged again via policy incidents, to alice first"
    )


def flapping_incident(env: Env, t0: float) -> int:
    """Fired at t0 and reopened at t0 + 60, 120, 180: flapping since t0 + 180, page reopen-3 open."""
    incident_id = fire(env, t0)
    for n in (1, 2, 3):
        clear(env, t0 + n * 60 - 30)
        fire(env, t0 + n * 60)
    assert shown(env, incident_id)["flapping"]
    return incident_id


@BOTH_DATABASES
def test_a_flap_that_settles_firing_unanswered_is_paged_again(bridged: Env) -> None:
    """alice answers the flapping page; the fault then resolves and fires again while it flaps
    (not paged: triggered, nobody holds it) and stays firing: when the flapping ends, the steady
    fault is paged, to alice first."""
    env, t0 = bridged, time.time()
    incident_id = flapping_incident(env, t0)
    with env.factory() as db:
        incidents.acknowledge(db, incident_id, "alice", t0 + 200)
        db.commit()
    clear(env, t0 + 230)
    assert fire(env, t0 + 260) == incident_id
    assert shown(env, incident_id)["state"] == "triggered"
    assert set(pages(env, incident_id).values()) == {"cancelled", "acknowledged"}  # none open

    assert quiet_pass(env, t0 + 260 + 600) == [incident_id]
    assert timeline(env, incident_id, "flapping_ended") == [
        "stopped flapping: stayed open (firing) for 10 min; a reopen pages again"
    ]
    key = f"incident:{incident_id}/reopen-4"
    assert pages(env, incident_id)[key] == "triggered"
    assert timeline(env, incident_id, "paging")[-1] == (
        "stopped flapping; still firing: paged again via policy incidents, to alice first"
    )
    with env.factory() as db:
        alice = db.scalars(select(User).where(User.name == "alice")).one()
        page = paging.page_by_key(db, key)
        assert page.subject == "[SEV2] GPU 0 on n1: ECC" and page.steps[0]["user_id"] == alice.id
        assert "It stopped flapping and is still firing" in page.body
        assert page.created_at == t0 + 860


@BOTH_DATABASES
def test_a_flap_that_settles_firing_with_its_page_still_open_starts_no_other(bridged: Env) -> None:
    env, t0 = bridged, time.time()
    incident_id = flapping_incident(env, t0)  # nobody answers its page
    before = pages(env, incident_id)
    assert quiet_pass(env, t0 + 180 + 600) == [incident_id]
    assert pages(env, incident_id) == before  # reopen-3 still escalates; no second page
    assert before[f"incident:{incident_id}/reopen-3"] == "triggered"


@BOTH_DATABASES
def test_closing_a_flapping_incident_ends_the_flapping_and_cancels_its_page(bridged: Env) -> None:
    env, t0 = bridged, time.time()
    incident_id = flapping_incident(env, t0)
    clear(env, t0 + 200)  # resolved: a flapping incident keeps its page
    assert pages(env, incident_id)[f"incident:{incident_id}/reopen-3"] == "triggered"
    with env.factory() as db:
        incidents.write_postmortem(
            db, incident_id, "admin", t0 + 250, summary="ECC", impact="none", root_cause="a bad DIMM",
            action_items=[],
        )  # fmt: skip
        incidents.close(db, incident_id, "admin", t0 + 260)
        db.commit()
    view = shown(env, incident_id)
    assert view["state"] == "closed" and view["flapping"] is False
    assert timeline(env, incident_id, "flapping_ended") == ["stopped flapping: closed by admin"]
    assert pages(env, incident_id)[f"incident:{incident_id}/reopen-3"] == "cancelled"
    assert timeline(env, incident_id, "paging")[-1] == "page cancelled: the incident was closed"
    with env.factory() as db:
        assert paging.escalate_due(db, t0 + 3600) == 0  # nobody paged about a closed incident
    assert quiet_pass(env, t0 + 3600) == []


@pytest.mark.parametrize("env", ["postgres"], indirect=True)  # SQLite has no lock per key
def test_the_quiet_pass_skips_a_key_another_transaction_holds(bridged: Env) -> None:
    """PostgreSQL: the pass does not wait for a grouping key's lock (held here by a repeat firing
    not yet committed); it leaves that incident to its next pass."""
    env, t0 = bridged, time.time()
    incident_id = flapping_incident(env, t0)
    with env.factory() as holder:
        incidents.open_or_update(
            holder, fingerprint="gpu/n1/0", title="GPU 0 on n1: ECC", severity="SEV2",
            source="rule:gpu-fault", labels={}, links={}, now=t0 + 700, alert=ALERT, flap=QUICK,
        )  # fmt: skip
        result: list[list[int]] = []
        passing = threading.Thread(target=lambda: result.append(quiet_pass(env, t0 + 180 + 600)), daemon=True)
        passing.start()
        passing.join(timeout=20)
        assert not passing.is_alive(), "the quiet pass waited for a lock another transaction holds"
        assert result == [[]]
        holder.rollback()
    assert quiet_pass(env, t0 + 180 + 600) == [incident_id]


@BOTH_DATABASES
def test_an_acknowledger_no_longer_active_is_not_paged_first(bridged: Env) -> None:
    env, t0 = bridged, time.time()
    incident_id = fire(env, t0)
    with env.factory() as db:
        incidents.acknowledge(db, incident_id, "alice", t0 + 10)
        db.scalars(select(User).where(User.name == "alice")).one().active = False
        db.commit()
    clear(env, t0 + 60)
    fire(env, t0 + 120)
    with env.factory() as db:
        bob = db.scalars(select(User).where(User.name == "bob")).one()
        page = paging.page_by_key(db, f"incident:{incident_id}/reopen-1")
        assert [s["user_id"] for s in page.steps] == [bob.id] and "first" not in page.body


@pytest.fixture
def server_url(bridged: Env) -> Iterator[str]:
    with served(bridged.client.app) as url:
        yield url


@BOTH_DATABASES
def test_the_api_and_the_cli_show_flapping(bridged: Env, server_url: str) -> None:
    env, t0 = bridged, time.time() - 3600  # an hour ago, so the CLI's "ago" reads sensibly
    steady, flapping = fire(env, t0), None
    with env.factory() as db:
        flapping = incidents.open_or_update(
            db, fingerprint="node/n2", title="node n2 lost", severity="SEV2", source="test",
            labels={}, links={}, now=t0, alert="lost-n2", flap=QUICK,
        ).id  # fmt: skip
        db.commit()
    for n in (1, 2, 3):
        with env.factory() as db:
            incidents.alert_resolved(db, "lost-n2", t0 + n * 60 - 30)
            incidents.open_or_update(
                db, fingerprint="node/n2", title="node n2 lost", severity="SEV2", source="test",
                labels={}, links={}, now=t0 + n * 60, alert="lost-n2", flap=QUICK,
            )  # fmt: skip
            db.commit()
    listed = env.client.get("/api/v1/incidents", headers=env.admin).json()["items"]
    assert {i["id"]: i["flapping"] for i in listed} == {steady: False, flapping: True}

    token = env.admin["Authorization"].split()[1]
    cli_env = {"CORRAL_URL": server_url, "CORRAL_TOKEN": token, "COLUMNS": "200"}
    result = CliRunner().invoke(cli, ["incident", "ls"], env=cli_env)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines()[1:] if line.strip()}
    assert "triggered, flapping" in rows[str(flapping)] and "flapping" not in rows[str(steady)], result.output
    result = CliRunner().invoke(cli, ["incident", "show", str(flapping)], env=cli_env)
    assert result.exit_code == 0, result.output
    assert "flapping (began 57m ago): its reopens page nobody until it is quiet" in result.output
    assert "flapping: reopened 3 times in 2 min" in result.output
    result = CliRunner().invoke(cli, ["incident", "show", str(steady)], env=cli_env)
    assert result.exit_code == 0 and "flapping" not in result.output, result.output

    def ids(**params: str) -> list[int]:
        r = env.client.get("/api/v1/incidents", params=params, headers=env.admin)
        assert r.status_code == 200, r.text
        assert r.json()["total"] == len(r.json()["items"])
        return [i["id"] for i in r.json()["items"]]

    assert ids(flapping="true") == [flapping] and ids(flapping="false") == [steady]
    assert ids() == [flapping, steady] and ids(flapping="true", severity="SEV1") == []
    refused = env.client.get("/api/v1/incidents", params={"flapping": "often"}, headers=env.admin)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "flapping"]
    for flag, shown in (("--flapping", flapping), ("--not-flapping", steady)):
        result = CliRunner().invoke(cli, ["incident", "ls", flag], env=cli_env)
        assert result.exit_code == 0, result.output
        listed_ids = [line.split()[0] for line in result.output.splitlines()[1:] if line.strip()]
        assert listed_ids == [str(shown)], (flag, result.output)
    result = CliRunner().invoke(cli, ["incident", "ls", "--flapping", "--severity", "SEV1"], env=cli_env)
    assert result.exit_code == 0 and "no open flapping incidents" in result.output, result.output
