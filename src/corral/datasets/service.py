"""Datasets: who may see and change them, their views, sharing, deletion (refused while a job that
has not ended uses the version), the `data/<name>[@v]` mount source and job lineage.

Rights: the owner (a user, or every member of the owning group) reads and pushes new versions;
the owning user, an admin of the owning group or a platform admin deletes and shares; members of
a group it is shared with, or everyone when it is public, read it. Nobody changes a version.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from corral.catalog.retired import retire
from corral.datasets.models import Dataset, DatasetShare, DatasetVersion, JobDataset
from corral.datasets.names import BadName, check_name, check_plain, parse_ref
from corral.datasets.quotas import charge_dataset, lock_account, owner_account
from corral.datasets.store import Store
from corral.db.models import Group, Job, Membership, User
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.words import plural

# Jobs in these states hold on to the dataset versions they use: deleting one is refused.
ACTIVE_JOB_STATES = ("queued", "scheduled", "starting", "running", "preempted")


class DatasetRefError(ValueError):
    """A `data/<name>[@v]` reference that names nothing this user may read; says which part."""


@dataclass(frozen=True)
class Reader:
    """Who reads: enough to decide the read right (the mount source knows only names)."""

    user_id: int
    is_admin: bool
    group_ids: frozenset[int]

    @classmethod
    def of(cls, principal: Principal) -> Reader:
        return cls(principal.user_id, principal.is_admin, frozenset(principal.group_roles))


def by_name(session: Session, name: str) -> Dataset:
    try:
        check_name(name)
    except BadName as exc:
        raise Invalid(str(exc), ("path", "name"))
    found = session.scalar(select(Dataset).where(Dataset.name == name))
    if found is None:
        raise NotFound(f"no dataset named {name!r}")
    return found


def shared_group_ids(session: Session, dataset_id: int) -> set[int]:
    return set(session.scalars(select(DatasetShare.group_id).where(DatasetShare.dataset_id == dataset_id)))


def can_read(session: Session, ds: Dataset, reader: Reader) -> bool:
    if reader.is_admin or ds.public or ds.owner_user_id == reader.user_id:
        return True
    if ds.owner_group_id is not None and ds.owner_group_id in reader.group_ids:
        return True
    return bool(shared_group_ids(session, ds.id) & reader.group_ids)


def can_push(ds: Dataset, principal: Principal) -> bool:
    if principal.is_admin or ds.owner_user_id == principal.user_id:
        return True
    return ds.owner_group_id is not None and principal.is_member(ds.owner_group_id)


def can_manage(ds: Dataset, principal: Principal) -> bool:
    if principal.is_admin or ds.owner_user_id == principal.user_id:
        return True
    return ds.owner_group_id is not None and principal.is_group_admin(ds.owner_group_id)


def readable(session: Session, name: str, principal: Principal) -> Dataset:
    """The dataset, or NotFound (also when it exists but the caller may not read it: no leak)."""
    ds = by_name(session, name)
    if not can_read(session, ds, Reader.of(principal)):
        raise NotFound(f"no dataset named {name!r}")
    return ds


def managed(session: Session, name: str, principal: Principal, action: str) -> Dataset:
    """The dataset, which the caller may read, when they may also do `action` to it ("delete it",
    "share it"): the refusal names it ("may do this" named nothing) and who may."""
    ds = readable(session, name, principal)
    if not can_manage(ds, principal):
        who = (
            f"an admin of {owner_words(session, ds)}, which owns dataset {name!r},"
            if ds.owner_group_id is not None
            else f"its owner, {owner_words(session, ds)},"
        )
        raise Forbidden(f"only {who} or a platform admin may {action}")
    return ds


def owner_words(session: Session, ds: Dataset) -> str:
    """ "group vision" or "user alice": the owner as `corral data ls` shows it to any reader."""
    if ds.owner_group_id is not None:
        group = session.get(Group, ds.owner_group_id)
        return f"group {group.name}" if group is not None else "a group"
    user = session.get(User, ds.owner_user_id)
    return f"user {user.name}" if user is not None else "a user"


def versions_of(session: Session, dataset_id: int) -> list[DatasetVersion]:
    return list(
        session.scalars(
            select(DatasetVersion)
            .where(DatasetVersion.dataset_id == dataset_id)
            .order_by(DatasetVersion.version)
        )
    )


def version_of(session: Session, ds: Dataset, version: int | None) -> DatasetVersion:
    """A version (None: the latest); NotFound naming the dataset and the versions it has."""
    rows = versions_of(session, ds.id)
    if not rows:
        raise NotFound(f"dataset {ds.name!r} has no versions yet")
    if version is None:
        return rows[-1]
    for row in rows:
        if row.version == version:
            return row
    have = ", ".join(f"v{r.version}" for r in rows)
    raise NotFound(f"dataset {ds.name!r} has no version v{version} (it has {have})")


# -- views --------------------------------------------------------------------------------------


def _names(session: Session, datasets: Iterable[Dataset]) -> tuple[dict[int, str], dict[int, str]]:
    users: dict[int, str] = {r[0]: r[1] for r in session.execute(select(User.id, User.name))}
    groups: dict[int, str] = {r[0]: r[1] for r in session.execute(select(Group.id, Group.name))}
    return users, groups


def dataset_view(session: Session, ds: Dataset, *, with_versions: bool = True) -> dict[str, Any]:
    users, groups = _names(session, [ds])
    rows = versions_of(session, ds.id)
    view: dict[str, Any] = {
        "name": ds.name,
        "owner": {"user": users.get(ds.owner_user_id or -1), "group": groups.get(ds.owner_group_id or -1)},
        "public": ds.public,
        "shared_with": sorted(groups[g] for g in shared_group_ids(session, ds.id) if g in groups),
        "description": ds.description,
        "created_at": ds.created_at,
        "created_by": ds.created_by,
        "latest": rows[-1].version if rows else None,
        "versions_count": len(rows),
        "bytes": sum(r.bytes for r in rows),
        "files": sum(r.files for r in rows),
    }
    if with_versions:
        view["versions"] = [version_view(r) for r in rows]
    return view


def version_view(row: DatasetVersion) -> dict[str, Any]:
    return {
        "version": row.version,
        "bytes": row.bytes,
        "files": row.files,
        "digest": row.digest,
        "source": row.source,
        "created_at": row.created_at,
        "created_by": row.created_by,
    }


def list_readable(session: Session, principal: Principal) -> list[dict[str, Any]]:
    reader = Reader.of(principal)
    out = []
    for ds in session.scalars(select(Dataset).order_by(Dataset.name)):
        if can_read(session, ds, reader):
            out.append(dataset_view(session, ds, with_versions=False))
    return out


# -- sharing and deletion -----------------------------------------------------------------------


def share(
    session: Session,
    ds: Dataset,
    principal: Principal,
    *,
    add_groups: Iterable[str] = (),
    remove_groups: Iterable[str] = (),
    public: bool | None = None,
) -> None:
    """Read access for more groups (or fewer), or for everyone. Read-only: a share never lets
    anyone push or delete. A platform admin shares with any group; anyone else with the groups
    they belong to (and keeps those it is shared with already): another group, existing or not,
    is refused with the same 404, so a share does not tell which group names exist. A share is
    removed by name; a name it is not shared with changes nothing."""
    shared = shared_group_ids(session, ds.id)
    for gname in add_groups:
        group = _share_target(session, principal, gname, shared)
        if group.id not in shared:
            session.add(DatasetShare(dataset_id=ds.id, group_id=group.id))
            shared.add(group.id)
    for gname in remove_groups:
        _check_group_name(gname)
        gone = select(Group.id).where(Group.name == gname).scalar_subquery()
        session.execute(
            delete(DatasetShare).where(DatasetShare.dataset_id == ds.id, DatasetShare.group_id == gone)
        )
    if public is not None:
        ds.public = public


def _check_group_name(name: str) -> None:
    try:
        check_plain(name, "group name")
    except BadName as exc:
        raise Invalid(str(exc), ("body", "groups"))


def _share_target(session: Session, principal: Principal, name: str, shared: set[int]) -> Group:
    """The group `name` to share with, as the caller may name it (docstring of `share`)."""
    _check_group_name(name)
    group = session.scalar(select(Group).where(Group.name == name))
    if group is not None and (principal.is_admin or principal.is_member(group.id) or group.id in shared):
        return group
    if principal.is_admin:
        raise NotFound(f"no group named {name!r}")
    mine = session.scalars(select(Group.name).where(Group.id.in_(list(principal.group_roles)))).all()
    raise NotFound(
        f"no group named {name!r} among yours: share with a group you belong to"
        f" ({', '.join(sorted(mine)) or 'none'}) or make the dataset public (--public);"
        " a platform admin shares with any group"
    )


def jobs_using(session: Session, dataset_id: int, version: int | None) -> list[int]:
    """Ids of jobs not yet ended (queued, scheduled, starting, running, preempted) that use the
    dataset (that version, or any version when None), from the lineage table."""
    query = (
        select(JobDataset.job_id)
        .join(Job, Job.id == JobDataset.job_id)
        .where(JobDataset.dataset_id == dataset_id, Job.state.in_(ACTIVE_JOB_STATES))
    )
    if version is not None:
        query = query.where(JobDataset.version == version)
    return sorted(set(session.scalars(query)))


def _refuse_in_use(session: Session, ds: Dataset, version: int | None) -> None:
    jobs = jobs_using(session, ds.id, version)
    if jobs:
        what = f"version v{version} of dataset {ds.name!r}" if version else f"dataset {ds.name!r}"
        listed = ", ".join(str(j) for j in jobs[:20]) + (" ..." if len(jobs) > 20 else "")
        raise Conflict(
            f"{what} is in use by {plural(len(jobs), 'job')} that {'has' if len(jobs) == 1 else 'have'} "
            f"not ended: {listed}; "
            "delete it once they end (or cancel them)"
        )


def delete_version(session: Session, store: Store, ds: Dataset, version: int) -> None:
    """Delete one version (refused while a job uses it). The row goes first, in the same
    transaction as the usage; the files after the commit (a crash leaves an orphan directory,
    which the stale-upload loop removes)."""
    row = version_of(session, ds, version)
    _refuse_in_use(session, ds, version)
    account = lock_account(owner_account(session, ds.owner_user_id, ds.owner_group_id))
    charge_dataset(account, -row.bytes, -row.files)
    session.delete(row)
    session.commit()
    store.unpublish(ds.id, version)


def delete_dataset(session: Session, store: Store, ds: Dataset) -> None:
    _refuse_in_use(session, ds, None)
    # The account locked before the versions are read: a version published meanwhile is in them.
    account = lock_account(owner_account(session, ds.owner_user_id, ds.owner_group_id))
    rows = versions_of(session, ds.id)
    charge_dataset(account, -sum(r.bytes for r in rows), -sum(r.files for r in rows))
    session.refresh(ds, ["last_version"])  # after the lock, as every publish sets it
    retire(session, "dataset", ds.name, ds.last_version)  # a new `ds.name` goes on from there
    session.delete(ds)
    session.commit()
    store.remove(store.dataset_dir(ds.id))


# -- the mount source and lineage -----------------------------------------------------------------


def resolve_dataset_ref(
    session: Session, user_name: str, group_names: set[str], ref: str, *, store: Store
) -> tuple[str, int]:
    """`data/<name>[@<version>]` -> (host path of the version's directory, version number), for
    `user_name` who is in `group_names`; the latest version when none is given. Raises
    DatasetRefError naming the dataset or version when it does not exist or that user may not
    read it. The caller mounts the path read-only (the files are read-only on disk too).
    `store`: the datasets of the storage root the caller mounts from (the mount context's)."""
    try:
        name, version = parse_ref(ref)
    except BadName as exc:
        raise DatasetRefError(str(exc))
    user = session.scalar(select(User).where(User.name == user_name))
    if user is None:
        raise DatasetRefError(f"no user named {user_name!r}")
    group_ids = frozenset(session.scalars(select(Group.id).where(Group.name.in_(group_names))))
    ds = session.scalar(select(Dataset).where(Dataset.name == name))
    if ds is None or not can_read(session, ds, Reader(user.id, user.is_admin, group_ids)):
        raise DatasetRefError(f"no dataset named {name!r} that {user_name} may read")
    try:
        row = version_of(session, ds, version)
    except NotFound as exc:
        raise DatasetRefError(exc.message)
    return str(store.version_dir(ds.id, row.version)), row.version


def record_job_datasets(session: Session, job_id: int, refs: list[tuple[int, int]]) -> None:
    """Lineage: job `job_id` used these (dataset id, version) pairs. Idempotent; the caller
    commits (in the transaction that stores or launches the job)."""
    query = select(Dataset.id, Dataset.name).where(Dataset.id.in_([d for d, _ in refs]))
    names: dict[int, str] = {r[0]: r[1] for r in session.execute(query)}
    for dataset_id, version in dict.fromkeys(refs):
        if session.get(JobDataset, (job_id, dataset_id, version)) is None:
            if dataset_id not in names:
                raise DatasetRefError(f"no dataset with id {dataset_id}")
            session.add(
                JobDataset(
                    job_id=job_id, dataset_id=dataset_id, version=version, dataset_name=names[dataset_id]
                )
            )


def job_datasets(session: Session, job_id: int) -> list[dict[str, Any]]:
    rows = session.scalars(
        select(JobDataset).where(JobDataset.job_id == job_id).order_by(JobDataset.dataset_name)
    )
    return [{"dataset": r.dataset_name, "version": r.version} for r in rows]


def member_group_names(session: Session, user_id: int) -> set[str]:
    return set(
        session.scalars(
            select(Group.name)
            .join(Membership, Membership.group_id == Group.id)
            .where(Membership.user_id == user_id)
        )
    )


def count_versions(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(DatasetVersion)) or 0)
