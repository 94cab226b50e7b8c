"""On-call test fixtures: a migrated SQLite database in a temp CORRAL_HOME, the real app
(create_app) with an admin token, two people with email addresses and tokens, a real SMTP server
(aiosmtpd) and a real HTTP server receiving webhooks."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from corral.api.app import create_app
from corral.config import Settings
from corral.db.models import User
from corral.db.session import init_db, make_engine, make_session_factory
from corral.monitor.config import MonitorConfig
from corral.services import auth
from tests.pg import postgres_server
from tests.support import copy_migrated_sqlite, free_port
from tests.webhook_server import WebhookServer, serve_webhook

__all__ = ["postgres_server"]  # the fixture, for tests that run on PostgreSQL too


class Inbox:
    """aiosmtpd handler: every message received, with when it arrived."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.arrived: list[float] = []
        self.changed = threading.Condition()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd hook
        with self.changed:
            self.messages.append(message_from_bytes(envelope.content))
            self.arrived.append(time.time())
            self.changed.notify_all()
        return "250 OK"

    def to(self) -> list[str]:
        return [str(m["To"]) for m in self.messages]

    def wait_for(self, count: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.messages) >= count, timeout)


@dataclass
class Smtp:
    port: int
    inbox: Inbox

    def config(self) -> MonitorConfig:
        return MonitorConfig.model_validate(
            {
                "channels": [
                    {
                        "name": "mail", "type": "email", "smtp_host": "127.0.0.1", "smtp_port": self.port,
                        "from": "corral@example.org", "to": ["ops-archive@example.org"],
                    }
                ],
                "retry": {"initial_backoff": "1s", "max_attempts": 2},
            }
        )  # fmt: skip

    def write_monitor_yml(self, home: Path) -> None:
        """A server home's monitor.yml: one email channel, to ops@, through this SMTP server."""
        home.mkdir(parents=True, exist_ok=True)
        (home / "monitor.yml").write_text(
            "channels:\n"
            f"  - {{name: mail, type: email, smtp_host: 127.0.0.1, smtp_port: {self.port}, "
            "from: corral@example.org, to: [ops@example.org]}\n"
        )


def self_signed_tls(folder: Path) -> ssl.SSLContext:
    """A server's TLS context with a certificate for 127.0.0.1 made here (files in `folder`)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    address = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).add_extension(address, critical=False)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


@contextlib.contextmanager
def smtp_server(
    inbox: Inbox,
    line_delay_s: float = 0.0,
    starttls: ssl.SSLContext | None = None,
    protocol: type[Any] | None = None,
) -> Iterator[Smtp]:
    """A real SMTP server (aiosmtpd) on a free port that puts what it gets in `inbox`;
    `line_delay_s`: it waits that long before each line it answers (a reply of many lines, as
    EHLO's, takes that many times as long), as a server that stretches a send out does.
    `starttls`: it offers STARTTLS with that context and takes no mail before it. `protocol`: an
    aiosmtpd SMTP subclass that answers some commands its own way (a long QUIT, a slow greeting)."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import SMTP

    class SlowLines(protocol or SMTP):  # type: ignore[misc]
        async def push(self, status: Any) -> None:
            await asyncio.sleep(line_delay_s)
            await super().push(status)

    class SlowLinesController(Controller):
        def factory(self) -> SMTP:
            return SlowLines(self.handler, **self.SMTP_kwargs)

    port = free_port()
    tls: dict[str, Any] = {"tls_context": starttls, "require_starttls": True} if starttls else {}
    controller = SlowLinesController(inbox, hostname="127.0.0.1", port=port, **tls)
    controller.start()
    try:
        yield Smtp(port, inbox)
    finally:
        controller.stop()


@pytest.fixture
def smtp() -> Iterator[Smtp]:
    with smtp_server(Inbox()) as server:
        yield server


@pytest.fixture
def hook() -> Iterator[WebhookServer]:
    yield from serve_webhook()


@dataclass
class Env:
    home: Path
    settings: Settings
    engine: sa.Engine
    factory: sessionmaker[Session]
    client: TestClient
    admin: dict[str, str]
    people: dict[str, dict[str, str]]  # name -> auth header

    def put(self, path: str, body: dict[str, Any], as_user: str | None = None) -> Any:
        headers = self.admin if as_user is None else self.people[as_user]
        response = self.client.put(f"/api/v1{path}", json=body, headers=headers)
        assert response.status_code in (200, 201), response.text
        return response.json()


@pytest.fixture
def env(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """SQLite, or PostgreSQL for a test parametrized `@pytest.mark.parametrize("env", ["postgres"],
    indirect=True)`."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "http://corral.test")
    if getattr(request, "param", "sqlite") == "postgres":
        url = request.getfixturevalue("postgres_server").create_migrated_database()
    else:
        url = copy_migrated_sqlite(home / "corral.db")  # a copy: no migrations per test (tests/support.py)
    init_db(url)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    settings = Settings(home=home, database_url=url)
    people: dict[str, dict[str, str]] = {}
    with factory() as db:
        token = auth.bootstrap_admin(db, settings)
        assert token is not None
        for name in ("alice", "bob", "carol"):
            user = User(name=name, is_admin=False, active=True, created_at=time.time())
            user.email = f"{name}@example.org"
            db.add(user)
            db.flush()
            _, secret = auth.create_token(db, user, "test")
            people[name] = {"Authorization": f"Bearer {secret}"}
        db.commit()
    client = TestClient(create_app(settings, db_engine=engine))
    yield Env(home, settings, engine, factory, client, {"Authorization": f"Bearer {token}"}, people)
    client.close()
    engine.dispose()
