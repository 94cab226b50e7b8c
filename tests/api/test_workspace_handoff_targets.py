"""A handoff's destination (corral.services.workspace_passes.handoff_target) on the real app and
database: the redeem redirects the browser to it, which resolves dot segments (escaped too) and
backslashes, so a destination that would leave `/ws/<id>/` as a browser (or a server decoding
once more) reads it is refused 400, naming why, at every step that reads it: the portal's
`/ws/<id>/`, the workspace origin's begin, the portal's ticket and the redeem. Honest deep links
arrive byte for byte. The fixtures and the handoff's helpers are tests/api/test_workspace_origin.py's.
"""

from __future__ import annotations

import secrets
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from corral.db.workspace_models import WorkspacePass
from corral.services import auth
from corral.services.workspace_passes import MAX_ESCAPES, BadTarget, handoff_target
from corral.workspaces.origin import HANDOFF_BEGIN_PATH, HANDOFF_PATH, TICKET_PATH, state_cookie
from tests.api import test_workspace_origin as origin_tests
from tests.api.conftest import World
from tests.api.test_workspace_origin import (
    cookie_of,
    portal_session,
    redeem,
    running_workspace,
    ticket_of,
)

jupyter, lab = origin_tests.jupyter, origin_tests.lab  # its fixtures: JupyterLab's stand-in, its listener

DOT = (
    "has a dot segment ('.' or '..', escaped or not, or after an escaped '/' or a backslash), "
    "which a browser resolves, out of /ws/{id}/ perhaps"
)
HOST = "names a scheme or a host: the destination is a path on the workspace origin"


def hostile(ws_id: int, other: int) -> dict[str, str]:
    """Destinations for workspace `ws_id` that a browser (or a server on the way) would resolve
    elsewhere, most into workspace `other`'s path; each with why it is refused."""
    dot = DOT.format(id=ws_id)
    return {
        f"/ws/{ws_id}/%2e%2e/{other}/lab": dot,  # the review's finding: a browser resolves %2e%2e
        f"/ws/{ws_id}/%2e%2e/%2e%2e/x": dot,
        f"/ws/{ws_id}/.%2E/{other}/lab": dot,
        f"/ws/{ws_id}/..%2f{other}%2flab": dot,  # a server decoding %2f once more
        f"/ws/{ws_id}/a%2fb/../../{other}/lab": dot,  # the browser's reading: a%2fb is one segment
        f"/ws/{ws_id}/../{other}/lab": dot,
        f"/ws/{ws_id}/lab/./x": dot,
        f"/ws/{ws_id}/..\\{other}\\lab": dot,  # browsers take `\` for `/`
        f"/ws/{ws_id}/..%5c{other}%5clab": dot,
        f"/ws/{ws_id}/%252e%252e/{other}/lab": dot,  # escaped twice
        f"/ws/{ws_id}/%25252e%25252e/{other}/lab": dot,  # three times
        f"/ws/{ws_id}/%2525252525252e/x": f"is escaped more than {MAX_ESCAPES} times over",
        f"/ws/{ws_id}/lab%0d%0aSet-Cookie:%20x=1": "holds a control character (escaped: %00 to %1F or %7F)",
        f"/ws/{ws_id}/lab%00x": "holds a control character (escaped: %00 to %1F or %7F)",
        f"/ws/{ws_id}/lab\tx": "holds a space, a control character or a non-ASCII one: a link comes escaped",
        f"/ws/{ws_id}/lab#/../../{other}": "holds a fragment ('#'), which a browser never sends",
        "//evil.example/ws/1/lab": HOST,
        "/\\evil.example/ws/1/lab": HOST,
        "javascript:alert(1)//ws/1/": HOST,
        f"/ws/{ws_id}/" + "a" * 2048: "is longer than the 2048 characters a workspace link may have",
    }


def honest(ws_id: int) -> list[str]:
    """JupyterLab's deep links, as a browser sends them (escaped, its own dots resolved)."""
    return [
        f"/ws/{ws_id}/lab/tree/a%20b.ipynb",
        f"/ws/{ws_id}/lab/tree/caf%C3%A9/%E2%82%AC.ipynb?reset",
        f"/ws/{ws_id}/lab/tree/.ipynb_checkpoints/x...y-checkpoint.ipynb",
        f"/ws/{ws_id}/files/50%2525%20off.txt?download=1",  # a file named `50%25 off.txt`
        f"/ws/{ws_id}/lab/workspaces/auto-x/tree/a?path=../..%2F&x=%2e%2e",  # the query is the lab's
        f"/ws/{ws_id}/lab/tree/%5Bdraft%5D%20%23%3F.ipynb",
    ]


def shown(to: str) -> str:
    return repr(to if len(to) <= 80 else to[:80] + "...")


def test_the_one_check_names_what_is_wrong_and_keeps_honest_links() -> None:
    for to, why in hostile(7, 8).items():
        with pytest.raises(BadTarget) as refused:
            handoff_target(to)
        assert str(refused.value) == f"{shown(to)} {why}", to
    for to in honest(7):
        assert handoff_target(to) == (7, to)


def test_a_destination_leaving_its_workspace_is_refused_at_every_step(world: World, lab: TestClient) -> None:
    ws_id, other = running_workspace(world, "nb"), running_workspace(world, "other", gpu=1)
    secret = portal_session(world, "alice")
    jar = {"Cookie": f"corral_session={secret}", "Accept": "application/json"}
    state = "c" * 64
    for to, why in hostile(ws_id, other).items():
        begin = lab.get(HANDOFF_BEGIN_PATH, params={"to": to}, headers=jar, follow_redirects=False)
        lab.cookies.clear()
        assert begin.status_code == 400 and "set-cookie" not in begin.headers, (to, begin.text)
        assert begin.json()["detail"] == (
            f"{HANDOFF_BEGIN_PATH} takes ?to=/ws/<id>/... from the portal: {shown(to)} {why}"
        )
        ticket = world.client.get(
            TICKET_PATH, params={"to": to, "state": state}, headers=jar, follow_redirects=False
        )
        assert ticket.status_code == 400, (to, ticket.text)
        assert ticket.json()["detail"] == (
            f"{TICKET_PATH} takes ?to=/ws/<id>/... from the workspace origin: {shown(to)} {why}"
        )
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0


def test_the_portal_hands_over_no_address_that_leaves_its_workspace(world: World, lab: TestClient) -> None:
    """What a browser sends the portal has its literal dots resolved already; escaped slashes
    and backslashes, and dots escaped twice, it sends as they are."""
    ws_id, other = running_workspace(world, "nb"), running_workspace(world, "other", gpu=1)
    jar = {"Cookie": f"corral_session={portal_session(world, 'alice')}", "Accept": "application/json"}
    for to in (
        f"/ws/{ws_id}/..%2f{other}%2flab",
        f"/ws/{ws_id}/..%5c{other}%5clab",
        f"/ws/{ws_id}/%252e%252e/{other}/lab",
    ):
        r = world.client.get(to, headers=jar, follow_redirects=False)
        assert r.status_code == 400 and "location" not in r.headers, (to, r.text)
        assert r.json()["detail"] == (
            f"the portal hands over addresses under /ws/{ws_id}/ only: {shown(to)} {DOT.format(id=ws_id)}"
        )


def test_a_ticket_for_a_destination_leaving_its_workspace_is_refused_at_the_redeem(
    world: World, lab: TestClient
) -> None:
    """A ticket issued for such a destination before it was checked (by an older version, or
    written by hand): the redeem does not send the browser there, sets no cookie, and spends it."""
    ws_id, other = running_workspace(world, "nb"), running_workspace(world, "other", gpu=1)
    secret = portal_session(world, "alice")
    fits = [(to, why) for to, why in hostile(ws_id, other).items() if len(to) <= 2048]  # (the column)
    for to, why in [*fits, (f"/ws/{other}/lab", None)]:
        ticket, state = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        now = time.time()
        with world.session_factory() as db:
            db.add(
                WorkspacePass(
                    id_hash=auth.sha256_hex(ticket),
                    kind="ticket",
                    workspace_id=ws_id,
                    session_hash=auth.sha256_hex(secret),
                    state_hash=auth.sha256_hex(state),
                    path=to,
                    created_at=now,
                    expires_at=now + 30,
                )
            )
            db.commit()
        cookie = f"{state_cookie(auth.sha256_hex(state), False)[0]}={state}"
        r = redeem(lab, ticket, cookie, Accept="application/json")
        assert r.status_code == 400 and "location" not in r.headers, (to, r.text)
        if why is None:  # under another workspace than the ticket is for
            why = f"is not under /ws/{ws_id}/, the workspace it is for"
        assert r.json()["detail"] == (
            f"{HANDOFF_PATH} sends the browser under /ws/<id>/ only: {shown(to)} {why}"
        )
        # the state cookie, spent, deleted (review120 #2: none was) and nothing else set
        (deleted,) = r.headers.get_list("set-cookie")
        assert (
            deleted.startswith(state_cookie(auth.sha256_hex(state), False)[0] + "=")
            and "Max-Age=0" in deleted
        )
        with world.session_factory() as db:
            assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0, to


def test_honest_deep_links_arrive_byte_for_byte(world: World, lab: TestClient) -> None:
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    for to in honest(ws_id):
        cookie = cookie_of(lab, ticket_of(world, lab, secret, to), to, ws_id)
        r = lab.get(to, headers={"Cookie": f"corral_workspace={cookie}"})
        assert r.status_code == 200 and r.json()["path"] == to, (to, r.text)
