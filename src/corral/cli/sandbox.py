"""`corral exec`, `corral port-forward` (into a running job's sandbox, over the exec WebSocket)
and `corral key add/ls/rm` (the SSH public keys the SSH gateway accepts). docs/workspaces.md,
"SSH gateway and sandbox entry"."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import termios
import threading
import tty
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import (
    Output,
    OutputOpt,
    ago,
    client,
    error_line,
    friendly_errors,
    out,
    plain,
    print_json,
)
from corral.exec_client import STDERR, ExecError, ExecSession
from corral.sdk import CorralError

key_app = typer.Typer(help="Your SSH public keys: the SSH gateway lets in only these.", no_args_is_help=True)
RankOpt = Annotated[int, typer.Option("--rank", "-r", min=0, help="which instance of the job (global rank)")]


def register(app: typer.Typer) -> None:
    app.command("exec")(exec_command)  # options anywhere before `--`: `corral exec 42 --rank 1 -- bash`
    app.command("port-forward")(port_forward)
    app.add_typer(key_app, name="key")


@friendly_errors
def exec_command(
    job_id: Annotated[int, typer.Argument(help="a running job of yours")],
    command: Annotated[list[str], typer.Argument(help="the program and its arguments (after --)")],
    rank: RankOpt = 0,
    tty_mode: Annotated[
        bool | None, typer.Option("--tty/--no-tty", "-t/-T", help="default: a terminal when stdin is one")
    ] = None,
) -> None:
    """Run a command inside a running job's sandbox: its namespaces (network too), cgroup,
    mounts, uid and GPUs. Interactive with a terminal when stdin is one. Exits with its code.

    Example: corral exec 42 -- nvidia-smi ; corral exec 42 -- bash"""
    if not command:
        raise CorralError("name the command to run after --, e.g. corral exec 42 -- nvidia-smi")
    use_tty = sys.stdin.isatty() and sys.stdout.isatty() if tty_mode is None else tty_mode
    cols, rows = shutil.get_terminal_size()
    with client() as c:
        try:
            session = c.exec_session(job_id, command, rank=rank, tty=use_tty, rows=rows, cols=cols)
        except ExecError as exc:
            raise CorralError(exc.message, exc.status_code)
    with session:
        code = _interactive(session) if use_tty else _piped(session)
    raise typer.Exit(code)


def _pump_stdin(session: ExecSession, eof: bool) -> None:
    fd = sys.stdin.fileno()
    with contextlib.suppress(OSError, ExecError, Exception):
        while data := os.read(fd, 1 << 16):
            session.send(data)
        if eof:
            session.close_stdin()


def _drain(session: ExecSession) -> int:
    while True:
        try:
            item = session.recv()
        except ExecError as exc:
            error_line(exc.message)
            return 255
        if isinstance(item, int):
            return item
        stream = sys.stderr.buffer if item[0] == STDERR else sys.stdout.buffer
        stream.write(item[1])
        stream.flush()


def _piped(session: ExecSession) -> int:
    threading.Thread(target=_pump_stdin, args=(session, True), daemon=True).start()
    return _drain(session)


def _interactive(session: ExecSession) -> int:
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)

    def on_resize(_signum: int, _frame: Any) -> None:
        cols, rows = shutil.get_terminal_size()
        with contextlib.suppress(Exception):
            session.resize(rows, cols)

    previous = signal.signal(signal.SIGWINCH, on_resize)
    try:
        tty.setraw(fd)
        threading.Thread(target=_pump_stdin, args=(session, False), daemon=True).start()
        return _drain(session)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)


@friendly_errors
def port_forward(
    job_id: Annotated[int, typer.Argument(help="a running job of yours")],
    ports: Annotated[str, typer.Argument(help="LOCAL:REMOTE, e.g. 6006:6006 (LOCAL 0: any free port)")],
    rank: RankOpt = 0,
    address: Annotated[str, typer.Option(help="the local address to listen on")] = "127.0.0.1",
) -> None:
    """Forward a local TCP port to 127.0.0.1:REMOTE inside a running job's network namespace
    (TensorBoard, a debugger, a notebook). Each connection runs a small relay in the job's
    sandbox. Runs until Ctrl-C."""
    local, _, remote = ports.partition(":")
    if not (local.isdigit() and remote.isdigit()) or not 1 <= int(remote) <= 65535 or int(local) > 65535:
        raise CorralError(f"ports must be LOCAL:REMOTE with TCP port numbers, got {ports!r}")
    c = client()
    try:
        with c.port_relay(job_id, int(remote), rank=rank):  # checks access and the job before listening
            pass
    except ExecError as exc:  # one line, as `corral exec` says it
        c.close()
        raise CorralError(exc.message, exc.status_code) from None
    listener = socket.create_server((address, int(local)))
    bound = listener.getsockname()[1]
    out.print(f"Forwarding {address}:{bound} -> job {job_id} rank {rank} 127.0.0.1:{remote} (Ctrl-C stops)")
    try:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_relay, args=(c, job_id, int(remote), rank, conn), daemon=True).start()
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
        c.close()


def _relay(c: Any, job_id: int, port: int, rank: int, conn: socket.socket) -> None:
    try:
        session: ExecSession = c.port_relay(job_id, port, rank=rank)
    except (ExecError, OSError) as exc:
        error_line(f"connection to port {port} refused: {exc}")
        conn.close()
        return

    def upstream() -> None:
        with contextlib.suppress(OSError, Exception):
            while data := conn.recv(1 << 16):
                session.send(data)
            session.close_stdin()

    threading.Thread(target=upstream, daemon=True).start()
    try:
        while True:
            item = session.recv()
            if isinstance(item, int):
                break
            if item[0] == STDERR:  # the relay's own word (nothing listens there): not the service's data
                error_line(f"job {job_id}: {item[1].decode(errors='replace').strip()}")
                continue
            conn.sendall(item[1])
    except (ExecError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()
        session.close()


@key_app.command("add")
@friendly_errors
def add_key(
    path: Annotated[Path, typer.Argument(help="a public key file, e.g. ~/.ssh/id_ed25519.pub")],
    name: Annotated[
        str | None, typer.Option(help="a label (default: the key's comment or file name)")
    ] = None,
) -> None:
    """Register an SSH public key for the SSH gateway (never the private key)."""
    try:
        text = path.expanduser().read_text().strip()
    except OSError as exc:  # its reason alone, as the other commands' files: str(exc) repeated the path
        raise CorralError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CorralError(f"cannot read {path}: not text (a public key file is one line of text)") from None
    if "PRIVATE KEY" in text:
        raise CorralError(f"{path} is a private key: register the .pub file next to it")
    parts = text.split()
    label = name or (parts[2] if len(parts) > 2 else path.name)[:64]
    with client() as c:
        key = c.add_ssh_key(text, label)
    out.print(
        f"added SSH key {key['id']} [bold]{plain(key['name'])}[/bold] {key['fingerprint']}", markup=True
    )


@key_app.command("ls")
@friendly_errors
def list_keys(output: OutputOpt = Output.table) -> None:
    """Your registered SSH public keys."""
    with client() as c:
        keys: list[dict[str, Any]] = c.ssh_keys()
    if output is Output.json:
        print_json(keys)
        return
    table = Table("ID", "NAME", "FINGERPRINT", "ADDED", box=None)
    for k in keys:
        table.add_row(str(k["id"]), k["name"], k["fingerprint"], ago(k["created_at"]))
    out.print(table)


@key_app.command("rm")
@friendly_errors
def remove_key(key_id: Annotated[int, typer.Argument(help="the key's ID (corral key ls)")]) -> None:
    """Delete one of your SSH keys: the gateway stops accepting it at once."""
    with client() as c:
        c.remove_ssh_key(key_id)
    out.print(f"removed SSH key {key_id}")
