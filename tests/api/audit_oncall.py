"""The on-call routes' audit calls (tests/api/test_audit.py merges them into its CALLS): one
successful call of each state-changing route of corral.api.routers.oncall, as the admin, and the
action it must record. Kept apart so that the audit test's own table stays easy to merge."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from corral.db.models import User
from corral.services import paging

API = "/api/v1"
Call = Callable[[Any], tuple[str, str, dict[str, Any]]]
_NAMES = itertools.count(1)


def _ok(r: Any) -> Any:
    assert r.status_code < 300, r.text
    return r.json() if r.content else None


def _schedule(w: Any) -> str:
    name = f"sched{next(_NAMES)}"
    layer = {"rotation": "daily", "start_date": "2026-01-05", "members": ["admin"]}
    _ok(w.client.put(f"{API}/oncall/schedules/{name}", json={"layers": [layer]}, headers=w.as_("admin")))
    return name


def _policy(w: Any) -> str:
    name = f"pol{next(_NAMES)}"
    steps = [{"schedule": _schedule(w), "wait_minutes": 5}]
    _ok(w.client.put(f"{API}/oncall/policies/{name}", json={"steps": steps}, headers=w.as_("admin")))
    return name


def _page(w: Any) -> int:
    body = {"policy": _policy(w), "subject": "test page"}
    return int(_ok(w.client.post(f"{API}/oncall/pages", json=body, headers=w.as_("admin")))["id"])


def _override(w: Any) -> tuple[str, int]:
    name = _schedule(w)
    body = {"user": "admin", "start": time.time(), "end": time.time() + 3600}
    made = _ok(w.client.post(f"{API}/oncall/schedules/{name}/overrides", json=body, headers=w.as_("admin")))
    return name, int(made["id"])


def _contact(w: Any) -> int:
    body = {"kind": "webhook", "address": "https://hooks.invalid/hook"}  # loopback is refused
    made = _ok(w.client.post(f"{API}/users/admin/contacts", json=body, headers=w.as_("admin")))
    return int(made["methods"][-1]["id"])


def _ack_link(w: Any) -> tuple[str, str, dict[str, Any]]:
    page_id = _page(w)
    settings = w.client.app.state.settings
    with w.session_factory() as db:
        admin_id = db.scalar(select(User.id).where(User.name == "admin"))
    token = paging.ack_token(paging.link_key(settings), page_id, int(admin_id), time.time() + 600)
    return "POST", f"{API}/ack/{token}", {}


ONCALL_CALLS: dict[tuple[str, str], tuple[Call, str]] = {
    ("PUT", "/api/v1/oncall/schedules/{name}"): (
        lambda w: ("PUT", f"{API}/oncall/schedules/new{next(_NAMES)}", {"json": {"time_zone": "UTC"}}),
        "oncall.schedule.create",
    ),
    ("DELETE", "/api/v1/oncall/schedules/{name}"): (
        lambda w: ("DELETE", f"{API}/oncall/schedules/{_schedule(w)}", {}),
        "oncall.schedule.delete",
    ),
    ("POST", "/api/v1/oncall/schedules/{name}/feed/rotate"): (
        lambda w: ("POST", f"{API}/oncall/schedules/{_schedule(w)}/feed/rotate", {}),
        "oncall.schedule.feed_rotate",
    ),
    ("POST", "/api/v1/oncall/schedules/{name}/overrides"): (
        lambda w: (
            "POST",
            f"{API}/oncall/schedules/{_schedule(w)}/overrides",
            {"json": {"user": "alice", "start": time.time(), "end": time.time() + 60}},
        ),
        "oncall.override.add",
    ),
    ("DELETE", "/api/v1/oncall/schedules/{name}/overrides/{override_id}"): (
        lambda w: ("DELETE", "{}/oncall/schedules/{}/overrides/{}".format(API, *_override(w)), {}),
        "oncall.override.remove",
    ),
    ("PUT", "/api/v1/oncall/policies/{name}"): (
        lambda w: ("PUT", f"{API}/oncall/policies/p{next(_NAMES)}", {"json": {"steps": [{"user": "alice"}]}}),
        "oncall.policy.create",
    ),
    ("DELETE", "/api/v1/oncall/policies/{name}"): (
        lambda w: ("DELETE", f"{API}/oncall/policies/{_policy(w)}", {}),
        "oncall.policy.delete",
    ),
    ("POST", "/api/v1/oncall/pages"): (
        lambda w: ("POST", f"{API}/oncall/pages", {"json": {"policy": _policy(w), "subject": "s"}}),
        "page.start",
    ),
    ("POST", "/api/v1/oncall/pages/{page_id}/ack"): (
        lambda w: ("POST", f"{API}/oncall/pages/{_page(w)}/ack", {}),
        "page.ack",
    ),
    ("POST", "/api/v1/oncall/pages/{page_id}/cancel"): (
        lambda w: ("POST", f"{API}/oncall/pages/{_page(w)}/cancel", {}),
        "page.cancel",
    ),
    ("POST", "/api/v1/ack/{token}"): (_ack_link, "page.ack"),
    ("PUT", "/api/v1/users/{name}/email"): (
        lambda w: ("PUT", f"{API}/users/alice/email", {"json": {"email": "alice@example.org"}}),
        "user.set_email",
    ),
    ("POST", "/api/v1/users/{name}/contacts"): (
        lambda w: ("POST", f"{API}/users/alice/contacts", {"json": {"kind": "email", "address": "a@b.org"}}),
        "contact.add",
    ),
    ("DELETE", "/api/v1/users/{name}/contacts/{contact_id}"): (
        lambda w: ("DELETE", f"{API}/users/admin/contacts/{_contact(w)}", {}),
        "contact.remove",
    ),
}
