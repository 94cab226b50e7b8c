"""`corral doctor`'s workspace-origin check (corral.ops.doctor.check_workspace_origin): JupyterLab
on the portal's origin is a warning naming the risk and the setting; a workspace origin behind a
proxy needs CORRAL_PUBLIC_URL (a failure: the server refuses to start without it); a proxy
without CORRAL_WORKSPACE_ORIGIN sends browsers to a port they may not reach (a failure when that
port is the default one: an upgrade of a proxied server; a warning when set explicitly)."""

from __future__ import annotations

import pytest

from corral.config import Settings, parse_origin
from corral.ops.doctor import check_workspace_origin


def test_the_workspace_origin_check_says_what_is_missing() -> None:
    shared = check_workspace_origin(Settings(workspace_port=0), env={})
    assert shared.status == "warn" and "CORRAL_WORKSPACE_PORT=0" in shared.detail, shared
    assert shared.fix is not None and "CORRAL_WORKSPACE_PORT" in shared.fix
    behind = Settings(workspace_origin="https://ws.example.org", workspace_port=8081)
    no_portal = check_workspace_origin(behind, env={})
    assert no_portal.status == "fail" and "CORRAL_PUBLIC_URL is not" in no_portal.detail, no_portal
    same_origin = check_workspace_origin(behind, env={"CORRAL_PUBLIC_URL": "https://WS.example.org/"})
    assert same_origin.status == "fail" and "is the portal's own origin" in same_origin.detail, same_origin
    for portal in ("https://corral.example.org", "http://corral.example.org:8443/corral"):
        same_site = check_workspace_origin(behind, env={"CORRAL_PUBLIC_URL": portal})
        assert same_site.status == "warn" and "the same site as the portal" in same_site.detail, portal
        assert same_site.fix is not None and "another registrable domain" in same_site.fix
    apart = Settings(workspace_origin="https://corral-ws.example.net", workspace_port=8081)
    configured = check_workspace_origin(apart, env={"CORRAL_PUBLIC_URL": "https://corral.example.org"})
    assert (configured.status, configured.detail) == (
        "ok",
        "workspaces on their own origin: https://corral-ws.example.net",
    )
    upgraded = check_workspace_origin(Settings(forwarded_allow_ips="127.0.0.1"), env={})
    assert upgraded.status == "fail" and "the proxy does not serve" in upgraded.detail, upgraded
    proxied = check_workspace_origin(Settings(forwarded_allow_ips="127.0.0.1", workspace_port=8081), env={})
    assert proxied.status == "warn" and "port 8081" in proxied.detail, proxied
    assert proxied.fix is not None and "CORRAL_WORKSPACE_ORIGIN" in proxied.fix
    plain = check_workspace_origin(Settings(port=9000), env={})  # one host name, two ports: one site
    assert plain.status == "warn" and plain.detail.startswith(
        "workspaces on their own origin (the portal's host name, port 9001), but the same site as the portal"
    ), plain


def test_a_workspace_origin_on_the_portals_host_name_over_https_fails() -> None:
    """The server refuses to start with it (corral.config.workspace_origin_problem): script in a
    workspace could set the portal's `__Host-` session cookie (cookies are not kept apart by port)."""
    behind = Settings(workspace_origin="https://ws.example.org", workspace_port=8081)
    for portal in ("http://ws.example.org:8443/corral", "https://WS.example.org.:8443"):
        same_host = check_workspace_origin(behind, env={"CORRAL_PUBLIC_URL": portal})
        assert same_host.status == "fail" and "is on the portal's host name" in same_host.detail, portal
    derived = check_workspace_origin(
        Settings(port=9000), env={"CORRAL_PUBLIC_URL": "https://corral.example.org"}
    )
    assert derived.status == "fail" and derived.detail.startswith(
        "the workspace origin (without CORRAL_WORKSPACE_ORIGIN: https://corral.example.org:9001) is on "
        "the portal's host name (https://corral.example.org) over https"
    ), derived
    plain = Settings(port=9000, workspace_origin="http://127.0.0.1:9001")
    demo_like = check_workspace_origin(plain, env={"CORRAL_PUBLIC_URL": "http://127.0.0.1:9000"})
    assert demo_like.status == "warn" and "the same site as the portal" in demo_like.detail, demo_like


def test_corrals_own_tls_makes_the_portal_https_whatever_the_public_urls_scheme() -> None:
    """review126 #1: with --ssl-certfile the portal and the derived workspace origin are https (the
    listener derives https://<Host>:<workspace port>, the portal sets `__Host-corral_session`),
    even when CORRAL_PUBLIC_URL says http: the same host name over https, refused."""
    tls = Settings(ssl_certfile="cert.pem", ssl_keyfile="key.pem", host="0.0.0.0")
    own_tls = check_workspace_origin(tls, env={"CORRAL_PUBLIC_URL": "http://corral.example.org:8080"})
    assert own_tls.status == "fail" and own_tls.detail.startswith(
        "the workspace origin (without CORRAL_WORKSPACE_ORIGIN: https://corral.example.org:8081) is on "
        "the portal's host name (https://corral.example.org:8080) over https"
    ), own_tls


def test_a_public_url_that_is_no_url_fails() -> None:
    """review126 #3: `corral.example.org` (no scheme) counted as set but has no origin, so the
    same-host check fell back to the bind address and passed; refused, naming the form expected."""
    # (`https://[::1`, `http://[x]`: urlsplit's own ValueError, once "a check crashed", review127 #1)
    for text in (
        "corral.example.org",
        "corral.example.org:8080",
        "ftp://corral.example.org",
        "https://[::1",
        "http://[x]",
    ):
        for settings in (Settings(port=9000), Settings(port=9000, workspace_port=0)):
            check = check_workspace_origin(settings, env={"CORRAL_PUBLIC_URL": text})
            assert check.status == "fail" and check.detail.startswith(
                f"CORRAL_PUBLIC_URL={text} is not a URL: give the portal's address as people reach it, "
                "https://host[:port]"
            ), (text, check)


def test_host_names_are_compared_as_browsers_read_them() -> None:
    """review126 #4: one host written two ways ([0:0:0:0:0:0:0:1] and [::1], 127.1 and 2130706433
    and 127.0.0.1, an IDN and its punycode, %2E for a dot) was two hosts to a textual comparison."""
    for workspace, portal in (
        ("https://[0:0:0:0:0:0:0:1]:8081", "https://[::1]:8443"),
        ("https://127.1:8081", "https://127.0.0.1:8443"),
        ("https://2130706433:8081", "https://127.0.0.1:8443"),
        ("https://0x7f.0.0.1:8081", "https://127.0.0.1:8443"),
        ("https://xn--bcher-kva.example:8081", "https://BÜCHER.example:8443"),
        ("https://corral%2Eexample.org:8081", "https://corral.example.org:8443"),
        ("https://xn--fa-hia.de:8081", "https://faß.de:8443"),  # review127 #3: UTS #46, as browsers
    ):
        behind = Settings(workspace_origin=workspace, workspace_port=8081)
        check = check_workspace_origin(behind, env={"CORRAL_PUBLIC_URL": portal})
        assert check.status == "fail" and "is on the portal's host name" in check.detail, (workspace, check)
    apart = Settings(workspace_origin="https://127.0.0.2:8081", workspace_port=8081)
    check = check_workspace_origin(apart, env={"CORRAL_PUBLIC_URL": "https://127.1:8443"})
    assert "is on the portal's host name" not in check.detail, check
    # (IDNA 2003 mapped faß.de to fass.de: another host to a browser, review127 #3)
    apart = Settings(workspace_origin="https://fass.de:8081", workspace_port=8081)
    check = check_workspace_origin(apart, env={"CORRAL_PUBLIC_URL": "https://faß.de:8443"})
    assert "is on the portal's host name" not in check.detail, check


def test_a_workspace_origin_with_a_unicode_host_name_is_kept_as_browsers_send_it() -> None:
    """review128 #5: browsers send an Origin's name in its IDNA form; kept as written, every
    cookie-authenticated write on the workspace listener was refused as cross-origin."""
    assert parse_origin("https://Bücher.example:8081", "CORRAL_WORKSPACE_ORIGIN") == (
        "https://xn--bcher-kva.example:8081"
    )
    with pytest.raises(ValueError, match=r"CORRAL_WORKSPACE_ORIGIN: .* no valid IDNA name"):
        parse_origin("https://a\u200db.example", "CORRAL_WORKSPACE_ORIGIN")
