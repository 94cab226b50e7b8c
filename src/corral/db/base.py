"""The one declarative base every Corral table hangs off, with a naming convention so that
Alembic migrations name constraints the same way on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import MetaData, Table, inspect, update
from sqlalchemy.orm import DeclarativeBase, Session

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def table_of(model: type[Base]) -> Table:
    """A mapped class's Table, for Core statements on hot paths (declared as a FromClause)."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


def lock_row(session: Session, row: Base) -> bool:
    """Lock `row` until the transaction ends and read it again (what was committed by then), by
    an UPDATE that sets its primary key to itself: PostgreSQL's row lock and SQLite's write lock
    alike, on either database with the same statement. False when the row is gone. For
    read-then-act code that two requests may run at once (the second waits, then sees the
    first's outcome)."""
    mapper = inspect(row).mapper
    model = mapper.class_
    keys = [mapper.get_property_by_column(column).key for column in mapper.primary_key]
    ident = mapper.primary_key_from_instance(row)
    locked = session.execute(
        update(model)
        .where(*(getattr(model, key) == value for key, value in zip(keys, ident, strict=True)))
        .values({keys[0]: getattr(model, keys[0])})
        .execution_options(synchronize_session=False)
    )
    if locked.rowcount != 1:  # type: ignore[attr-defined]
        return False
    session.refresh(row)
    return True
