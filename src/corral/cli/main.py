"""Entry point of the `corral` command. Areas add their commands through `register(app)` in
their own module so no one file grows with every feature."""

from __future__ import annotations

import importlib
import inspect

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


def one_line_paragraphs(text: str) -> str:
    """A docstring's paragraphs each as one line. Typer's Rich help keeps a docstring's line
    breaks inside a paragraph, so `--help` broke sentences where the source did ("its place in the
    scheduler's order, its" / "estimated start ..."); the terminal's width now decides. A
    paragraph marked with Click's \\b (printed as written: an example) keeps its lines."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.split("\n")) for p in paragraphs
    )


def _reflow_helps(typer_app: typer.Typer) -> None:
    """Every command's help (given, or its docstring) through one_line_paragraphs."""
    for info in typer_app.registered_commands:
        text = info.help if info.help is not None else inspect.getdoc(info.callback)
        if text:
            info.help = one_line_paragraphs(text)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _reflow_helps(group.typer_instance)


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)
_reflow_helps(app)


def main() -> None:
    """The `corral` console script and `python -m corral`: both say `corral` in their usage."""
    app(prog_name="corral")


if __name__ == "__main__":
    main()
