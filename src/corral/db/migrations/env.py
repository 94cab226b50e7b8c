"""Alembic environment: runs migrations on the URL in the config, or on a connection handed in
through `config.attributes["connection"]` (so tests and init_db can reuse an Engine)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, pool

from corral.db.base import Base
from corral.db.session import make_engine
from corral.db.tables import import_all

# Every module that declares tables, so that autogenerate sees them (corral.db.tables).
import_all()

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
        with engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            if sqlite:
                # Batch mode rebuilds a table (create copy, DROP, rename) to drop or alter a
                # column; with foreign keys on, the DROP of a referenced table that has rows
                # fails (0004's downgrade did, on any populated database). The pragma only takes
                # effect outside a transaction; the check below restores the guarantee.
                conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
                conn.commit()
            with conn.begin():
                _run(conn)
                if sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise RuntimeError(f"migration left rows with dangling foreign keys: {broken[:5]}")
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; give a database URL")
run_migrations_online()
