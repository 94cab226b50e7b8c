"""A person's webhook is POSTed to the very address the guard checked (corral.services.
webhook_guard), not to whatever the name resolves to when httpx connects: the connection goes to
the checked IP while the Host header and TLS (SNI and certificate check) keep the name. Against a
real HTTPS receiver on 127.0.0.1 whose certificate names only `localhost`."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral.db.oncall_models import Page, PageNotification
from corral.monitor import pager
from corral.monitor.pager import ChannelError, Outgoing, post_webhook
from corral.services import webhook_guard

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


@pytest.fixture
def tls_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[Any]]]:
    cert_file, key_file = _certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # httpx trusts it (trust_env)
    received: list[Any] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.headers["Host"], self.path, body["event"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], received
    finally:
        server.shutdown()
        server.server_close()


def _outgoing(address: str) -> Outgoing:
    note = PageNotification(kind="webhook", address=address, round=0, step=0)
    page = Page(id=1, key="k", subject="s", body="b", policy_name="p", state="triggered", created_at=0.0)
    return Outgoing(note, page, "alice", "http://corral.test/api/v1/ack/x", 0.0)


def test_an_https_webhook_goes_to_the_checked_address_with_its_name_for_host_and_tls(
    tls_receiver: tuple[int, list[Any]],
) -> None:
    port, received = tls_receiver
    post_webhook(_outgoing(f"https://localhost:{port}/hook"), LOOPBACK)
    assert received == [(f"localhost:{port}", "/hook", "page")]
    # Without the admin's allowance, loopback is refused before any connection.
    with pytest.raises(ChannelError, match=r"localhost \(127\.0\.0\.1\) is a loopback address"):
        post_webhook(_outgoing(f"https://localhost:{port}/again"), ())
    # The certificate names localhost only: an address in the URL is checked against it (no name
    # to send), and fails, so the name, not the address, is what TLS checked above.
    with pytest.raises(ChannelError, match="CERTIFICATE_VERIFY_FAILED"):
        post_webhook(_outgoing(f"https://127.0.0.1:{port}/by-address"), LOOPBACK)
    assert len(received) == 1


def test_the_next_checked_address_is_tried_when_one_refuses_the_connection(
    tls_receiver: tuple[int, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name with several addresses (one AAAA without a route, one A record down): the POST
    goes to the first that takes the connection, as a connection to the name would (review105)."""
    port, received = tls_receiver
    closed = ipaddress.ip_address("127.0.0.2")  # nothing listens there on that port
    monkeypatch.setattr(
        webhook_guard, "resolve", lambda host, port: [closed, ipaddress.ip_address("127.0.0.1")]
    )
    post_webhook(_outgoing(f"https://localhost:{port}/hook"), LOOPBACK)
    assert received == [(f"localhost:{port}", "/hook", "page")]


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("64:ff9b::a00:5", "private or reserved"),  # NAT64 of 10.0.0.5
        ("2002:a00:5::", "private or reserved"),  # 6to4 of 10.0.0.5
        ("::7f00:1", "loopback"),  # IPv4-compatible 127.0.0.1
        ("::ffff:169.254.169.254", "link-local"),  # IPv4-mapped metadata address
        ("64:ff9b::808:808", None),  # NAT64 of a public address
    ],
)
def test_an_ipv6_address_that_leads_to_an_ipv4_one_is_judged_by_it(address: str, kind: str | None) -> None:
    ip = ipaddress.ip_address(address)
    if kind is None:
        webhook_guard.check_ip(address, ip, ())
    else:
        with pytest.raises(webhook_guard.WebhookRefused, match=f"is a {kind} address"):
            webhook_guard.check_ip(address, ip, ())


def test_a_receiver_that_drips_its_answer_is_given_up_at_the_whole_posts_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx's timeout is per read: a receiver answering a byte a second (under the 10 s read
    timeout) held a send open for ever, and every message behind it, past the message's claim
    (review108 #3). The whole POST has a deadline (pager.WEBHOOK_DEADLINE_S)."""
    monkeypatch.setattr(pager, "WEBHOOK_DEADLINE_S", 2.0)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100:
                if stop.wait(0.5):
                    return
                conn.sendall(bytes([byte]))

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(ChannelError, match=r"no complete answer within 2 s"):
            post_webhook(_outgoing(f"http://localhost:{listener.getsockname()[1]}/hook"), LOOPBACK)
    finally:
        stop.set()
        thread.join(5)
        listener.close()
    assert time.monotonic() - started < 5
