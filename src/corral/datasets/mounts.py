"""Datasets as a mount source of the storage layer (corral.storage.mounts): `data/<name>[@<v>]`,
always read-only, at `/data/<name>` unless the spec names a target. At submit the source is pinned
to the version it resolved to (`data/cifar` -> `data/cifar@3`, kept in the job's spec) and the
job's lineage row is written (`record_lineage`); at launch the pinned version is resolved again,
so a user who lost the right to read it gets a refused launch, not the files."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.datasets.models import Dataset
from corral.datasets.names import BadName, parse_ref
from corral.datasets.service import DatasetRefError, record_job_datasets, resolve_dataset_ref
from corral.datasets.store import Store
from corral.spec import MountV1
from corral.storage.mounts import Bind, MountContext, MountRefused, MountRequest, register_source

PREFIX = "data"
SANDBOX_DATA = "/data"


def resolve_data(ctx: MountContext, req: MountRequest) -> Bind:
    if ctx.session is None:
        raise MountRefused(f"mount source {req.source!r}: datasets need the database to resolve")
    if not req.readonly:
        raise MountRefused(f"mount source {req.source!r}: datasets are read-only; use mode: ro")
    try:
        name, _ = parse_ref(req.ref)
        path, version = resolve_dataset_ref(
            ctx.session, ctx.user, set(ctx.groups), req.ref, store=Store(ctx.root)
        )
    except BadName as exc:
        raise MountRefused(f"mount source {req.source!r}: {exc}") from exc
    except DatasetRefError as exc:
        raise MountRefused(f"mount source {req.source!r}: {exc}") from exc
    return Bind(
        host_path=path,
        target=req.target or f"{SANDBOX_DATA}/{name}",
        readonly=True,
        source=f"{PREFIX}/{name}@{version}",
    )


register_source(PREFIX, resolve_data)


def record_lineage(session: Session, job_id: int, mounts: Sequence[MountV1]) -> None:
    """The exact dataset versions job `job_id` mounts (its pinned `data/<name>@<v>` sources), in
    the caller's transaction: what `jobs_using` reads to refuse deleting a version in use."""
    pinned = [parse_ref(m.source) for m in mounts if m.source.startswith(f"{PREFIX}/")]
    if not pinned:
        return
    names = [name for name, _ in pinned]
    query = select(Dataset.name, Dataset.id).where(Dataset.name.in_(names))
    ids: dict[str, int] = {row.name: row.id for row in session.execute(query)}
    refs = [(ids[name], version) for name, version in pinned if name in ids and version is not None]
    record_job_datasets(session, job_id, refs)
