"""Engine and session factory for SQLite (default) and PostgreSQL, and `init_db` (Alembic upgrade).

SQLite gets WAL (readers never block the writer), a busy timeout (concurrent writers wait instead of
failing at once), foreign keys on (off by default in SQLite; CASCADE rules rely on them), and
writers within one process take turns on a lock instead of polling (corral.db.sqlite_writes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from corral.db import sqlite_writes

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000


def normalize_url(url: str) -> str:
    """Accept `postgresql://` and `postgres://` and use the psycopg 3 driver for them."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def is_sqlite(url: str) -> bool:
    return make_url(normalize_url(url)).get_backend_name() == "sqlite"


class DatabaseUnavailable(RuntimeError):
    """The database URL cannot be used; the message names it (password hidden) and why."""


def check_database(url: str) -> None:
    """Refuse, in one line, a URL that is not SQLite's or PostgreSQL's, or a PostgreSQL server that
    does not answer: what `corral up` and `corral admin migrate` check before migrating, instead of
    SQLAlchemy's traceback. A SQLite file is only parsed (connecting would create it)."""
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc

    try:
        parsed = make_url(normalize_url(url))
    except sa_exc.ArgumentError:
        # as given, but for a password ("corral:pw@db/corral", its scheme forgotten): hidden too
        unparsed = re.sub(r"(?<=:)[^:/@]*(?=@)", "***", url)
        raise DatabaseUnavailable(
            f"database URL {unparsed!r} is not a URL: use sqlite:////PATH or "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        ) from None
    shown = make_url(url).render_as_string(hide_password=True)  # as given: postgresql://...
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise DatabaseUnavailable(f"database URL {shown}: Corral runs on SQLite or PostgreSQL, not {backend}")
    if backend == "sqlite":
        return
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect():
            pass
    except sa_exc.DBAPIError as exc:
        lines = str(exc.orig or exc).strip().splitlines()
        raise DatabaseUnavailable(f"database {shown}: cannot connect: {lines[0] if lines else exc}") from None
    finally:
        engine.dispose()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an Engine for `url`; makes the parent directory of a SQLite file."""
    url = normalize_url(url)
    if is_sqlite(url):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        kwargs["connect_args"].setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
        on_file = database not in (None, "", ":memory:")
        if on_file:
            kwargs["connect_args"].setdefault("factory", sqlite_writes.WriteSerializingConnection)
        if "poolclass" not in kwargs and on_file:
            # More connections than requests the API admits at once (32) plus the control loops.
            kwargs.setdefault("pool_size", 20)
            kwargs.setdefault("max_overflow", 30)
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        if on_file:
            lock_key = str(Path(str(database)).expanduser().resolve())

            def bind_write_lock(dbapi_connection: Any, _record: Any) -> None:
                sqlite_writes.configure(dbapi_connection, lock_key, SQLITE_BUSY_TIMEOUT_MS / 1000)

            event.listen(engine, "connect", bind_write_lock)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 30)
    return create_engine(url, **kwargs)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; fsync only at checkpoints
    finally:
        cursor.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: objects stay readable after commit (routers serialise them after).
    return sessionmaker(bind=engine, expire_on_commit=False)


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def init_db(url: str, *, engine: Engine | None = None) -> None:
    """Bring the database at `url` to the newest schema (Alembic `upgrade head`). Safe to repeat."""
    upgrade(url, "heads", engine=engine)


def upgrade(url: str, revision: str = "heads", *, engine: Engine | None = None) -> None:
    from alembic import command

    _run_alembic(command.upgrade, url, revision, engine)


def downgrade(url: str, revision: str = "base", *, engine: Engine | None = None) -> None:
    from alembic import command

    _run_alembic(command.downgrade, url, revision, engine)


def _run_alembic(step: Callable[[Any, str], None], url: str, revision: str, engine: Engine | None) -> None:
    """Run an Alembic step; on `engine`'s own connection when one is given (migrations/env.py uses it)."""
    cfg = alembic_config(url)
    if engine is None:
        step(cfg, revision)
        return
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        step(cfg, revision)
