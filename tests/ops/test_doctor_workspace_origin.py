"""`corral doctor`'s workspace-origin check (corral.ops.doctor.check_workspace_origin): JupyterLab
on the portal's origin is a warning naming the risk and the setting; a workspace origin behind a
proxy needs CORRAL_PUBLIC_URL (a failure: the server refuses to start without it); a proxy
without CORRAL_WORKSPACE_ORIGIN sends browsers to a port they may not reach (a failure when that
port is the default one: an upgrade of a proxied server; a warning when set explicitly)."""

from __future__ import annotations

from corral.config import Settings
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
    for portal in ("https://corral.example.org", "http://ws.example.org:8443/corral"):
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
