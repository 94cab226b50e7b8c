"""The source address a real server records (per-address login lockout and rate limit, audit) is
the TCP peer unless an admin names the proxies to believe (CORRAL_FORWARDED_ALLOW_IPS). With
uvicorn's default (proxy headers on, 127.0.0.1 trusted) any local process could claim any
address through X-Forwarded-For: a fresh one per password guess, or someone else's to lock out."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from corral.config import Settings
from tests.server_fixture import start_server

SPOOFED = "6.6.6.6"


def _address_keys_after_a_spoofed_failure(home: Path, env: dict[str, str]) -> set[str]:
    srv = start_server(home, extra_env=env)
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            r = c.post(
                "/api/v1/auth/login",
                json={"username": "admin", "password": "wrong-password"},
                headers={"X-Forwarded-For": SPOOFED},
            )
            assert r.status_code == 401, r.text
            rows = c.get("/api/v1/auth/lockouts", headers={"Authorization": f"Bearer {srv.token}"})
            assert rows.status_code == 200, rows.text
            return {row["key"] for row in rows.json() if row["scope"] == "address"}
    finally:
        srv.stop()


def test_x_forwarded_for_is_ignored_unless_the_proxy_is_named(tmp_path: Path) -> None:
    assert _address_keys_after_a_spoofed_failure(tmp_path / "plain", {}) == {"127.0.0.1"}


def test_a_named_proxy_is_believed(tmp_path: Path) -> None:
    env = {"CORRAL_FORWARDED_ALLOW_IPS": "127.0.0.1"}  # the shipped corral.env: nginx on the host
    assert _address_keys_after_a_spoofed_failure(tmp_path / "proxied", env) == {SPOOFED}


def test_a_proxy_entry_that_is_no_address_refuses_start_naming_it() -> None:
    """uvicorn drops an entry it cannot parse without a word: a typo would believe no proxy, and
    every caller would be the proxy's address (one lockout for all). Refused at start instead."""
    with pytest.raises(ValueError, match=r"CORRAL_FORWARDED_ALLOW_IPS: '127\.0\.0\.l' is not a network"):
        Settings(forwarded_allow_ips="10.0.0.0/8, 127.0.0.l")
    assert Settings(forwarded_allow_ips="*").forwarded_allow_ips == "*"
    assert Settings(forwarded_allow_ips="127.0.0.1,::1").forwarded_allow_ips == "127.0.0.1,::1"
