"""The services tell an injected notifier what they committed; the server's notifier wakes loops.

No URL is looked at: the API's app is given the server's `ServerContext` as its notifier, and a
submit, a cancel, a cordon and a quota change each wake exactly the loops that act on them."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.config import Settings
from corral.db.session import make_session_factory
from corral.server.context import WAKE_ON_CHANGE, ServerContext
from corral.server.runner import collect_loops
from corral.services import notify
from corral.services.notify import Topic
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.helpers import add_node
from tests.server.fakes import FakeEngine

API = "/api/v1"
LOOPS = ("nodes", "schedule", "dispatch", "reconcile")
ServerApp = tuple[TestClient, dict[str, threading.Event]]


class Recorder:
    def __init__(self) -> None:
        self.topics: list[Topic] = []

    def changed(self, topic: Topic) -> None:
        self.topics.append(topic)


@pytest.fixture
def server_app(world: World, db_engine: sa.Engine, settings: Settings) -> Iterator[ServerApp]:
    """The API as the server builds it: its notifier is the server context, whose loops' wake
    events are plain events here (no loop runs: the test reads which ones were set)."""
    ctx = ServerContext(
        settings=settings, session_factory=world.session_factory, engine=FakeEngine(), owner_id="test"
    )
    ctx.wake_events = {name: threading.Event() for name in LOOPS}
    with TestClient(create_app(settings, db_engine=db_engine, notifier=ctx)) as client:
        yield client, ctx.wake_events


def woken(events: dict[str, threading.Event]) -> set[str]:
    """The loops woken since the last call (their events are cleared again)."""
    names = {name for name, event in events.items() if event.is_set()}
    for event in events.values():
        event.clear()
    return names


def test_each_write_through_the_api_wakes_the_loops_that_act_on_it(
    world: World, server_app: ServerApp
) -> None:
    client, events = server_app
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2)
        db.commit()
    r = client.post(f"{API}/jobs", json=SIMPLE_JOB, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    assert woken(events) == {"schedule"}
    job_id = r.json()["id"]
    assert client.get(f"{API}/jobs/{job_id}", headers=world.as_("alice")).status_code == 200
    assert woken(events) == set()  # a read changes nothing
    assert client.post(f"{API}/jobs/{job_id}/cancel", headers=world.as_("alice")).status_code == 200
    assert woken(events) == {"dispatch", "reconcile"}
    assert client.post(f"{API}/nodes/n1/cordon", headers=world.as_("admin")).status_code == 200
    assert woken(events) == {"nodes", "schedule"}
    r = client.put(f"{API}/groups/vision/quota", json={"guaranteed": 1, "max": 2}, headers=world.as_("admin"))
    assert r.status_code == 200, r.text
    assert woken(events) == {"schedule"}


def test_a_refused_write_wakes_nothing(world: World, server_app: ServerApp) -> None:
    client, events = server_app
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2)
        db.commit()
    too_big = {"name": "big", "command": "x", "resources": {"gpus": 4}}
    assert client.post(f"{API}/jobs", json=too_big, headers=world.as_("alice")).status_code == 422
    r = client.put(f"{API}/groups/vision/quota", json={"guaranteed": 5, "max": 1}, headers=world.as_("admin"))
    assert r.status_code == 422
    assert client.post(f"{API}/nodes/nope/cordon", headers=world.as_("admin")).status_code == 404
    assert woken(events) == set()


def test_every_topic_wakes_a_loop_that_exists() -> None:
    names = {loop.name for loop in collect_loops()}  # the core loops and the areas' (paging)
    assert set(WAKE_ON_CHANGE) == set(Topic)
    assert all(loops and set(loops) <= names for loops in WAKE_ON_CHANGE.values()), WAKE_ON_CHANGE


def test_a_topic_is_told_at_commit_and_forgotten_on_rollback() -> None:
    engine = sa.create_engine("sqlite://")
    factory = make_session_factory(engine)
    recorder = Recorder()
    notify.bind(factory, recorder)
    with factory() as session:
        session.execute(sa.text("SELECT 1"))
        notify.changed(session, Topic.JOBS)
        notify.changed(session, Topic.JOBS)
        assert recorder.topics == []  # not before the change is visible
        session.commit()
        assert recorder.topics == [Topic.JOBS]  # once per commit, however often it was noted
        session.execute(sa.text("SELECT 1"))
        notify.changed(session, Topic.NODES)
        session.rollback()
        session.execute(sa.text("SELECT 1"))
        session.commit()
        assert recorder.topics == [Topic.JOBS]  # the rolled-back change was never told
    with factory() as session:
        session.execute(sa.text("SELECT 1"))
        notify.changed(session, Topic.QUOTAS)
    assert recorder.topics == [Topic.JOBS]  # closed without commit: nothing happened
    with make_session_factory(engine)() as session:  # an unbound factory tells nobody
        session.execute(sa.text("SELECT 1"))
        notify.changed(session, Topic.JOBS)
        session.commit()
    assert recorder.topics == [Topic.JOBS]
    engine.dispose()
