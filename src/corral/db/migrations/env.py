"""Alembic environment: runs migrations on the URL in the config, or on a connection handed in
through `config.attributes["connection"]` (so tests and init_db can reuse an Engine)."""

from __future__ import annotations

import importlib

from alembic import context
from sqlalchemy import Connection, pool

from corral.db.base import Base
from corral.db.session import make_engine

# Import every module that declares tables so that autogenerate sees them; monitoring is optional.
importlib.import_module("corral.db.models")
try:
    importlib.import_module("corral.monitor.models")
except ModuleNotFoundError:
    pass

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    assert url, "sqlalchemy.url is not set"
    engine = make_engine(url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; give a database URL")
run_migrations_online()
