"""The workspace job's command (`python -m corral.workspaces.launch`), run inside its sandbox:
JupyterLab with the base URL `/ws/<id>/`, its root the user's home, listening where the server
reaches it and nowhere else:

- local engine: only on a Unix socket in the attempt's work dir (`$CORRAL_WORK_DIR/jupyter.sock`,
  reached by the server on the same host);
- `CORRAL_WORKSPACE_LISTEN=tcp` (the Slurm engine: the server is on another host): on the node's
  own address (`CORRAL_HOST`, the address Slurm gives the node) and a free port, with TLS only,
  under a key and self-signed certificate made fresh for this start (corral.workspaces.labtls);
  the port and the certificate's SHA-256 go to `$CORRAL_WORK_DIR/jupyter.endpoint` (the job dir
  on shared storage, read by the server, which talks to that port only over TLS with that
  certificate: another process on the node holding the port gets no request).

Jupyter's credential comes in `CORRAL_WORKSPACE_TOKEN` (given like a secret, at dispatch) and is
taken out of the environment before anything else starts, so kernels and terminals do not
inherit it."""

from __future__ import annotations

import os
import socket
import sys

SOCKET_NAME = "jupyter.sock"
ENDPOINT_NAME = "jupyter.endpoint"  # TCP listening: "<port> <certificate's sha256>", by the launcher
TOKEN_ENV = "CORRAL_WORKSPACE_TOKEN"
BASE_URL_ENV = "CORRAL_WORKSPACE_BASE_URL"
LISTEN_ENV = "CORRAL_WORKSPACE_LISTEN"  # "tcp": on the node's address; else the Unix socket


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listen_argv(work_dir: str) -> list[str]:
    """Where JupyterLab listens. TCP: with TLS under a fresh key (labtls.make_certificate), the port
    and the certificate's fingerprint going to the endpoint file first (written whole, by rename).
    Should another process take the port meanwhile, it cannot pass for JupyterLab (the server
    checks the certificate before sending anything), and JupyterLab fails to start
    (port_retries=0): the workspace job ends, rather than listening somewhere unreported."""
    if os.environ.get(LISTEN_ENV) != "tcp":
        return [f"--ServerApp.sock={work_dir}/{SOCKET_NAME}", "--ServerApp.sock_mode=0600"]
    from corral.workspaces.labtls import make_certificate

    host = os.environ.get("CORRAL_HOST") or "127.0.0.1"
    try:
        cert, key, fingerprint = make_certificate()
    except (RuntimeError, OSError) as exc:
        sys.exit(f"workspace: {exc}")
    port = free_port(host)
    tmp = f"{work_dir}/.{ENDPOINT_NAME}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{port} {fingerprint}\n")
    os.replace(tmp, f"{work_dir}/{ENDPOINT_NAME}")
    return [
        f"--ServerApp.ip={host}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.certfile={cert}",
        f"--ServerApp.keyfile={key}",
    ]


def jupyter_argv(listen: list[str], base_url: str, root_dir: str) -> list[str]:
    return [
        *listen,
        f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.identity_provider_class=corral.workspaces.jupyter_auth.CorralIdentityProvider",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        "--ServerApp.allow_remote_access=True",
        "--ServerApp.open_browser=False",
        "--ServerApp.quit_button=False",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # No installing extensions from a workspace (the sandbox has no way out to PyPI anyway).
        "--LabApp.extension_manager=readonly",
        "--ServerApp.terminado_settings={'shell_command': ['/bin/bash']}",
    ]


def skip_yarn_config() -> None:
    """JupyterLab computes its version at import, and with it asks yarn (a node process) for the
    npm registry: 1.3 s of a 4 s start-up on this machine. The registry serves only extension
    installs and builds, which a workspace never does (the extension manager is read-only);
    the answer JupyterLab itself uses when node is absent takes its place."""
    import jupyterlab.commands

    jupyterlab.commands._yarn_config = lambda logger: {"yarn config": {}, "npm config": {}}


def main() -> None:
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        sys.exit(f"{TOKEN_ENV} is not set: a workspace's JupyterLab starts only from a Corral workspace")
    work_dir = os.environ.get("CORRAL_WORK_DIR", os.getcwd())
    home = os.environ.get("HOME", work_dir)
    # Jupyter's runtime files (kernel connection files) in the attempt's private dir, not the home.
    os.environ["JUPYTER_RUNTIME_DIR"] = f"{work_dir}/jupyter-runtime"
    os.environ.setdefault("SHELL", "/bin/bash")
    # jsonschema's optional IRI format checker builds a large Lark grammar at import: 20 s on one
    # CPU in a fresh sandbox (its cache lives in /tmp, a new tmpfs at every start). Jupyter's event
    # schemas do not need it; without the module jsonschema simply skips that format.
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
    skip_yarn_config()
    from corral.workspaces.jupyter_auth import CorralIdentityProvider

    CorralIdentityProvider.secret = token
    from jupyterlab.labapp import LabApp

    base_url = os.environ.get(BASE_URL_ENV, "/")
    argv = jupyter_argv(listen_argv(work_dir), base_url, home)
    if os.geteuid() == 0:  # only on an engine with isolation switched off (jobs run as root)
        argv.append("--ServerApp.allow_root=True")
    LabApp.launch_instance(argv=argv)


if __name__ == "__main__":
    main()
