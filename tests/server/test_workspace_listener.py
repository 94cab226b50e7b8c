"""The server process's workspace listener (CORRAL_WORKSPACE_PORT; corral.workspaces.origin): one
uvicorn serving two sockets, told apart by the port a request came in on. The portal's port serves
the API and hands `/ws/` over; the workspace port serves nothing of the API or the portal. A
workspace port already taken refuses start-up in one line, as the portal's does."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.server_fixture import start_server
from tests.server_harness import free_port, server_env


def test_the_workspace_port_serves_no_api_and_the_portal_hands_ws_over() -> None:
    ws_port = free_port()
    srv = start_server(extra_env={"CORRAL_WORKSPACE_PORT": str(ws_port)})
    try:
        assert f"Workspaces: JupyterLab on their own origin, http://127.0.0.1:{ws_port};" in srv.log_text()
        with srv.client() as portal:
            assert portal.get("/api/v1/me").status_code == 200
            token = portal.headers["authorization"]
            sent = portal.get("/ws/1/lab", follow_redirects=False)
        lab = httpx.Client(
            base_url=f"http://127.0.0.1:{ws_port}", headers={"authorization": token}, timeout=10
        )
        with lab:
            for path in ("/api/v1/me", "/api/v1/jobs", "/", "/workspaces", "/healthz", "/docs"):
                r = lab.get(path)
                assert r.status_code == 404, (path, r.status_code, r.text)
                assert r.text.startswith("this address serves workspaces only"), (path, r.text)
            # The proxy is there: no workspace 1, answered as the portal answered it before.
            missing = lab.get("/ws/1/lab")
            assert missing.status_code == 404 and missing.json() == {"detail": "there is no workspace 1"}
        assert sent.status_code == 404, sent.text  # the same decision on the portal: no workspace 1
    finally:
        srv.stop()


def test_a_workspace_port_in_use_refuses_start_up_naming_the_setting(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port, ws_port = free_port(), free_port()
    taken = socket.socket()
    taken.bind(("127.0.0.1", ws_port))
    taken.listen(1)
    env = server_env(
        home, database_url=None, virtual_gpus=1, extra_env={"CORRAL_WORKSPACE_PORT": str(ws_port)}
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "corral.server", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        taken.close()
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{ws_port}: the address is already in use" in done.stderr
    assert "pick another port with CORRAL_WORKSPACE_PORT. Nothing was written." in done.stderr
    assert not (home / "corral.db").exists()


def _start_up_refused(
    tmp_path: Path, extra_env: dict[str, str], port: int | None = None, unset: tuple[str, ...] = ()
) -> str:
    """The server started with `extra_env` (without CORRAL_PUBLIC_URL unless given, nor the
    settings in `unset`): it exits 1 having written nothing; its stderr."""
    home = tmp_path / "home"
    env = server_env(home, database_url=None, virtual_gpus=1, extra_env=extra_env)
    for name in unset:
        env.pop(name, None)
    if "CORRAL_PUBLIC_URL" not in extra_env:
        env.pop("CORRAL_PUBLIC_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "corral.server", "--host", "127.0.0.1", "--port", str(port or free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert not (home / "corral.db").exists()
    return done.stderr


def test_a_workspace_origin_without_the_portals_public_url_refuses_start_up(tmp_path: Path) -> None:
    """Else the server's own default for CORRAL_PUBLIC_URL (its local, often loopback, address)
    is where the workspace listener would send every browser back to."""
    stderr = _start_up_refused(
        tmp_path,
        {"CORRAL_WORKSPACE_PORT": str(free_port()), "CORRAL_WORKSPACE_ORIGIN": "https://ws.example.net"},
    )
    assert stderr.strip().splitlines()[-1] == (
        "error: CORRAL_WORKSPACE_ORIGIN=https://ws.example.net is set but CORRAL_PUBLIC_URL is not: the "
        "workspace listener sends browsers back to the portal there; set CORRAL_PUBLIC_URL to the portal's "
        "address as people reach it. Nothing was written."
    ), stderr


def test_a_workspace_origin_that_is_the_portals_own_refuses_start_up(tmp_path: Path) -> None:
    """A path-based proxy layout (`location /ws/` on the portal's server name) would put
    JupyterLab back on the portal's origin while every check said otherwise."""
    stderr = _start_up_refused(
        tmp_path,
        {
            "CORRAL_WORKSPACE_PORT": str(free_port()),
            "CORRAL_WORKSPACE_ORIGIN": "https://corral.example.org",
            "CORRAL_PUBLIC_URL": "https://Corral.example.org:443/",
        },
    )
    assert stderr.strip().splitlines()[-1] == (
        "error: CORRAL_WORKSPACE_ORIGIN=https://corral.example.org is the portal's own origin "
        "(CORRAL_PUBLIC_URL): JupyterLab would be back on it; give workspaces a host name of their own, "
        "best on another registrable domain. Nothing was written."
    ), stderr


def test_the_port_option_goes_through_the_settings_checks(tmp_path: Path) -> None:
    """`--port` is validated with the environment, as CORRAL_PORT is: 65535 leaves no next port
    for the workspace listener, and a workspace port equal to the portal's is refused."""
    stderr = _start_up_refused(tmp_path, {}, port=65535, unset=("CORRAL_WORKSPACE_PORT",))
    assert stderr.strip().splitlines()[-1] == (
        "error: CORRAL_PORT=65535 leaves no next port for the workspace listener (its default, the "
        "portal's port + 1): set CORRAL_WORKSPACE_PORT to a free port (or 0 to serve workspaces on the "
        "portal's origin). Nothing was written."
    ), stderr
    port = free_port()
    stderr = _start_up_refused(tmp_path, {"CORRAL_WORKSPACE_PORT": str(port)}, port=port)
    assert stderr.strip().splitlines()[-1] == (
        f"error: CORRAL_WORKSPACE_PORT={port} is the portal's own port (CORRAL_PORT): workspaces need "
        "another port (or 0 to serve them on the portal's origin). Nothing was written."
    ), stderr


def test_an_upgrade_behind_a_proxy_without_a_workspace_origin_refuses_start_up(tmp_path: Path) -> None:
    """review118 #1: a server behind a reverse proxy (CORRAL_FORWARDED_ALLOW_IPS) upgraded without
    CORRAL_WORKSPACE_ORIGIN would send browsers to the portal's host name on port + 1, which the
    proxy does not serve; it refuses to start saying what to set."""
    port = free_port()
    stderr = _start_up_refused(
        tmp_path, {"CORRAL_FORWARDED_ALLOW_IPS": "127.0.0.1"}, port=port, unset=("CORRAL_WORKSPACE_PORT",)
    )
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: CORRAL_FORWARDED_ALLOW_IPS says a reverse proxy stands in front of this server, but "
        "CORRAL_WORKSPACE_ORIGIN is not set: workspaces would be sent to the portal's host name on "
        f"port {port + 1}"
    ), stderr
    assert last.endswith("Nothing was written."), stderr


def test_a_workspace_origin_on_the_portals_host_name_over_https_refuses_start_up(tmp_path: Path) -> None:
    """Browsers keep cookies apart by host, not by port: script served by a JupyterLab on the
    portal's host name (another port) over https could set `__Host-corral_session` for the portal.
    Refused whether the workspace origin is configured, or derived (the portal's host name on the
    workspace port) with the portal's CORRAL_PUBLIC_URL https or Corral serving TLS itself."""
    configured = _start_up_refused(
        tmp_path,
        {
            "CORRAL_WORKSPACE_PORT": str(free_port()),
            "CORRAL_WORKSPACE_ORIGIN": "https://corral.example.org:8443",
            "CORRAL_PUBLIC_URL": "https://Corral.example.org/",
        },
    )
    assert configured.strip().splitlines()[-1] == (
        "error: the workspace origin (CORRAL_WORKSPACE_ORIGIN=https://corral.example.org:8443) is on the "
        "portal's host name (https://corral.example.org) over https: browsers do not keep cookies apart "
        "by port, so script in a workspace could set the portal's session cookie (__Host-corral_session "
        "included); give workspaces a host name of their own behind the reverse proxy, e.g. "
        "CORRAL_WORKSPACE_ORIGIN=https://ws.example.org, best on another registrable domain "
        "(docs/security.md, 'Workspaces on their own origin'). Nothing was written."
    ), configured
    ws_port = free_port()
    derived = _start_up_refused(
        tmp_path,
        {"CORRAL_WORKSPACE_PORT": str(ws_port), "CORRAL_PUBLIC_URL": "https://corral.example.org"},
    )
    derived_line = derived.strip().splitlines()[-1]
    assert derived_line.startswith(
        "error: the workspace origin (without CORRAL_WORKSPACE_ORIGIN: "
        f"https://corral.example.org:{ws_port}) is on the portal's host name "
        "(https://corral.example.org) over https: "
    ), derived
    # Corral's own TLS, no CORRAL_PUBLIC_URL: the portal's listen address, refused before the
    # certificate is even read (none is there)
    port = free_port()
    tls = {"CORRAL_SSL_CERTFILE": str(tmp_path / "cert.pem"), "CORRAL_SSL_KEYFILE": str(tmp_path / "key.pem")}
    own_tls = _start_up_refused(tmp_path, {"CORRAL_WORKSPACE_PORT": str(ws_port), **tls}, port=port)
    own_tls_line = own_tls.strip().splitlines()[-1]
    assert own_tls_line.startswith(
        f"error: the workspace origin (without CORRAL_WORKSPACE_ORIGIN: https://127.0.0.1:{ws_port}) "
        f"is on the portal's host name (https://127.0.0.1:{port}) over https: "
    ), own_tls
    # the workspace origin https, the portal plain http: the same host name all the same
    mixed = _start_up_refused(
        tmp_path,
        {
            "CORRAL_WORKSPACE_PORT": str(ws_port),
            "CORRAL_WORKSPACE_ORIGIN": "https://corral.example.org.:8443",
            "CORRAL_PUBLIC_URL": "http://corral.example.org:8080",
        },
    )
    assert "is on the portal's host name (http://corral.example.org:8080) over https" in mixed, mixed


def test_own_tls_with_a_plain_http_public_url_or_a_public_url_that_is_no_url_refuses_start_up(
    tmp_path: Path,
) -> None:
    """review126 #1: Corral's own TLS makes the portal https whatever CORRAL_PUBLIC_URL's scheme;
    #3: a CORRAL_PUBLIC_URL without a scheme is no URL, refused rather than read as unset."""
    ws_port = free_port()
    tls = {"CORRAL_SSL_CERTFILE": str(tmp_path / "cert.pem"), "CORRAL_SSL_KEYFILE": str(tmp_path / "key.pem")}
    public = {"CORRAL_PUBLIC_URL": "http://corral.example.org:8080"}
    own_tls = _start_up_refused(tmp_path, {"CORRAL_WORKSPACE_PORT": str(ws_port), **tls, **public})
    assert (
        own_tls.strip()
        .splitlines()[-1]
        .startswith(
            "error: the workspace origin (without CORRAL_WORKSPACE_ORIGIN: "
            f"https://corral.example.org:{ws_port}) is on the portal's host name "
            "(https://corral.example.org:8080) over https: "
        )
    ), own_tls
    no_url = _start_up_refused(tmp_path, {"CORRAL_PUBLIC_URL": "corral.example.org"})
    assert no_url.strip().splitlines()[-1] == (
        "error: CORRAL_PUBLIC_URL=corral.example.org is not a URL: give the portal's address as people "
        "reach it, https://host[:port] (or http:// for a plain-http test cluster). Nothing was written."
    ), no_url
    bracket = _start_up_refused(tmp_path, {"CORRAL_PUBLIC_URL": "https://[::1"})  # review127 #1
    assert bracket.strip().splitlines()[-1] == (
        "error: CORRAL_PUBLIC_URL=https://[::1 is not a URL: give the portal's address as people "
        "reach it, https://host[:port] (or http:// for a plain-http test cluster). Nothing was written."
    ), bracket


def test_a_workspace_origin_on_the_portals_host_name_over_plain_http_off_loopback_is_a_warning() -> None:
    """Plain http off loopback: served (a test cluster on a LAN; anyone on the network path can
    set a plain-http cookie anyway), with a warning in the log saying what to do; on loopback
    (the demo, the other tests here) nothing is said."""
    ws_port = free_port()
    public = f"http://gpu-box.example.org:{free_port()}"
    srv = start_server(extra_env={"CORRAL_WORKSPACE_PORT": str(ws_port), "CORRAL_PUBLIC_URL": public})
    try:
        assert (
            f"workspaces are served at http://gpu-box.example.org:{ws_port}, the portal's host name "
            f"({public}) over plain http: script in a workspace can set cookies the portal reads"
        ) in srv.log_text(), srv.log_text()
    finally:
        srv.stop()
    srv = start_server(extra_env={"CORRAL_WORKSPACE_PORT": str(free_port())})
    try:
        assert "over plain http: script in a workspace" not in srv.log_text()
    finally:
        srv.stop()
