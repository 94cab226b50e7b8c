"""Who may scrape `/metrics` (it names users, groups and job ids).

The rule (docs/security.md, "API and login"):
- a scrape token is configured (`CORRAL_METRICS_TOKEN`, or the first line of
  `CORRAL_METRICS_TOKEN_FILE`): every scrape must send `Authorization: Bearer <that token>`;
- no token, and the server binds only a loopback or private address (127.0.0.1, ::1, 10/8, ...):
  anyone who can reach that address may scrape, as before;
- no token, and the server binds a public or wildcard address (0.0.0.0, ::, a public IP or a
  host name): every scrape is refused until a token is configured;
- no token, and the Slurm engine (whatever the bind): refused as well. A Slurm job shares its
  node's network, so any user's job could scrape a private address, and with it every running
  job's user and group (which the API hides from non-members).
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from corral.api.deps import bearer_token
from corral.api.limits import Receive, Scope, Send, header, send_error
from corral.config import Settings

METRICS_PATH = "/metrics"


def metrics_token(settings: Settings) -> str | None:
    """The configured scrape token, or None. A token file that cannot be read refuses start-up
    (a server that silently scraped without the token an admin meant to set would leak), and so
    does a CORRAL_METRICS_TOKEN of blanks only."""
    if settings.metrics_token:
        token = settings.metrics_token.strip()
        if not token:  # (blanks only: else "", which no scrape can send, and 401 with no word why)
            raise ValueError("CORRAL_METRICS_TOKEN: it is empty (blanks only): set a token or unset it")
        return token
    if settings.metrics_token_file is not None:
        try:
            text = settings.metrics_token_file.read_text()
        except OSError as exc:
            path = settings.metrics_token_file
            raise ValueError(f"CORRAL_METRICS_TOKEN_FILE: cannot read {path}: {exc}") from exc
        first = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not first:
            raise ValueError(f"CORRAL_METRICS_TOKEN_FILE: {settings.metrics_token_file} is empty")
        return first
    return None


def binds_private_only(host: str) -> bool:
    """True when `host` (the bind address) is a loopback or private address."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a host name may resolve to anything
    if address.is_unspecified:
        return False
    return address.is_loopback or address.is_private


class MetricsGuard:
    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.token = metrics_token(settings)
        self.slurm = settings.engine == "slurm"
        self.open = self.token is None and not self.slurm and binds_private_only(settings.host)
        self.host = settings.host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != METRICS_PATH or self.open:
            await self.app(scope, receive, send)
            return
        if self.token is None:
            why = (
                "the Slurm engine's jobs share their node's network and could scrape it"
                if self.slurm
                else f"the server binds {self.host}, which is not a private address"
            )
            await send_error(
                send,
                401,
                f"/metrics is closed: {why}; set CORRAL_METRICS_TOKEN (or CORRAL_METRICS_TOKEN_FILE) "
                "and give Prometheus that token",
                {"www-authenticate": "Bearer"},
            )
            return
        # read as authentication reads it: an empty `Bearer` is no token (nor a blank one's match)
        sent = bearer_token(header(scope, b"authorization") or "")
        if sent is None or not hmac.compare_digest(sent.encode(), self.token.encode()):
            await send_error(
                send,
                401,
                "/metrics needs 'Authorization: Bearer <scrape token>' (the token set by "
                "CORRAL_METRICS_TOKEN or CORRAL_METRICS_TOKEN_FILE)",
                {"www-authenticate": "Bearer"},
            )
            return
        await self.app(scope, receive, send)
