"""A job's history views (GET /jobs/{id}, its events, `corral events`, the SDK) when the job has
more events than they show (review112 #3): each label edit and each requeue adds one, without
bound, and the views read the oldest 500, so the job's latest history, its end included, dropped
out of them without notice. They show the newest, say how many earlier ones are left out, and
page back through them."""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest

from corral.sdk import Client, CorralError
from corral.services.jobs import EVENTS_SHOWN
from corral.services.lifecycle import record_event
from tests.api.conftest import World
from tests.api.test_cli import run, server_url
from tests.api.test_job_labels import JOBS, submit
from tests.support import served

__all__ = ["server_url"]  # the fixture

EDITS = EVENTS_SHOWN + 10


def a_long_history(world: World) -> tuple[int, int]:
    """A job submitted, relabelled EDITS times (the events written as an edit writes them, at
    once), then cancelled; returns its id and how many events it has."""
    job = submit(world, trial=0)
    now = time.time()
    with world.session_factory() as db:
        for step in range(1, EDITS + 1):
            record_event(db, job, now, f"labels changed by alice: trial={step}", kind="labels")
        db.commit()
    r = world.client.post(f"{JOBS}/{job}/cancel", headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    shown = r.json()
    total = len(shown["events"]) + shown["earlier_events"]
    assert total >= EDITS + 2  # submitted, the edits, cancelled
    return job, total


def test_a_jobs_views_show_its_newest_events_and_how_many_earlier_ones_are_left_out(world: World) -> None:
    job, total = a_long_history(world)
    shown = world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()
    assert len(shown["events"]) == EVENTS_SHOWN and shown["earlier_events"] == total - EVENTS_SHOWN
    assert shown["events"][-1]["to_state"] == "cancelled"  # its end, not its first 500
    assert shown["events"][-2]["message"] == f"labels changed by alice: trial={EDITS}"
    assert [e["at"] for e in shown["events"]] == sorted(e["at"] for e in shown["events"])  # oldest first

    r = world.client.get(f"{JOBS}/{job}/events", headers=world.as_("alice"))
    assert r.json() == shown["events"]
    assert r.headers["X-Corral-Earlier-Events"] == str(total - EVENTS_SHOWN)
    # paging back: the rest, down to its submission, and nothing before them
    r = world.client.get(f"{JOBS}/{job}/events", params={"skip": EVENTS_SHOWN}, headers=world.as_("alice"))
    rest = r.json()
    assert len(rest) == total - EVENTS_SHOWN and r.headers["X-Corral-Earlier-Events"] == "0"
    assert rest[0]["to_state"] == "queued" and "trial=" not in rest[0]["message"]
    assert rest[-1]["message"] == f"labels changed by alice: trial={EDITS - EVENTS_SHOWN + 1}"
    r = world.client.get(f"{JOBS}/{job}/events", params={"skip": 1, "limit": 2}, headers=world.as_("alice"))
    assert [e["message"] for e in r.json()] == [
        f"labels changed by alice: trial={EDITS - 1}",
        f"labels changed by alice: trial={EDITS}",
    ]
    assert r.headers["X-Corral-Earlier-Events"] == str(total - 3)
    r = world.client.get(f"{JOBS}/{job}/events", params={"limit": 0}, headers=world.as_("alice"))
    assert r.status_code == 422 and "limit" in r.text


def test_corral_events_and_the_sdk_say_what_they_leave_out(world: World, server_url: str) -> None:
    job, total = a_long_history(world)
    earlier = total - EVENTS_SHOWN
    code, out = run(world, server_url, "alice", "events", str(job))
    assert code == 0, out
    assert f"{EVENTS_SHOWN} events" in out and "cancelled" in out
    first_shown = world.client.get(f"{JOBS}/{job}/events", headers=world.as_("alice")).json()[0]["id"]
    assert f"{earlier} earlier events not shown: corral events {job} --before {first_shown}" in out
    code, out = run(world, server_url, "alice", "events", str(job), "--before", str(first_shown))
    assert code == 0 and f"{earlier} events" in out and "earlier event" not in out, out
    code, out = run(world, server_url, "alice", "events", str(job), "--skip", str(EVENTS_SHOWN))
    assert code == 0 and f"{earlier} events" in out and "earlier event" not in out, out
    code, out = run(world, server_url, "alice", "events", str(job), "-o", "json")  # review113 #7
    shown = json.loads(out)
    assert code == 0 and shown["earlier_events"] == earlier and len(shown["events"]) == EVENTS_SHOWN, out
    token = world.as_("alice")["Authorization"].split()[1]
    with Client(server_url, token=token) as c:
        rows, left_out = c.events_page(job)
        assert len(rows) == EVENTS_SHOWN and left_out == earlier
        assert rows[-1]["to_state"] == "cancelled"
        assert len(c.events(job, skip=EVENTS_SHOWN)) == earlier


def test_paging_back_by_event_id_stays_put_while_the_job_adds_events(world: World) -> None:
    """review113 #6: paging by `skip` counts from the newest, so each event added meanwhile (a
    running job's transition, a label edit) showed again on the next page; `before` the first
    event's id shows the same page however many are added, and its count of earlier events
    (read with the rows) is the same too."""
    job, total = a_long_history(world)
    first = world.client.get(f"{JOBS}/{job}/events", headers=world.as_("alice")).json()
    cursor = first[0]["id"]
    back = world.client.get(
        f"{JOBS}/{job}/events", params={"before": cursor, "limit": 5}, headers=world.as_("alice")
    )
    assert back.headers["X-Corral-Earlier-Events"] == str(total - EVENTS_SHOWN - 5)
    assert all(e["id"] < cursor for e in back.json()) and len(back.json()) == 5
    with world.session_factory() as db:
        for step in range(3):
            record_event(db, job, time.time(), f"labels changed by alice: late={step}", kind="labels")
        db.commit()
    again = world.client.get(
        f"{JOBS}/{job}/events", params={"before": cursor, "limit": 5}, headers=world.as_("alice")
    )
    assert (
        again.json() == back.json()
        and again.headers["X-Corral-Earlier-Events"] == back.headers["X-Corral-Earlier-Events"]
    )
    newest = world.client.get(f"{JOBS}/{job}/events", headers=world.as_("alice"))
    assert newest.headers["X-Corral-Earlier-Events"] == str(total + 3 - EVENTS_SHOWN)
    assert newest.json()[-1]["message"] == "labels changed by alice: late=2"
    r = world.client.get(f"{JOBS}/{job}/events", params={"before": 0}, headers=world.as_("alice"))
    assert r.status_code == 422 and "before" in r.text


def test_the_earlier_events_header_is_in_the_openapi_schema(world: World) -> None:
    """review113 #7: the route declared no header, so X-Corral-Earlier-Events was invisible in
    /openapi.json (generated clients never read it)."""
    schema = world.client.get("/openapi.json").json()
    ok = schema["paths"]["/api/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"]["type"] == "array"  # the events, still
    header = ok["headers"]["X-Corral-Earlier-Events"]
    assert (
        header["schema"] == {"type": "integer", "minimum": 0} and "before the first" in header["description"]
    )


class OlderServer:
    """The real app answering GET /jobs/{id}/events as an older Corral did (review114 #9): its
    events without "id" and `before` not read (as before review113 #6), and with `counting`
    False without the X-Corral-Earlier-Events header and `skip` not read either (as before
    review112 #3). Everything else is the app's own answer. With `numbered` it is a current
    server behind a proxy that drops the header only: ids kept, `skip` and `before` read."""

    def __init__(self, app: Any, *, counting: bool, numbered: bool = False) -> None:
        self.app, self.counting, self.numbered = app, counting, numbered

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not re.fullmatch(r"/api/v1/jobs/\d+/events", scope["path"]):
            await self.app(scope, receive, send)
            return
        unread = set() if self.numbered else {"before"} if self.counting else {"before", "skip"}
        query = [(k, v) for k, v in parse_qsl(scope["query_string"].decode()) if k not in unread]
        scope = {**scope, "query_string": urlencode(query).encode()}
        start: dict[str, Any] = {}
        body = b""

        async def older(message: dict[str, Any]) -> None:
            nonlocal body
            if message["type"] == "http.response.start":
                start.update(message)
                return
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            events = [{k: v for k, v in e.items() if k != "id" or self.numbered} for e in json.loads(body)]
            sent = json.dumps(events).encode()
            dropped = {b"content-length"} | (set() if self.counting else {b"x-corral-earlier-events"})
            headers = [(k, v) for k, v in start["headers"] if k.lower() not in dropped]
            await send({**start, "headers": [*headers, (b"content-length", str(len(sent)).encode())]})
            await send({"type": "http.response.body", "body": sent})

        await self.app(scope, receive, older)


@pytest.mark.parametrize("counting", [True, False], ids=["no-ids", "no-paging"])
def test_corral_events_against_an_older_server(world: World, counting: bool) -> None:
    """review114 #9: the new CLI failed on an older server's events without "id" (a KeyError in
    the line naming the --before that pages back), and its --before, which that server does not
    read, printed the newest page as if it were the one asked for. The events show, the line
    names a --skip that server reads, and a page it cannot give is refused, saying why."""
    job, total = a_long_history(world)
    earlier = total - EVENTS_SHOWN
    with served(OlderServer(world.client.app, counting=counting)) as url:
        code, out = run(world, url, "alice", "events", str(job))
        assert code == 0 and f"{EVENTS_SHOWN} events" in out and "cancelled" in out, out
        if counting:
            assert f"{earlier} earlier events not shown: corral events {job} --skip {EVENTS_SHOWN}" in out
            code, out = run(world, url, "alice", "events", str(job), "--skip", str(EVENTS_SHOWN))
            assert code == 0 and f"{earlier} events" in out and "earlier event" not in out, out
        else:  # that server does not count them: its full page may not be all (review115 #3)
            assert "earlier event" not in out and "more may exist" in " ".join(out.split()), out
        code, out = run(world, url, "alice", "events", str(job), "-o", "json")
        shown = json.loads(out)
        assert code == 0 and {e["id"] for e in shown["events"]} == {None}, out
        code, out = run(world, url, "alice", "events", str(job), "--before", "2")
        said = " ".join(out.split())
        assert code == 1 and f"the Corral server at {url} is older than paging" in said, out
        assert ("by event id" in said) == counting and "queued" not in out, out
        token = world.as_("alice")["Authorization"].split()[1]
        with Client(url, token=token) as c:
            rows, left_out = c.events_page(job)
            assert len(rows) == EVENTS_SHOWN and left_out == (earlier if counting else None)
            assert rows[-1]["to_state"] == "cancelled" and rows[0]["id"] is None
            with pytest.raises(CorralError, match="ignores before"):
                c.events(job, before=2)
            if not counting:
                code, out = run(world, url, "alice", "events", str(job), "--skip", "3")
                assert code == 1 and "ignores skip" in " ".join(out.split()), out


def test_corral_events_pages_back_through_a_proxy_that_drops_the_count_header(world: World) -> None:
    """review115 #4: a current server whose X-Corral-Earlier-Events a proxy dropped was taken for
    the oldest kind and its --skip and --before refused; its events carry ids, so they are read
    as asked (the count is unknown: None for a full page, review115 #3)."""
    job, total = a_long_history(world)
    with served(OlderServer(world.client.app, counting=False, numbered=True)) as url:
        token = world.as_("alice")["Authorization"].split()[1]
        with Client(url, token=token) as c:
            newest, _ = c.events_page(job)
            before = newest[0]["id"]
            rows, left_out = c.events_page(job, before=before, limit=5)
            assert [r["id"] for r in rows] == sorted(r["id"] for r in rows) and rows[-1]["id"] < before
            assert len(rows) == 5 and left_out is None  # a full page, not counted: more may exist
            oldest, left_out = c.events_page(job, skip=EVENTS_SHOWN)  # less than full: all the rest
            assert len(oldest) == total - EVENTS_SHOWN and left_out == 0
            assert c.events_page(job, skip=3, limit=2)[0] == newest[-5:-3]
        code, out = run(world, url, "alice", "events", str(job), "--before", str(before))
        assert code == 0 and "older than paging" not in out, out


@pytest.mark.parametrize("numbered", [False, True], ids=["oldest", "count-dropped"])
def test_a_full_page_without_a_count_is_not_shown_as_the_whole_history(world: World, numbered: bool) -> None:
    """review115 #3: a server that sends no X-Corral-Earlier-Events (the oldest ones; or a current
    one whose header a proxy dropped) showed a job of 500+ events as its first 500 and said nothing
    of the rest: `corral events` (table and -o json) and the SDK took the missing count for 0.
    A full page without a count says more may exist and how to see them; a page less than full
    is the whole history and says nothing more."""
    job, total = a_long_history(world)
    short = submit(world, trial=1)  # a few events: a page less than full
    token = world.as_("alice")["Authorization"].split()[1]
    with served(OlderServer(world.client.app, counting=False, numbered=numbered)) as url:
        code, out = run(world, url, "alice", "events", str(job))
        said = " ".join(out.split())
        assert code == 0 and f"{EVENTS_SHOWN} events" in said and "more may exist" in said, out
        if numbered:
            first = world.client.get(f"{JOBS}/{job}/events", headers=world.as_("alice")).json()[0]["id"]
            assert f"come before these: more may exist: corral events {job} --before {first}" in said, out
        else:
            assert f"the Corral server at {url} did not say how many events job {job} has" in said, out
            assert "cannot page to them: upgrade the server" in said, out
        code, out = run(world, url, "alice", "events", str(job), "-o", "json")
        shown = json.loads(out)
        assert code == 0 and len(shown["events"]) == EVENTS_SHOWN and shown["earlier_events"] is None, out
        assert "more may exist" in shown["more_events"], out
        with Client(url, token=token) as c:
            rows, left_out = c.events_page(job)
            assert len(rows) == EVENTS_SHOWN < total and left_out is None
            rows, left_out = c.events_page(short)
            assert 0 < len(rows) < EVENTS_SHOWN and left_out == 0
        code, out = run(world, url, "alice", "events", str(short))
        assert code == 0 and "more may exist" not in out and "earlier event" not in out, out
        code, out = run(world, url, "alice", "events", str(short), "-o", "json")
        assert code == 0 and json.loads(out)["earlier_events"] == 0 and "more_events" not in json.loads(out)
