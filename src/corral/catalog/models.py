"""The model registry: register a finished job's outputs (or a path under them) as a new version
of a named model, with its framework, metrics (given, and read from a `metrics.json` it wrote), a
markdown card and its lineage recorded from the job (id, name, spec, the dataset versions it
mounted, environment, code snapshot, a code checksum if given); list, show, compare, promote
through the stages, share, delete (refused while a job not yet ended mounts the version), and
"fine-tune from": a template's job with the version mounted read-only at /models/<name>.

Stages: none -> staging -> production -> archived. Allowed moves (`TRANSITIONS`): forward one
step, back from production to staging, archive from any stage, restore an archived version to
staging. A model has at most one production version: promoting another archives the previous one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from corral.catalog import access, model_files, retired
from corral.catalog.model_files import MissingOutputs, OutsideOutputs, UnusableOutputs
from corral.catalog.model_mounts import STAGES, ModelRefError, active_mounts, pick_version, split_ref
from corral.datasets import quotas
from corral.datasets.models import JobDataset
from corral.db.catalog_models import ModelVersion, RegisteredModel
from corral.db.models import Job, User
from corral.services import audit
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.jobs import get_job
from corral.services.lifecycle import JobState

TRANSITIONS: dict[str, tuple[str, ...]] = {
    "none": ("staging", "archived"),
    "staging": ("production", "none", "archived"),
    "production": ("staging", "archived"),
    "archived": ("staging",),
}
MAX_CARD = 64 * 1024


def readable(session: Session, name: str, principal: Principal) -> RegisteredModel:
    return access.readable(session, RegisteredModel, "model", name, principal)


def managed(session: Session, name: str, principal: Principal) -> RegisteredModel:
    return access.managed(session, RegisteredModel, "model", name, principal)


def versions(session: Session, model_id: int) -> list[ModelVersion]:
    stmt = select(ModelVersion).where(ModelVersion.model_id == model_id).order_by(ModelVersion.version)
    return list(session.scalars(stmt))


def version_of(session: Session, model: RegisteredModel, version: int) -> ModelVersion:
    row = session.scalar(
        select(ModelVersion).where(ModelVersion.model_id == model.id, ModelVersion.version == version)
    )
    if row is None:
        have = ", ".join(f"v{v.version}" for v in versions(session, model.id)) or "none"
        raise NotFound(f"model {model.name!r} has no version v{version} (it has {have})")
    return row


def version_view(v: ModelVersion, *, lineage: bool = True) -> dict[str, Any]:
    view: dict[str, Any] = {
        "version": v.version,
        "stage": v.stage,
        "framework": v.framework,
        "metrics": v.metrics,
        "source_job_id": v.source_job_id,
        "source_path": v.source_path,
        "bytes": v.bytes,
        "files": v.files,
        "digest": v.digest,
        "created_at": v.created_at,
        "created_by": v.created_by,
    }
    if lineage:
        view["card"] = v.card
        view["lineage"] = v.lineage
    return view


def model_view(session: Session, row: RegisteredModel, *, detail: bool = False) -> dict[str, Any]:
    rows = versions(session, row.id)
    production = [v.version for v in rows if v.stage == "production"]
    view: dict[str, Any] = {
        "name": row.name,
        "description": row.description,
        "owner": session.scalar(select(User.name).where(User.id == row.owner_user_id)),
        "group": access.group_name(session, row.group_id),
        "visibility": row.visibility,
        "latest": rows[-1].version if rows else None,
        "production": production[-1] if production else None,
        "versions_count": len(rows),
        "created_at": row.created_at,
    }
    if detail:
        view["versions"] = [version_view(v, lineage=False) for v in rows]
    return view


def list_models(session: Session, principal: Principal) -> list[dict[str, Any]]:
    rows = session.scalars(select(RegisteredModel).order_by(RegisteredModel.name)).all()
    return [model_view(session, r) for r in rows if access.can_read(r, principal)]


def lineage_of(session: Session, job: Job, code_checksum: str | None) -> dict[str, Any]:
    """What the version came from, as values (the job may be deleted later)."""
    spec = job.spec.stored()
    datasets = session.execute(
        select(JobDataset.dataset_name, JobDataset.version)
        .where(JobDataset.job_id == job.id)
        .order_by(JobDataset.dataset_name)
    ).all()
    return {
        "job_id": job.id,
        "job_name": job.name,
        "user": job.user.name,
        "group": job.group.name,
        "finished_at": job.finished_at,
        "spec": dict(spec),
        "datasets": [{"name": n, "version": v} for n, v in datasets],
        "models": [m.source for m in job.spec.mounts if m.source.startswith("model/")],
        "environment": job.spec.environment,
        "environment_version": job.spec.environment_version,
        "code_snapshot": job.spec.code,
        "code_checksum": code_checksum,
    }


def _model_for_register(
    session: Session,
    principal: Principal,
    name: str,
    group: str | None,
    description: str | None,
    now: float,
) -> RegisteredModel:
    row = session.scalar(select(RegisteredModel).where(RegisteredModel.name == name).with_for_update())
    if row is not None:
        if not access.can_read(row, principal):
            raise access.name_taken("model", name)
        if not access.can_manage(row, principal):
            raise Forbidden(f"only the owner of model {name!r} (or an admin of its group) may add versions")
        if description is not None:
            row.description = description
        return row
    group_id = access.group_id_of(session, principal, group)
    row = RegisteredModel(
        name=name,
        owner_user_id=principal.user_id,
        group_id=group_id,
        visibility="group" if group_id is not None else "private",
        description=description or "",
        created_at=now,
        created_by=principal.name,
        last_version=retired.carried_over(session, "model", name),  # a deleted one's, if any
    )
    session.add(row)
    access.flush_or_conflict(session, f"model {name!r}")
    return row


def register(
    session: Session,
    principal: Principal,
    root: Path,
    name: str,
    job_id: int,
    *,
    path: str = "",
    framework: str = "",
    metrics: Mapping[str, Any] | None = None,
    card: str = "",
    code_checksum: str | None = None,
    group: str | None = None,
    description: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """A new version of model `name` (made on first use, owned by the caller) from job `job_id`'s
    outputs at `path`. The job must have succeeded and be visible to the caller; the path must lie
    under its outputs. The files are copied before the row is written; a failure leaves nothing.
    Given metrics win over those read from `metrics.json`. Commits."""
    now = time.time() if now is None else now
    access.check_name("model", name)
    if len(card) > MAX_CARD:
        raise Invalid(f"the model card is longer than {MAX_CARD // 1024} KiB", ("body", "card"))
    try:
        sub = model_files.normalise_path(path)
    except OutsideOutputs as exc:
        raise Invalid(str(exc), ("body", "path")) from None
    job = get_job(session, principal, job_id)
    if job.state != JobState.SUCCEEDED.value:
        raise Conflict(f"job {job_id} is {job.state}; only a job that succeeded can be registered as a model")
    try:
        copied = model_files.stage_copy(root, job_id, sub)
    except MissingOutputs as exc:
        raise NotFound(str(exc)) from None
    except UnusableOutputs as exc:
        raise Conflict(str(exc)) from None
    try:
        model = _model_for_register(session, principal, name, group, description, now)
        # Never a number given before: the latest version deleted, its number is not used again
        # (`last_version`, read under the row's lock, is at least every version's: migration 0020)
        model.last_version = (model.last_version or 0) + 1
        row = ModelVersion(
            model_id=model.id,
            version=model.last_version,
            stage="none",
            framework=framework,
            metrics={**model_files.read_metrics(copied.path), **(metrics or {})},
            card=card,
            source_path=sub,
            bytes=copied.bytes,
            files=copied.files,
            digest=copied.digest,
            source_job_id=job.id,
            lineage=lineage_of(session, job, code_checksum),
            created_at=now,
            created_by=principal.name,
        )
        _charge_owner(session, model, row.bytes, row.files, check=True)
        return _commit_version(session, principal, root, model, row, copied.path)
    finally:
        model_files.discard(copied.path)  # gone already when it was published


def _charge_owner(session: Session, model: RegisteredModel, nbytes: int, nfiles: int, check: bool) -> None:
    """A version's files count in its model owner's storage usage (the user's account, like a
    dataset's; corral.datasets.quotas): added when it is registered, within the owner's quota
    (403 otherwise, nothing kept), taken off when it is deleted. Same transaction as the row."""
    owner = session.get(User, model.owner_user_id)
    if owner is None:  # the owner is gone (their models go with them): nothing to account
        return
    # locked and re-read before the check: two registrations at once must not both fit the room
    row = quotas.lock_account(quotas.account(session, "user", owner.name))
    if check:
        quotas.check_room(row, nbytes, nfiles, what=f"the new version of model {model.name!r}")
    quotas.charge_dataset(row, nbytes, nfiles)


def _commit_version(
    session: Session,
    principal: Principal,
    root: Path,
    model: RegisteredModel,
    row: ModelVersion,
    staged: Path,
) -> dict[str, Any]:
    """Insert the version, move its staged files into place, commit; the files go again if the
    commit fails (a concurrent registration of the same number fails at the flush, before the move)."""
    session.add(row)
    access.flush_or_conflict(session, f"model {model.name!r}")
    audit.record(
        session,
        actor=principal,
        action="model.version.register",
        target_kind="model",
        target_id=model.name,
        after={
            "version": row.version,
            "job_id": row.source_job_id,
            "path": row.source_path,
            "digest": row.digest,
        },
    )
    final = model_files.version_dir(root, model.id, row.version)
    model_files.publish(staged, final)
    view = {"name": model.name, **version_view(row)}
    try:
        session.commit()
    except BaseException:
        model_files.discard(final)
        raise
    return view


def show_version(session: Session, principal: Principal, name: str, ref: str) -> dict[str, Any]:
    """The version `ref` names: a number (`3`, `v3`) or a stage (the newest version in it), as
    the mount source resolves `model/NAME@ref`; 404 naming what the model lacks."""
    model = readable(session, name, principal)
    try:
        row = pick_version(session, model, ref)
    except ModelRefError as exc:
        raise NotFound(str(exc)) from None
    return {"name": model.name, **version_view(row)}


def promote(session: Session, principal: Principal, name: str, version: int, stage: str) -> dict[str, Any]:
    """Move a version to `stage` if TRANSITIONS allows it (409 naming both stages otherwise);
    promoting to production archives the model's previous production version. Commits."""
    if stage not in STAGES:
        raise Invalid(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}", ("body", "stage"))
    model = managed(session, name, principal)
    row = version_of(session, model, version)
    if stage not in TRANSITIONS[row.stage]:
        allowed = ", ".join(TRANSITIONS[row.stage])
        raise Conflict(
            f"model {name!r} v{version} is in stage {row.stage!r}; it cannot move to {stage!r} "
            f"(from {row.stage!r} it may go to: {allowed})"
        )
    archived = []
    if stage == "production":
        for other in versions(session, model.id):
            if other.stage == "production" and other.id != row.id:
                other.stage = "archived"
                archived.append(other.version)
    before = row.stage
    row.stage = stage
    audit.record(
        session,
        actor=principal,
        action="model.version.promote",
        target_kind="model",
        target_id=f"{name}@{version}",
        before={"stage": before},
        after={"stage": stage, "archived": archived},
    )
    view = {"name": name, **version_view(row), "archived": archived}
    session.commit()
    return view


def share(
    session: Session, principal: Principal, name: str, visibility: str, group: str | None
) -> dict[str, Any]:
    row = managed(session, name, principal)
    access.share_entry(session, principal, row, kind="model", name=name, visibility=visibility, group=group)
    view = model_view(session, row)
    session.commit()
    return view


def _refuse_in_use(session: Session, name: str, rows: list[ModelVersion]) -> None:
    mounts = active_mounts(session, [r.id for r in rows])
    if mounts:
        jobs = sorted({job_id for _, job_id in mounts})
        which = ", ".join(str(j) for j in jobs[:10]) + (" ..." if len(jobs) > 10 else "")
        mounted = {version_id for version_id, _ in mounts}
        used = [r for r in rows if r.id in mounted]  # the versions named, from the same read
        what = ", ".join(f"v{r.version}" for r in used) + (" is" if len(used) == 1 else " are")
        raise Conflict(f"model {name!r} {what} mounted by jobs not yet ended: {which}")


def delete_version(session: Session, principal: Principal, root: Path, name: str, version: int) -> None:
    """Delete one version and its files; 409 naming the jobs while one not yet ended mounts it.
    The row goes first (committed), then the files: a crash between leaves only unnamed files."""
    model = managed(session, name, principal)
    row = version_of(session, model, version)
    _refuse_in_use(session, name, [row])
    _charge_owner(session, model, -row.bytes, -row.files, check=False)
    session.execute(delete(ModelVersion).where(ModelVersion.id == row.id))
    audit.record(
        session,
        actor=principal,
        action="model.version.delete",
        target_kind="model",
        target_id=f"{name}@{version}",
        before={"stage": row.stage, "digest": row.digest},
    )
    session.commit()
    model_files.discard(model_files.version_dir(root, model.id, version))


def delete_model(session: Session, principal: Principal, root: Path, name: str) -> None:
    model = managed(session, name, principal)
    rows = versions(session, model.id)
    if rows:
        _refuse_in_use(session, name, rows)
    _charge_owner(session, model, -sum(r.bytes for r in rows), -sum(r.files for r in rows), check=False)
    last = model.last_version or 0  # every number it gave (migration 0020), read before the delete
    session.execute(delete(ModelVersion).where(ModelVersion.model_id == model.id))
    session.execute(delete(RegisteredModel).where(RegisteredModel.id == model.id))
    retired.retire(session, "model", name, last)  # a new model of this name goes on from there
    audit.record(
        session,
        actor=principal,
        action="model.delete",
        target_kind="model",
        target_id=name,
        before={"versions": len(rows)},
    )
    session.commit()
    model_files.discard(root / "model" / str(model.id))


def compare(session: Session, principal: Principal, name: str, a: int, b: int) -> dict[str, Any]:
    """Two versions' metrics side by side, with b - a for the keys both give as numbers."""
    model = readable(session, name, principal)
    va, vb = version_of(session, model, a), version_of(session, model, b)
    rows = []
    for key in sorted(set(va.metrics) | set(vb.metrics)):
        x, y = va.metrics.get(key), vb.metrics.get(key)
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y))
        rows.append({"metric": key, "a": x, "b": y, "delta": (y - x) if numbers else None})  # type: ignore[operator]
    return {"name": name, "a": a, "b": b, "metrics": rows}


def files_of(session: Session, principal: Principal, root: Path, name: str, version: int) -> Path:
    model = readable(session, name, principal)
    version_of(session, model, version)
    return model_files.version_dir(root, model.id, version)


def mount_ref(session: Session, principal: Principal, ref: str) -> tuple[str, int]:
    """`name[@version|@stage]` -> (name, version) the caller may read, for a fine-tune mount."""
    try:
        name, at = split_ref(ref)
        model = readable(session, name, principal)
        return name, pick_version(session, model, at).version
    except ModelRefError as exc:  # names a version or stage the model does not have
        raise NotFound(f"model {ref!r}: {exc}") from None
