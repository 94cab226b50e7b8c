"""`corral up`, and the registration of the platform's core commands in the order `corral --help`
lists them: up; the job commands (cli/jobs.py); node, group, user and token (cli/nodes.py,
cli/groups.py, cli/accounts.py).

The helpers every command module shares live in cli/common.py (import them from there); they are
re-exported here for code that imported them from this module. The command apps and their own
helpers (node_app, group_app, user_app, token_app, ...) are only in their new modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli import accounts, groups, jobs, nodes
from corral.cli.common import (
    Output,
    OutputOpt,
    ago,
    client,
    err,
    error_line,
    friendly_errors,
    out,
    print_json,
    when,
)
from corral.config import settings_error

__all__ = [
    "Output",
    "OutputOpt",
    "ago",
    "client",
    "err",
    "friendly_errors",
    "out",
    "print_json",
    "register",
    "up",
    "when",
]


def up(
    demo: Annotated[
        bool, typer.Option("--demo", help="demo users, groups and an example training job")
    ] = False,
    host: Annotated[str | None, typer.Option(help="listen address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port (default 8080)")] = None,
    workspace_port: Annotated[
        int | None,
        typer.Option(
            help="port of the workspaces' own origin, where JupyterLab is served "
            "(default: --port + 1; 0: on the portal's origin, a known risk: docs/security.md)"
        ),
    ] = None,
    virtual_gpus: Annotated[int | None, typer.Option(help="declare N virtual GPUs instead of NVML")] = None,
    gpu_model: Annotated[str | None, typer.Option(help="model name of the virtual GPUs")] = None,
    database_url: Annotated[str | None, typer.Option(help="default: SQLite under $CORRAL_HOME")] = None,
    ssl_certfile: Annotated[
        Path | None,
        typer.Option(
            help="serve HTTPS with this PEM certificate (the workspace listener then needs a host name "
            "other than the portal's, CORRAL_WORKSPACE_ORIGIN with CORRAL_PUBLIC_URL: docs/deploy.md)"
        ),
    ] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="the certificate's private key (PEM)")] = None,
) -> None:
    """Start the Corral server (API, control loops and the engine: local by default, CORRAL_ENGINE=slurm)."""
    from corral.config import Settings

    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "workspace_port": workspace_port,
            "virtual_gpus": virtual_gpus,
            "gpu_model": gpu_model,
            "database_url": database_url,
            "ssl_certfile": ssl_certfile,
            "ssl_keyfile": ssl_keyfile,
        }.items()
        if v is not None
    }
    try:
        settings = Settings(**overrides)
    except ValueError as exc:  # pydantic's ValidationError: name the setting, no traceback
        error_line(settings_error(exc))
        raise typer.Exit(2) from None
    from corral.server.run import serve  # lazy: the CLI must not import the server to run `ls`

    serve(settings, demo=demo)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the root `corral` app."""
    app.command()(up)
    jobs.register(app)
    nodes.register(app)
    groups.register(app)
    accounts.register(app)
