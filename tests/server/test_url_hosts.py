"""URLs Corral shows with an IPv6 host: `corral up --host ::1` wrote `http://::1:8080` into the CLI
config and its banner (so every workspace URL the CLI prints from it), and a contact's webhook at
`http://[::1]:9000/...` showed in page views and errors as `http://::1:9000/...`: neither parses
as the address it names. IPv6 literals are bracketed (corral.config.url_host)."""

from __future__ import annotations

import socket

import httpx
import pytest

from corral.config import Settings, url_host
from corral.ops.doctor import check_tls
from corral.server.run import PortInUse, bind_listen_socket, local_url
from corral.services.oncall import shown_url


def test_url_host_brackets_ipv6_literals_only() -> None:
    assert url_host("::1") == "[::1]" and url_host("2001:db8::5") == "[2001:db8::5]"
    assert url_host("[::1]") == "[::1]"  # already a URL's form
    assert url_host("127.0.0.1") == "127.0.0.1" and url_host("corral.example.org") == "corral.example.org"


def test_the_servers_own_url_on_an_ipv6_address_parses_to_it() -> None:
    url = local_url(Settings(host="::1", port=8080))
    assert url == "http://[::1]:8080"
    parsed = httpx.URL(url + "/workspaces/alice/nb/lab")  # as `corral ws show` prints from it
    assert (parsed.host, parsed.port) == ("::1", 8080)
    assert local_url(Settings(host="10.0.0.5", port=8080)) == "http://10.0.0.5:8080"


def test_a_served_ipv6_url_is_reachable_as_shown() -> None:
    """The URL the server would show for a socket bound on ::1 reaches that socket."""
    try:
        sock = bind_listen_socket("::1", 0)
    except (PortInUse, OSError) as exc:  # pragma: no cover - a host without IPv6 loopback
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        url = local_url(Settings(host="::1", port=sock.getsockname()[1]))
        parsed = httpx.URL(url)
        with socket.create_connection((parsed.host, parsed.port), timeout=5):
            pass
        with pytest.raises(PortInUse, match=rf"cannot listen on \[::1\]:{parsed.port}: "):
            bind_listen_socket("::1", parsed.port)
    finally:
        sock.close()


def test_a_webhook_contact_on_an_ipv6_host_shows_bracketed_without_its_path() -> None:
    assert shown_url("http://u:pw@[::1]:9000/services/T0/B0/s3cret") == "http://[::1]:9000/..."
    assert shown_url("https://[2001:db8::5]/hook") == "https://[2001:db8::5]/..."
    assert shown_url("https://hooks.slack.com/services/T/B/X") == "https://hooks.slack.com/..."


def test_doctor_names_an_ipv6_listen_address_bracketed() -> None:
    check = check_tls(Settings(host="2001:db8::5", port=8080))
    assert check.status == "warn" and check.detail.startswith("plain HTTP on [2001:db8::5]:8080 ("), check
    assert check.detail.endswith(": tokens cross the network in clear"), check
