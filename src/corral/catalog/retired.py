"""Version numbers outlive a deleted name (docs/datasets.md, docs/catalogues.md).

A dataset, model or environment keeps the highest version number it gave (`last_version`; a
template's versions are never deleted one by one, so its highest is its latest).
Deleting it keeps that number under its name (`retire`, table `retired_names`); one created
again with the name starts from it (`carried_over`), so `NAME@3`, as a job's spec or a model's
lineage recorded it, never names other content: the new entry's first version is v4. The name
itself stays free to take: what Determined, W&B and MLflow users expect of a version number.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import delete
from sqlalchemy.orm import Session

from corral.db.catalog_models import RetiredName

Kind = Literal["dataset", "model", "environment", "template"]


def retire(session: Session, kind: Kind, name: str, last_version: int) -> None:
    """Keep `name`'s highest version number, in the transaction deleting it."""
    row = session.get(RetiredName, (kind, name))
    if row is None:
        session.add(RetiredName(kind=kind, name=name, last_version=last_version))
    else:
        row.last_version = max(row.last_version, last_version)


def carried_over(session: Session, kind: Kind, name: str) -> int:
    """The number a deleted `kind` of this name had reached (0: none), for the new one's
    `last_version`; the record goes, the new entry keeps the count from now on. In the
    transaction creating it: the name's uniqueness makes one creation win."""
    last = session.scalar(
        delete(RetiredName)
        .where(RetiredName.kind == kind, RetiredName.name == name)
        .returning(RetiredName.last_version)
    )
    return int(last or 0)
