"""File modes of the server's own state: $CORRAL_HOME 0700 and the SQLite database 0600.

The home holds the CLI config with the admin token, the webhook secret and the SQLite database
(password and token hashes, every job spec); with the umask's 0755/0644 any account on the host
could read them.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from corral.db.session import is_sqlite

log = logging.getLogger(__name__)

HOME_MODE = 0o700
DB_FILE_MODE = 0o600


def secure_home(home: Path) -> None:
    """Create `home` with mode 0700 (its missing parents too); warn when an existing one is wider."""
    if not home.exists():
        home.mkdir(parents=True, mode=HOME_MODE)
        os.chmod(home, HOME_MODE)  # mkdir's mode is masked by the umask; be exact
        return
    mode = stat.S_IMODE(home.stat().st_mode)
    if mode & 0o077:
        log.warning("%s has mode %04o: other accounts can read it; chmod 700 %s", home, mode, home)


def secure_sqlite_file(url: str) -> None:
    """Create the SQLite file (and its WAL/shm companions, if present) with mode 0600 before
    SQLite does; SQLite gives the WAL and shm files the database file's mode."""
    if not is_sqlite(url):
        return
    from corral.ops.backup import sqlite_path

    path = sqlite_path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, DB_FILE_MODE))
    for companion in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if companion.exists() and stat.S_IMODE(companion.stat().st_mode) != DB_FILE_MODE:
            os.chmod(companion, DB_FILE_MODE)
