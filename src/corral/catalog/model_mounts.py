"""Registered models as a mount source of the storage layer (corral.storage.mounts):
`model/<name>[@<ref>]`, always read-only, at `/models/<name>` unless the spec names a target.
`<ref>` is a version (`3`, `v3`) or a stage (`production`, `staging`); without one, the
production version, else the newest version not archived. At submit the source is pinned to the
version it resolved to (`model/resnet` -> `model/resnet@3`, kept in the job's spec) and the job's
use is recorded (`record_model_uses`): what refuses deleting a version a job not yet ended
mounts. At launch the pinned version is resolved again (rights are checked again)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.catalog.access import NAME_RE, can_read_as
from corral.catalog.model_files import version_dir
from corral.db.catalog_models import JobModel, ModelVersion, RegisteredModel
from corral.db.models import Group, Job, User
from corral.services.lifecycle import JobState
from corral.spec import MountV1
from corral.storage.mounts import Bind, MountContext, MountRefused, MountRequest, register_source

PREFIX = "model"
SANDBOX_MODELS = "/models"
STAGES = ("none", "staging", "production", "archived")
ACTIVE_JOB_STATES = tuple(s.value for s in JobState if not s.terminal)
_VERSION_RE = re.compile(r"^[vV]?0*([1-9][0-9]{0,8})$")


class ModelRefError(ValueError):
    """A `name[@ref]` that names no model version this user may read; says which part."""


def split_ref(ref: str) -> tuple[str, str | None]:
    name, _, at = ref.partition("@")
    if not NAME_RE.match(name):
        raise ModelRefError(f"{name!r} is not a model name")
    return name, (at or None)


def pick_version(session: Session, model: RegisteredModel, at: str | None) -> ModelVersion:
    """The version `at` names (a number or a stage), or the default (see the module doc)."""
    rows = list(
        session.scalars(
            select(ModelVersion).where(ModelVersion.model_id == model.id).order_by(ModelVersion.version)
        )
    )
    if not rows:
        raise ModelRefError(f"model {model.name!r} has no versions")
    if at is None:
        production = [r for r in rows if r.stage == "production"]
        live = production or [r for r in rows if r.stage != "archived"] or rows
        return live[-1]
    number = _VERSION_RE.match(at)
    if number:
        wanted = int(number.group(1))
        for row in rows:
            if row.version == wanted:
                return row
        have = ", ".join(f"v{r.version}" for r in rows)
        raise ModelRefError(f"model {model.name!r} has no version v{wanted} (it has {have})")
    if at in STAGES:
        staged = [r for r in rows if r.stage == at]
        if not staged:
            raise ModelRefError(f"model {model.name!r} has no version in stage {at!r}")
        return staged[-1]
    raise ModelRefError(f"{at!r} is neither a version (3, v3) nor a stage ({', '.join(STAGES)})")


def resolve_model(ctx: MountContext, req: MountRequest) -> Bind:
    session = ctx.session
    if session is None:
        raise MountRefused(f"mount source {req.source!r}: models need the database to resolve")
    if not req.readonly:
        raise MountRefused(f"mount source {req.source!r}: models are read-only; use mode: ro")
    try:
        name, at = split_ref(req.ref)
        model = session.scalar(select(RegisteredModel).where(RegisteredModel.name == name))
        user_id = session.scalar(select(User.id).where(User.name == ctx.user))
        group_ids = set(session.scalars(select(Group.id).where(Group.name.in_(sorted(ctx.groups)))))
        if model is None or user_id is None or not can_read_as(model, user_id, group_ids, ctx.is_admin):
            raise ModelRefError(f"no model named {name!r}")
        version = pick_version(session, model, at)
    except ModelRefError as exc:
        raise MountRefused(f"mount source {req.source!r}: {exc}") from exc
    return Bind(
        host_path=str(version_dir(ctx.root, model.id, version.version)),
        target=req.target or f"{SANDBOX_MODELS}/{name}",
        readonly=True,
        source=f"{PREFIX}/{name}@{version.version}",
    )


register_source(PREFIX, resolve_model)


def record_model_uses(session: Session, job_id: int, mounts: Sequence[MountV1]) -> None:
    """The exact model versions job `job_id` mounts (its pinned `model/<name>@<v>` sources), in
    the caller's transaction."""
    pinned = [split_ref(m.source.partition("/")[2]) for m in mounts if m.source.startswith(f"{PREFIX}/")]
    for name, at in dict.fromkeys(pinned):
        number = _VERSION_RE.match(at or "")
        if number is None:
            continue  # not pinned: only a spec stored without the submit check (tests)
        row = session.execute(
            select(ModelVersion.id, ModelVersion.version)
            .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
            .where(RegisteredModel.name == name, ModelVersion.version == int(number.group(1)))
        ).one_or_none()
        if row is not None and session.get(JobModel, (job_id, row.id)) is None:
            session.add(
                JobModel(job_id=job_id, model_version_id=row.id, model_name=name, version=row.version)
            )


def active_mounts(session: Session, version_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(model version id, job id) for each job not yet ended that mounts one of these versions."""
    if not version_ids:
        return []
    query = (
        select(JobModel.model_version_id, JobModel.job_id)
        .join(Job, Job.id == JobModel.job_id)
        .where(JobModel.model_version_id.in_(list(version_ids)), Job.state.in_(ACTIVE_JOB_STATES))
    )
    return [(version_id, job_id) for version_id, job_id in session.execute(query)]
