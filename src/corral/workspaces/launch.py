"""The workspace job's command (`python -m corral.workspaces.launch`), run inside its sandbox:
JupyterLab with the base URL `/ws/<id>/`, listening only on a Unix socket in the attempt's work
dir (`$CORRAL_WORK_DIR/jupyter.sock`, reached by the server on the host), its root the user's
home. Jupyter's credential comes in `CORRAL_WORKSPACE_TOKEN` (given like a secret, at dispatch)
and is taken out of the environment before anything else starts, so kernels and terminals do not
inherit it."""

from __future__ import annotations

import os
import sys

SOCKET_NAME = "jupyter.sock"
TOKEN_ENV = "CORRAL_WORKSPACE_TOKEN"
BASE_URL_ENV = "CORRAL_WORKSPACE_BASE_URL"


def jupyter_argv(work_dir: str, base_url: str, root_dir: str) -> list[str]:
    return [
        f"--ServerApp.sock={work_dir}/{SOCKET_NAME}",
        "--ServerApp.sock_mode=0600",
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
    argv = jupyter_argv(work_dir, base_url, home)
    if os.geteuid() == 0:  # only on an engine with isolation switched off (jobs run as root)
        argv.append("--ServerApp.allow_root=True")
    LabApp.launch_instance(argv=argv)


if __name__ == "__main__":
    main()
