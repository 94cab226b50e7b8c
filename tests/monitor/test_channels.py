"""Notification channels against real servers: email to an aiosmtpd SMTP server, a JSON webhook
to a real HTTP server; broken channels retried with backoff and shown as failing without ever
blocking intake; bad config refused with file and line."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from email import message_from_bytes
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from corral.monitor import config
from corral.monitor.alerts import record_alert
from corral.monitor.channels import ChannelError, deliver_due, send_email
from corral.monitor.claiming import SEND_BUDGET_S, SENDING_RETRY_S
from corral.monitor.config import (
    SMTP_SEND_OPERATIONS,
    SMTP_TIMEOUT_MAX_S,
    EmailChannel,
    MonitorConfig,
    MonitorConfigError,
    load_monitor_config,
)
from corral.monitor.models import Alert, AlertNotification
from tests.monitor.conftest import WEBHOOK_TOKEN, Mon
from tests.monitor.test_webhook import payload
from tests.oncall.conftest import Inbox as OncallInbox
from tests.oncall.conftest import self_signed_tls, smtp_server
from tests.support import free_port
from tests.webhook_server import WebhookServer, serve_webhook


def email_channel(port: int, timeout: float, **extra: Any) -> EmailChannel:
    """An email channel to a test SMTP server on 127.0.0.1:`port`, mailing ops@example.org."""
    return EmailChannel.model_validate(
        {"name": "mail", "type": "email", "smtp_host": "127.0.0.1", "smtp_port": port,
         "from": "corral@example.org", "to": ["ops@example.org"], "timeout": timeout, **extra}
    )  # fmt: skip


def gpu_hot(**fields: Any) -> Alert:
    """An alert to email (not stored)."""
    return Alert(
        **{"name": "GpuHot", "severity": "critical", "labels": {}, "annotations": {}, "fingerprint": "f",
           "source": "corral", **fields}
    )  # fmt: skip


def long_quit(quits: list[float] | None = None) -> type[Any]:
    """An aiosmtpd SMTP that answers QUIT in 20 lines 0.25 s apart (5 s), noting when it was asked."""
    from aiosmtpd.smtp import SMTP

    class LongQuit(SMTP):
        async def smtp_QUIT(self, arg: str) -> None:
            if quits is not None:
                quits.append(time.monotonic())
            for line in range(20):
                await asyncio.sleep(0.25)
                await self.push(f"221-closing, line {line}")
            await super().smtp_QUIT(arg)

    return LongQuit


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd handler hook
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[int, Inbox]]:
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, inbox
    finally:
        controller.stop()


@pytest.fixture
def hook() -> Iterator[WebhookServer]:
    """Answers 500 until the test switches it to 200."""
    yield from serve_webhook(status=500)


def write_config(mon: Mon, smtp_port: int, hook_url: str) -> None:
    (mon.home / "monitor.yml").write_text(
        f"""
channels:
  - name: ops-email
    type: email
    smtp_host: 127.0.0.1
    smtp_port: {smtp_port}
    from: corral@example.org
    to: [oncall@example.org]
    timeout: 5s
  - name: chat
    type: webhook
    url: {hook_url}
retry:
  initial_backoff: 10s
  max_backoff: 1m
  max_attempts: 3
"""
    )


def notes(mon: Mon, channel: str) -> list[AlertNotification]:
    with mon.factory() as db:
        return list(db.scalars(select(AlertNotification).where(AlertNotification.channel == channel)))


def test_email_and_webhook_delivery_with_retry_and_backoff(
    mon: Mon, smtp: tuple[int, Inbox], hook: WebhookServer
) -> None:
    smtp_port, inbox = smtp
    write_config(mon, smtp_port, hook.url + "/hook")
    config = load_monitor_config(mon.home / "monitor.yml")
    auth = {"Authorization": f"Bearer {WEBHOOK_TOKEN}"}
    with mon.app_client() as client:
        assert client.post("/api/v1/alerts/webhook", json=payload(), headers=auth).status_code == 200
        now = time.time()
        assert deliver_due(mon.factory, config, now) == 1  # the email; the webhook answered 500

        (mail,) = inbox.messages
        assert mail["Subject"].startswith("[FIRING] CorralGpuEccErrors (critical)")
        assert "gpu=0" in mail["Subject"] and mail["To"] == "oncall@example.org"
        assert "GPU 0 on n1 has 3 uncorrectable ECC error(s)" in mail.get_payload()
        (chat,) = notes(mon, "chat")
        assert chat.state == "failing" and chat.attempts == 1 and "HTTP 500" in chat.last_error
        assert chat.next_attempt_at == pytest.approx(now + 10)
        status = {
            c["name"]: c for c in client.get("/api/v1/alerts/channels", headers=mon.admin).json()["items"]
        }
        assert status["chat"]["state"] == "failing" and "HTTP 500" in status["chat"]["last_error"]
        assert status["ops-email"]["state"] == "ok" and status["ops-email"]["sent"] == 1

        # Intake never waits on the broken channel: it contacts no channel at all (delivery is the
        # loop's), shown by what the channels received, not by how long the request took.
        sent_before = (len(hook.posts), len(inbox.messages))
        assert (
            client.post("/api/v1/alerts/webhook", json=payload("resolved"), headers=auth).status_code == 200
        )
        assert (len(hook.posts), len(inbox.messages)) == sent_before

        assert deliver_due(mon.factory, config, now + 1) == 1  # resolved email; chat not due yet
        assert len(hook.bodies) == 2  # chat's firing (failed) + chat's resolved (failed, new row)
        assert deliver_due(mon.factory, config, now + 12) == 0  # second try of the first chat note: 500 again
        failing = sorted(notes(mon, "chat"), key=lambda n: n.id)
        assert failing[0].attempts == 2 and failing[0].next_attempt_at == pytest.approx(now + 12 + 20)

        hook.status = 200
        assert deliver_due(mon.factory, config, now + 60) == 2
        assert {n.state for n in notes(mon, "chat")} == {"sent"}
        assert hook.bodies[-1]["alert"]["name"] == "CorralGpuEccErrors"
        assert {b["status"] for b in hook.bodies[-2:]} == {"firing", "resolved"}
        status = {
            c["name"]: c for c in client.get("/api/v1/alerts/channels", headers=mon.admin).json()["items"]
        }
        assert status["chat"]["state"] == "ok" and status["chat"]["sent"] == 2
    assert [m["Subject"][:10] for m in inbox.messages] == ["[FIRING] C", "[RESOLVED]"]


def test_smtp_down_gives_up_after_max_attempts(mon: Mon, hook: WebhookServer) -> None:
    closed_port = free_port()  # nothing listens there
    write_config(mon, closed_port, hook.url + "/hook")
    config = load_monitor_config(mon.home / "monitor.yml")
    now = time.time()
    with mon.factory() as db:
        record_alert(
            db, labels={"alertname": "X", "node": "n1"}, status="firing", now=now, channels=["ops-email"],
            source="corral",
        )  # fmt: skip
        db.commit()
    for step in range(4):
        deliver_due(mon.factory, config, now + step * 120)
    (note,) = notes(mon, "ops-email")
    assert note.state == "given_up" and note.attempts == 3
    assert f"SMTP 127.0.0.1:{closed_port}" in note.last_error


def test_a_channel_whose_notifications_were_given_up_is_failing_until_one_is_sent(
    mon: Mon, hook: WebhookServer
) -> None:
    """docs/metrics.md: a channel is `failing` while a notification of its is retried or the last
    to settle was given up; it read `ok` (and the metric 0) once all its notifications were given
    up, the moment nothing reached anyone."""
    from tests.monitor.test_metrics import one, scrape

    write_config(mon, free_port(), hook.url + "/hook")  # the webhook answers 500
    config = load_monitor_config(mon.home / "monitor.yml")
    now = time.time()

    def alert(name: str) -> None:
        with mon.factory() as db:
            record_alert(
                db, labels={"alertname": name}, status="firing", now=now, channels=["chat"], source="corral"
            )
            db.commit()

    def chat_state(at: float) -> tuple[str, float]:
        deliver_due(mon.factory, config, at)
        with mon.app_client() as client:
            items = client.get("/api/v1/alerts/channels", headers=mon.admin).json()["items"]
            metric = one(
                scrape(client.get("/metrics").text), "corral_notification_channel_failing", channel="chat"
            )
        return next(c["state"] for c in items if c["name"] == "chat"), metric

    alert("X")
    assert chat_state(now) == ("failing", 1.0)  # retried
    for step in range(1, 3):
        chat_state(now + step * 120)
    assert [n.state for n in notes(mon, "chat")] == ["given_up"]
    assert chat_state(now + 400) == ("failing", 1.0)  # nothing retried any more, nothing delivered
    hook.status = 200
    alert("Y")
    assert chat_state(now + 500) == ("ok", 0.0)  # the next one went out


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("channels:\n  - name: a\n    type: email\n    smtp_host: h\n    to: [x@y]\n", ":2:", "from"),
        ("channels:\n  - name: a\n    type: pager\n", ":3:", "type"),
        ("channels:\n  - name: a\n    type: webhook\n    url: ftp://x\n", ":4:", "url"),
        ("retry:\n  initial_backoff: soon\n", ":2:", "initial_backoff: expected a duration"),
        ("anomaly:\n  window: .inf\n", ":2:", "anomaly.window: a duration must be a finite"),
        ("anomaly:\n  settle: .nan\n", ":2:", "anomaly.settle: a duration must be a finite"),
        ("retry:\n  max_backoff: " + "9" * 400 + "s\n", ":2:", "retry.max_backoff: a duration"),
        ("channels: [\n", ":2:", "not valid YAML"),
        ("idle_gpu:\n  below_percent: 10\n  action: delete\n", ":3:", "idle_gpu.action"),
        ("health:\n  node_lost_after: 1m\n  surprise: 1\n", ":3:", "health.surprise"),
        (
            "channels:\n  - name: a\n    type: email\n    smtp_host: h\n    from: c@x.org\n"
            "    to: [a@x.org]\n    timeout: 0s\n",
            ":7:",  # review112 #2: smtplib refuses a timeout of 0 at every send
            "channels.0.email.timeout: must be more than 0 s",
        ),
        (
            "channels:\n  - name: a\n    type: webhook\n    url: http://x\n    timeout: 0\n",
            ":5:",
            "channels.0.webhook.timeout: must be more than 0 s",
        ),
        (
            "channels:\n  - {name: a, type: webhook, url: 'http://x'}\n  - {name: a, type: webhook, url: 'http://y'}\n",
            ":3:",  # the duplicate's line
            "channels.1.name: two channels are named 'a'",
        ),
    ],
)
def test_invalid_config_names_file_and_line(tmp_path: Path, text: str, where: str, what: str) -> None:
    path = tmp_path / "monitor.yml"
    path.write_text(text)
    with pytest.raises(MonitorConfigError) as info:
        load_monitor_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}{where}"), message
    assert what in message


def test_server_refuses_to_start_with_a_bad_config(mon: Mon) -> None:
    (mon.home / "monitor.yml").write_text("channels:\n  - name: a\n    type: webhook\n    url: nope\n")
    with (
        pytest.raises(MonitorConfigError, match=r"monitor\.yml:4: channels\.0\.webhook\.url"),
        mon.app_client(),
    ):
        pass


def test_real_server_refuses_to_start_with_a_bad_config(tmp_path: Path) -> None:
    from tests.server_fixture import start_server

    home = tmp_path / "home"
    home.mkdir()
    (home / "monitor.yml").write_text(
        "channels:\n  - name: a\n    type: email\n    smtp_host: h\n    smtp_port: 99999\n"
    )
    with pytest.raises(RuntimeError) as info:
        start_server(home, timeout_s=60).stop()
    assert f"{home / 'monitor.yml'}:5: channels.0.email.smtp_port" in str(info.value)


def test_old_delivered_notifications_are_pruned(mon: Mon, hook: WebhookServer) -> None:
    from corral.monitor.channels import KEEP_DONE_S

    hook.status = 200
    write_config(mon, free_port(), hook.url + "/hook")
    config = load_monitor_config(mon.home / "monitor.yml")
    now = time.time()
    with mon.factory() as db:
        record_alert(
            db, labels={"alertname": "Y"}, status="firing", now=now, channels=["chat"], source="corral"
        )
        db.commit()
    assert deliver_due(mon.factory, config, now) == 1
    assert [n.state for n in notes(mon, "chat")] == ["sent"]
    deliver_due(mon.factory, config, now + KEEP_DONE_S - 10)
    assert len(notes(mon, "chat")) == 1
    deliver_due(mon.factory, config, now + KEEP_DONE_S + 10)
    assert notes(mon, "chat") == []


def test_a_failing_webhook_does_not_show_its_url_path() -> None:
    """A chat webhook's URL path is its credential, and a failed delivery's error, which
    `GET /api/v1/alerts/channels` shows every logged-in member, held the whole URL."""
    from corral.monitor.channels import ChannelError, send_webhook
    from corral.monitor.config import WebhookChannel
    from corral.monitor.models import Alert

    port = free_port()  # nothing listens there
    url = f"http://u:pw@127.0.0.1:{port}/services/T0/B0/s3cret?k=v"
    channel = WebhookChannel(name="chat", type="webhook", url=url)
    alert = Alert(
        id=1, fingerprint="f", source="corral", name="CorralGpuLost", status="firing", severity="critical",
        labels={"alertname": "CorralGpuLost"}, annotations={}, starts_at=0.0, ends_at=None,
        first_received_at=0.0, last_received_at=0.0, receive_count=1, generator_url="",
    )  # fmt: skip
    with pytest.raises(ChannelError) as failed:
        send_webhook(channel, alert, "firing")
    error = str(failed.value)
    assert error.startswith(f"POST http://127.0.0.1:{port}/...: "), error
    assert "s3cret" not in error and ":pw@" not in error, error


def test_an_smtp_timeout_that_could_outlast_a_claim_is_refused_with_its_line(tmp_path: Path) -> None:
    # review110 #5: the timeout bounds each SMTP operation; a send claimed at the end of a pass's
    # budget must end before its claim expires, or another server sends the message too
    assert SMTP_SEND_OPERATIONS * SMTP_TIMEOUT_MAX_S <= SENDING_RETRY_S - SEND_BUDGET_S
    path = tmp_path / "monitor.yml"
    channel = (
        "channels:\n  - name: mail\n    type: email\n    smtp_host: h\n    from: c@x.org\n    to: [a@x.org]\n"
    )
    path.write_text(channel + "    timeout: 2m\n")
    said = r"monitor.yml:7: channels.0.email.timeout: 120 s is longer than 20 s"
    with pytest.raises(MonitorConfigError, match=said):
        load_monitor_config(path)
    path.write_text(channel + "    timeout: 20s\n")
    assert load_monitor_config(path).channels[0].timeout == 20.0


def test_an_alert_email_send_ends_at_its_deadline_however_slowly_the_server_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rough14 #2, for alert channels: a server answering a line every 0.25 s (well within the
    1 s timeout of each operation) held the send for its ten lines, 2.5 s; its deadline here is
    one operation's timeout, 1 s."""
    monkeypatch.setattr(config, "SMTP_SEND_OPERATIONS", 1)
    now = time.time()
    with smtp_server(OncallInbox(), line_delay_s=0.25) as slow:
        with pytest.raises(ChannelError, match=r"the send did not end within its 1 s deadline"):
            send_email(email_channel(slow.port, 1), gpu_hot(), "firing")
        assert time.time() - now < 2.5
    assert slow.inbox.messages == []


def test_a_page_and_an_alert_email_go_over_starttls(tmp_path: Path) -> None:
    """review112 #1: open_smtp connected without the host that STARTTLS checks the certificate
    against, and the ssl module refused to start TLS (an empty server_hostname): nothing was sent
    over a `starttls: true` channel. The server here takes no mail before STARTTLS."""
    from corral.monitor.pager import Mailer

    with smtp_server(OncallInbox(), starttls=self_signed_tls(tmp_path)) as server:
        channel = email_channel(server.port, 5, starttls=True)
        send_email(channel, gpu_hot(labels={"node": "n1"}), "firing")
        mailer = Mailer(channel)
        try:
            mailer.send_text("alice@example.org", "[Corral page] disk full", "acknowledge: ...", {})
        finally:
            mailer.close()
        assert [str(m["Subject"]) for m in server.inbox.messages] == [
            "[FIRING] GpuHot (critical) node=n1",
            "[Corral page] disk full",
        ]
        assert server.inbox.to() == ["ops@example.org", "alice@example.org"]


def test_one_alert_notifications_unexpected_error_is_its_own_failure_not_the_pass(
    mon: Mon, smtp: tuple[int, Inbox]
) -> None:
    """review112 #2: deliver_due caught ChannelError only; any other error (here EmailMessage
    refusing a line break in a header) ended the pass, rolled the attempt back and, the
    notification staying first, blocked every one after it on every channel for good. A label
    value's line break (an Alertmanager label) is made a space in the Subject."""
    port, inbox = smtp
    email = {"type": "email", "smtp_host": "127.0.0.1", "smtp_port": port, "from": "c@example.org"}
    config = MonitorConfig.model_validate(
        {"channels": [{**email, "name": "broken", "to": ["a@example.org\nBcc: b@example.org"]},
                      {**email, "name": "mail", "to": ["ops@example.org"]}]}
    )  # fmt: skip
    now = time.time()
    with mon.factory() as db:
        labels = {"alertname": "GpuHot", "instance": "n1\nBcc: evil@example.org"}
        record_alert(
            db, labels=labels, status="firing", now=now, channels=["broken", "mail"], source="corral"
        )
        db.commit()
    assert deliver_due(mon.factory, config, now) == 1
    (broken,) = notes(mon, "broken")
    assert (broken.state, broken.attempts) == ("failing", 1)
    said = "ValueError: Header values may not contain linefeed"
    assert broken.last_error.startswith(said), broken.last_error
    assert [n.state for n in notes(mon, "mail")] == ["sent"]
    (mail,) = inbox.messages
    assert mail["Subject"] == "[FIRING] GpuHot (warning) instance=n1 Bcc: evil@example.org"
    assert mail["Bcc"] is None and mail["To"] == "ops@example.org"


def test_the_pagers_quit_at_the_end_of_a_pass_ends_by_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """review112 #7: Mailer.close()'s QUIT, after a pass's last send, had only the timeout of each
    operation: a server answering QUIT a line every 0.25 s (within the 1 s timeout), 20 lines,
    held the pager's and the job notifier's loop 5 s. Its deadline here is 1 s."""
    from corral.monitor.pager import Mailer

    monkeypatch.setattr(config, "SMTP_SEND_OPERATIONS", 1)
    with smtp_server(OncallInbox(), protocol=long_quit()) as server:
        mailer = Mailer(email_channel(server.port, 1))
        mailer.send_text("alice@example.org", "[Corral page] disk full", "acknowledge: ...", {})
        started = time.monotonic()
        mailer.close()
        assert time.monotonic() - started < 2.5
        assert mailer.smtp is None and len(server.inbox.messages) == 1


def test_a_send_whose_deadline_passed_while_connecting_does_not_wait_for_the_greeting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """review112 #8: the deadline's timer, firing while the address was still being resolved,
    found no socket to shut down, and connect() then read the server's greeting line by line (20
    lines 0.25 s apart, each within the 1 s timeout): 5 s more. A resolver answering in 1.5 s
    here; the deadline is 1 s. The socket is shut down as soon as it is connected."""
    from aiosmtpd.smtp import SMTP

    class LongGreeting(SMTP):
        greeted = False

        async def push(self, status: str) -> None:
            if status.startswith("220 ") and not self.greeted:
                self.greeted = True
                for line in range(20):
                    await asyncio.sleep(0.25)
                    await super().push(f"220-welcome, line {line}")
            await super().push(status)

    resolve = socket.getaddrinfo

    def slow_resolver(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.5)
        return resolve(*args, **kwargs)

    monkeypatch.setattr(config, "SMTP_SEND_OPERATIONS", 1)
    with smtp_server(OncallInbox(), protocol=LongGreeting) as server:
        try:
            monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)
            started = time.monotonic()
            with pytest.raises(ChannelError, match=r"the send did not end within its 1 s deadline"):
                send_email(email_channel(server.port, 1), gpu_hot(), "firing")
            assert time.monotonic() - started < 3.5
        finally:
            monkeypatch.undo()
    assert server.inbox.messages == []


def test_an_alert_whose_stored_fingerprint_holds_a_line_break_is_emailed(smtp: tuple[int, Inbox]) -> None:
    """review113 #2: the fingerprint header was not made one line (the Subject was), so
    EmailMessage refused it and every email of the alert failed (stored before intake refused
    such a fingerprint)."""
    port, inbox = smtp
    send_email(
        email_channel(port, 5), gpu_hot(fingerprint="abc\ndef\u2028x", source="alertmanager"), "firing"
    )
    (mail,) = inbox.messages
    assert mail["X-Corral-Alert-Fingerprint"] == "abc def x"


def test_a_failed_page_send_skips_quit_and_a_quit_waits_one_timeout() -> None:
    """review113 #3: after a failed send Mailer QUIT the connection with a whole send's deadline
    (12 timeouts) before the failure's outcome was stored, so send and QUIT together could
    outlast the message's claim. A failed send closes without QUIT; the QUIT at a pass's end is
    bounded by one timeout (1 s here), not the send's 12 s, against a server answering QUIT a
    line every 0.25 s for 5 s."""
    from corral.monitor.pager import Mailer

    quits: list[float] = []

    class RefusesBob(OncallInbox):
        async def handle_RCPT(
            self, server: Any, session: Any, envelope: Any, address: str, options: Any
        ) -> str:
            if address.startswith("bob@"):
                return "550 no such user"
            envelope.rcpt_tos.append(address)
            return "250 OK"

    with smtp_server(RefusesBob(), protocol=long_quit(quits)) as server:
        mailer = Mailer(email_channel(server.port, 1))
        started = time.monotonic()
        with pytest.raises(ChannelError, match="no such user"):
            mailer.send_text("bob@example.org", "[Corral page] disk full", "acknowledge: ...", {})
        assert mailer.smtp is None and time.monotonic() - started < 1.0
        time.sleep(0.2)
        assert quits == []  # the connection was closed, never QUIT
        mailer.send_text("alice@example.org", "[Corral page] disk full", "acknowledge: ...", {})
        started = time.monotonic()
        mailer.close()
        assert len(quits) == 1 and time.monotonic() - started < 2.0
        assert mailer.smtp is None and server.inbox.to() == ["alice@example.org"]


def test_a_send_deadline_passing_during_the_starttls_handshake_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """review113 #4: STARTTLS detaches the socket the deadline watched and the TLS socket made of
    it is set only once the handshake ends, so the timer firing mid-handshake shut nothing down
    and the handshake ran to its own timeout. A server here greets slowly (1.5 s), offers
    STARTTLS and then never answers the handshake; the deadline (one operation: 3 s) ends it,
    where the handshake's own timeout (3 s more) would have ended it at 4.5 s."""
    monkeypatch.setattr(config, "SMTP_SEND_OPERATIONS", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    ended = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for line in range(6):
                time.sleep(0.25)
                conn.sendall(f"220-welcome, line {line}\r\n".encode())
            conn.sendall(b"220 ready\r\n")
            reader = conn.makefile("rb")
            reader.readline()  # EHLO
            conn.sendall(b"250-localhost\r\n250 STARTTLS\r\n")
            reader.readline()  # STARTTLS
            conn.sendall(b"220 go ahead\r\n")
            while conn.recv(4096):  # the ClientHello, never answered, until the client's end
                pass
        ended.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    channel = email_channel(listener.getsockname()[1], 3, starttls=True)
    started = time.monotonic()
    try:
        with pytest.raises(ChannelError, match=r"the send did not end within its 3 s deadline"):
            send_email(channel, gpu_hot(), "firing")
        assert time.monotonic() - started < 4.0
        assert ended.wait(2.0)  # the connection was ended, not left open
    finally:
        listener.close()


def test_an_alert_email_accepted_is_sent_whatever_the_server_answers_to_quit() -> None:
    """review113 #5: smtplib's `with` raised for a QUIT answered other than 221, after the server
    had accepted the message (250 to its DATA): the notification counted as failed and the alert
    was emailed again at each retry."""
    from aiosmtpd.smtp import SMTP

    class RefusedQuit(SMTP):
        async def smtp_QUIT(self, arg: str) -> None:
            await self.push("451 cannot say goodbye now")
            self.transport.close()

    with smtp_server(OncallInbox(), protocol=RefusedQuit) as server:
        send_email(email_channel(server.port, 5), gpu_hot(), "firing")  # no ChannelError
    assert [str(m["Subject"]) for m in server.inbox.messages] == ["[FIRING] GpuHot (critical)"]
