"""Entry point of the `corral` command. Areas add their commands through `register(app)` in
their own module so no one file grows with every feature."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="corral",
    help="Corral: queue, schedule, run and observe deep-learning jobs on a shared GPU cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# Modules that contribute commands; each exposes register(app: typer.Typer) -> None.
COMMAND_MODULES = (
    "corral.cli.platform",  # up, submit, ls, show, why, logs, cancel, node, group, user, token
    "corral.cli.sim",  # sim, sim compare
    "corral.cli.monitor",  # alert, chaos
    "corral.cli.usage",  # usage
    "corral.cli.security",  # auth lockouts/unlock/sessions/end-session
    "corral.cli.admin",  # admin backup/restore/migrate, doctor
    "corral.cli.storage",  # job outputs
    "corral.cli.audit",  # audit ls
    "corral.cli.secrets",  # secret set/ls/rm
    "corral.cli.data",  # data push/pull/ls/show/versions/rm/share/import, storage usage/quota
    "corral.cli.sandbox",  # exec, port-forward, key add/ls/rm
    "corral.cli.environments",  # env ls/show/create/rm
    "corral.cli.catalog",  # template ls/show/use/publish, model ls/show/register/promote/...
    "corral.cli.oncall",  # oncall now/schedule/policy/page/pages/ack/contact
    "corral.cli.workspaces",  # ws create/ls/show/open/ssh/stop/start/rm/policy
    "corral.cli.incidents",  # incident ls/show/ack/comment/mitigate/resolve/close/postmortem, rules
)


@app.command()
def version() -> None:
    """Print Corral's version."""
    from corral import __version__

    typer.echo(__version__)


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
