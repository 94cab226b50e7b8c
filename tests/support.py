"""Helpers shared by every test package."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CI_TRUTHY = frozenset({"1", "true", "yes"})


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this run is CI's: `CI` set to 1, true or yes, in any case (CI services write
    `CI=true`, some people `CI=1`; both must fail on a missing component, never skip)."""
    return environ.get("CI", "").strip().lower() in CI_TRUTHY


IN_CI = in_ci()


def require(condition: bool, what: str) -> None:
    """Skip when a real component is missing on a developer's machine; in CI (`in_ci()`) a missing
    component is a failure, never a skip."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is not available, and CI requires it", pytrace=False)
    pytest.skip(f"{what} is not available")


def require_binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    require(path is not None, f"the program {name!r}")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def _migrated_sqlite_template() -> Path:
    """A SQLite database migrated to the newest schema by `init_db`, once per process (removed at
    its exit): the template that `copy_migrated_sqlite` copies."""
    from corral.db.session import init_db

    folder = Path(tempfile.mkdtemp(prefix="corral-db-template-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "corral.db"
    init_db(f"sqlite:///{path}")  # its engine is disposed: the WAL is checkpointed into the file
    leftover = [p.name for p in folder.iterdir() if p != path]
    assert not leftover, f"the migrated template left {leftover} beside it: not a whole copy"
    return path


def copy_migrated_sqlite(path: Path) -> str:
    """Put a SQLite database with the newest schema at `path` (mode 0600, as the server makes
    it); its URL. Alembic's 38+ migrations take 1-2 s on a fresh file (more on a loaded machine),
    once per test that wanted a fresh database; the copy of one migrated file takes milliseconds
    and is what `init_db` makes of an empty file (a later `init_db` finds it at head). The
    migrations themselves are tested on fresh databases in tests/api/test_migrations.py."""
    template = _migrated_sqlite_template()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, template.open("rb") as source:
        shutil.copyfileobj(source, out)
    return f"sqlite:///{path}"


@contextmanager
def dir_for_job_accounts(prefix: str, mode: int = 0o1777) -> Iterator[Path]:
    """A temporary dir other accounts can use, removed afterwards: pytest's own tmp dirs are 0700,
    so a job running as a test account cannot reach them. 0o1777 (the default): any account may
    write in it (sticky, like /tmp), e.g. for markers between a test and its jobs; 0o755: pass and
    read only."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, mode)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def served(app: Any) -> Iterator[str]:
    """`app` (an ASGI app, e.g. a TestClient's) served by uvicorn on a free local port in a thread,
    for a client that needs a real URL (the CLI): its base URL, stopped on the way out."""
    import threading
    import time

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
