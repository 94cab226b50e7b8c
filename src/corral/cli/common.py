"""What every `corral` command module shares: the SDK client from the CLI config, `-o json`,
SDK errors as one line on stderr, times as text, the stdout/stderr consoles."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from corral.sdk import Client, CorralError

F = TypeVar("F", bound=Callable[..., Any])
out = Console(markup=False)  # what is printed is text (see `plain`); markup is asked for per call
err = Console(stderr=True, markup=False)


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table (default) or json (the API's JSON)")]


def client() -> Client:
    return Client.from_config()


def error_line(message: str) -> None:
    """`error: <message>` on stderr as one line: the message as written (the server's and the
    user's text: a `[/x]` in it is not Rich markup), never wrapped (a long path stays whole, to be
    copied)."""
    err.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False, soft_wrap=True)


def friendly_errors(fn: F) -> F:
    """Turn SDK errors, and errors of the local files a command reads or writes, into one plain
    line on stderr and exit code 1 (no tracebacks)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CorralError as exc:
            error_line(exc.message)
        except TimeoutError as exc:
            error_line(str(exc))
        except OSError as exc:  # a local path: pulling into a file, an unwritable directory
            error_line(f"{exc.filename}: {exc.strerror}" if exc.filename is not None else str(exc))
        raise typer.Exit(1)

    return wrapper  # type: ignore[return-value]


def plain(value: Any) -> str:
    """Text from the server (what users wrote: descriptions, titles, comments, reasons) as it is in
    a Rich table cell or markup line: "[/x]" raised MarkupError (a traceback, and for a public
    template's description in everyone's `corral template ls`), "[bold]" vanished, "[link=...]"
    made a hyperlink. `out` and `err` print text (markup=False): this is for the lines that ask for
    markup=True (a bold name, a yellow "warning:") around what users wrote."""
    return escape(str(value))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "-"
    delta = (time.time() if now is None else now) - ts
    future = delta < 0
    delta = abs(delta)
    text = f"{delta:.0f}s" if delta < 90 else f"{delta / 60:.0f}m" if delta < 5400 else f"{delta / 3600:.1f}h"
    return f"in {text}" if future else f"{text} ago"
