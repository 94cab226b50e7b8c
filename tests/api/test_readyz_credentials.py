"""`/readyz` shows what failed only to the metrics scrape token or an admin's credential
(corral.api.routers.health.may_see_errors), reading the Authorization header as authentication
does (deps.bearer_token): the scheme in any case, blanks around the token dropped. A header that
is no `Bearer <token>` (an empty `Bearer`, another scheme) is no credential and no attempt at one:
the names only, whatever cookie came with it (the API answers such a request 401), and neither
the database nor the scrape token is looked at for it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.deps import SESSION_COOKIE
from corral.config import Settings
from tests.api.conftest import World
from tests.api.test_workspace_origin import portal_session

SCRAPE = "scrape-secret"
LOOP_ERROR = "RuntimeError: the dispatch loop's own words"


@dataclass(frozen=True)
class FailingLoop:
    name: str = "dispatch"
    ok: bool = False
    last_ok_s_ago: float = 120.0
    stall_after_s: float = 30.0
    error: str | None = LOOP_ERROR


@dataclass
class Probe:
    client: TestClient
    opened: list[int] = field(default_factory=list)  # database sessions the app opened

    def shown(self, headers: dict[str, str]) -> bool:
        """Whether /readyz with `headers` shows the loop's error (it always names the loop)."""
        r = self.client.get("/readyz", headers=headers)
        assert r.status_code == 503, r.text
        loop = r.json()["loops"]["dispatch"]
        assert loop["ok"] is False
        return loop.get("error") == LOOP_ERROR


@pytest.fixture
def probe(world: World, db_engine: sa.Engine, tmp_path: Path) -> Iterator[Probe]:
    yield from _probe(db_engine, tmp_path, metrics_token=SCRAPE)


def _probe(db_engine: sa.Engine, tmp_path: Path, **overrides: Any) -> Iterator[Probe]:
    """An app on the world's database with a loop that fails, counting the database sessions it
    opens (its own session factory, wrapped)."""
    settings = Settings(home=tmp_path / "home2", database_url="sqlite:///unused", **overrides)
    app = create_app(settings, db_engine=db_engine)
    app.state.loop_health = lambda: [FailingLoop()]
    real_factory = app.state.session_factory
    probe = Probe(TestClient(app))

    def counted() -> Any:
        probe.opened.append(1)
        return real_factory()

    app.state.session_factory = counted
    with probe.client:
        yield probe


def test_tokens_are_read_as_authentication_reads_them(world: World, probe: Probe) -> None:
    admin = world.as_("admin")["Authorization"].removeprefix("Bearer ")
    for header in (f"Bearer {admin}", f"bEaReR   {admin}  ", f"BEARER {SCRAPE}", f"bearer {SCRAPE} "):
        assert probe.shown({"Authorization": header}), header
    alice = world.as_("alice")["Authorization"].removeprefix("Bearer ")
    assert not probe.shown({"Authorization": f"Bearer {alice}"})  # not an admin
    assert not probe.shown({"Authorization": "Bearer not-a-token"})
    assert not probe.shown({})


def test_an_empty_bearer_or_another_scheme_is_no_credential_and_costs_no_lookup(
    world: World, probe: Probe
) -> None:
    cookie = {"Cookie": f"{SESSION_COOKIE}={portal_session(world, 'admin')}"}
    assert probe.shown(cookie)  # the admin's portal session alone: shown
    for header in ("Bearer", "Bearer ", "bearer    ", "Basic YWRtaW46eA==", f"Token {SCRAPE}"):
        before = len(probe.opened)
        assert not probe.shown({"Authorization": header}), header
        assert not probe.shown({"Authorization": header, **cookie}), header
        assert len(probe.opened) == before, f"{header!r}: the database was asked"
        # as the API answers the same request: refused, the cookie notwithstanding
        me = probe.client.get("/api/v1/me", headers={"Authorization": header, **cookie})
        assert me.status_code == 401, (header, me.text)
