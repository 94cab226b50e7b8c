"""Job templates (the marketplace): publish a spec with typed `parameters:` (corral.catalog.params)
as a new version of a named template, from a spec or from a finished job ("save as template");
list, show, share, delete; and use one: render it with the given values and submit the job
through the same checks as `POST /jobs`. Each use counts. Rights: corral.catalog.access."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from corral.catalog import access, retired
from corral.catalog.params import ParameterError, describe, render, sample_values, split_body
from corral.config import Settings
from corral.db.catalog_models import JobTemplate, TemplateVersion
from corral.db.models import User
from corral.environments.service import check_job_environment
from corral.scheduler import Profile
from corral.services import audit
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.jobs import check_caller_may_submit, get_job, submit_job
from corral.services.storage import check_job_storage
from corral.services.views import JobView
from corral.spec import JobSpecV1, MountV1, SpecError, load_spec_text

# Every refusal of a template's own spec starts so: what a JSON schema cannot check (YAML text,
# `${...}` references, the spec they render) is told apart from a malformed request.
SPEC_ERROR = "template spec: "


def spec_errors(exc: ValidationError) -> str:
    """A rendered spec's errors as one line: `tasks.main.resources.gpus: ...; ...`."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def parameter_invalid(exc: ParameterError, where: str = "values") -> Invalid:
    loc: tuple[str | int, ...] = ("body", where) + ((exc.name,) if exc.name else ())
    prefix = SPEC_ERROR if where == "spec" else ""
    return Invalid(f"{prefix}{exc}", loc)


def check_body(body: Mapping[str, Any]) -> JobSpecV1:
    """A template that can be used: parameters well declared, every `${name}` declared, and the
    spec valid with the defaults (or, for parameters without one, the smallest valid value),
    which it returns."""
    try:
        params, _ = split_body(body)
        return render(body, sample_values(params))
    except ParameterError as exc:
        raise parameter_invalid(exc, "spec") from None
    except ValidationError as exc:
        raise Invalid(
            f"{SPEC_ERROR}with its default values it is not a valid job spec: {spec_errors(exc)}",
            ("body", "spec"),
        ) from None


def body_of(spec: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(spec, str):
        try:
            return load_spec_text(spec)
        except SpecError as exc:
            raise Invalid(f"{SPEC_ERROR}{exc}", ("body", "spec")) from None
    return dict(spec)


def readable(session: Session, name: str, principal: Principal) -> JobTemplate:
    return access.readable(session, JobTemplate, "template", name, principal)


def managed(session: Session, name: str, principal: Principal) -> JobTemplate:
    return access.managed(session, JobTemplate, "template", name, principal)


def versions(session: Session, template_id: int) -> list[TemplateVersion]:
    stmt = select(TemplateVersion).where(TemplateVersion.template_id == template_id)
    return list(session.scalars(stmt.order_by(TemplateVersion.version)))


def version_of(session: Session, row: JobTemplate, version: int | None) -> TemplateVersion:
    rows = versions(session, row.id)
    if version is None:
        return rows[-1]
    for v in rows:
        if v.version == version:
            return v
    have = ", ".join(f"v{v.version}" for v in rows)
    raise NotFound(f"template {row.name!r} has no version v{version} (it has {have})")


def template_view(
    session: Session, row: JobTemplate, version: TemplateVersion | None = None
) -> dict[str, Any]:
    """The template with its latest (or the given) version's body and parameters."""
    all_versions = versions(session, row.id)
    shown = version or all_versions[-1]
    params, _ = split_body(shown.body)
    return {
        "name": row.name,
        "description": row.description,
        "owner": session.scalar(select(User.name).where(User.id == row.owner_user_id)),
        "group": access.group_name(session, row.group_id),
        "visibility": row.visibility,
        "uses": row.uses,
        "latest": all_versions[-1].version,
        "version": shown.version,
        "versions": [
            {
                "version": v.version,
                "created_at": v.created_at,
                "created_by": v.created_by,
                "source_job_id": v.source_job_id,
            }
            for v in all_versions
        ],
        "parameters": describe(params),
        "spec": shown.body,
        "created_at": row.created_at,
    }


def list_templates(session: Session, principal: Principal) -> list[dict[str, Any]]:
    rows = session.scalars(select(JobTemplate).order_by(JobTemplate.name)).all()
    return [template_view(session, r) for r in rows if access.can_read(r, principal)]


def publish(
    session: Session,
    principal: Principal,
    name: str,
    spec: str | Mapping[str, Any] | None,
    *,
    description: str | None = None,
    group: str | None = None,
    visibility: str | None = None,
    from_job: int | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """A new template (v1), or a new version of one the caller manages. Exactly one of `spec`
    (YAML text or a mapping with `parameters:`) and `from_job` (a job the caller may see: its
    stored spec, without parameters) is given. Commits."""
    now = time.time() if now is None else now
    access.check_name("template", name)
    body = _usable_body(session, principal, spec, from_job)
    row = session.scalar(select(JobTemplate).where(JobTemplate.name == name).with_for_update())
    group_id = access.group_id_of(session, principal, group)
    if row is None:
        vis = visibility or ("group" if group_id is not None else "private")
        access.check_sharing(vis, group_id)
        row = JobTemplate(
            name=name,
            owner_user_id=principal.user_id,
            group_id=group_id,
            visibility=vis,
            description=description or "",
            uses=0,
            created_at=now,
            created_by=principal.name,
        )
        session.add(row)
        access.flush_or_conflict(session, f"template {name!r}")
        number = retired.carried_over(session, "template", name) + 1  # a deleted one's go on
    else:
        if not access.can_read(row, principal):
            raise access.name_taken("template", name)
        if not access.can_manage(row, principal):
            raise Forbidden(f"only the owner of template {name!r} (or an admin of its group) may publish it")
        if description is not None:
            row.description = description
        last = session.scalar(
            select(func.max(TemplateVersion.version)).where(TemplateVersion.template_id == row.id)
        )
        number = int(last or 0) + 1
    version = TemplateVersion(
        template_id=row.id,
        version=number,
        body=body,
        source_job_id=from_job,
        created_at=now,
        created_by=principal.name,
    )
    session.add(version)
    access.flush_or_conflict(session, f"template {name!r}")
    audit.record(
        session,
        actor=principal,
        action="template.publish",
        target_kind="template",
        target_id=name,
        after={"version": number, "from_job": from_job},
    )
    view = template_view(session, row, version)
    session.commit()
    return view


def _usable_body(
    session: Session, principal: Principal, spec: str | Mapping[str, Any] | None, from_job: int | None
) -> dict[str, Any]:
    """The body of a new template version from exactly one of `spec` and `from_job`, checked as
    usable: a valid spec with its defaults, and not a build's or a workspace's job, every use of
    which would be refused at submit (whether copied from such a job or written as one)."""
    if (spec is None) == (from_job is None):
        raise Invalid(f"{SPEC_ERROR}give either 'spec' or 'from_job', one of them", ("body",))
    if from_job is not None:
        body, source = dict(get_job(session, principal, from_job).spec.stored()), f"job {from_job}"
    else:
        assert spec is not None
        body, source = body_of(spec), "this spec"
    rendered = check_body(body)
    try:
        check_caller_may_submit(rendered, workspace=False, build=False)
    except Invalid as exc:
        field = "from_job" if from_job is not None else "spec"
        raise Invalid(
            f"{source} cannot be a template (each job made from it would be refused): {exc.message}",
            ("body", field),
        ) from None
    return body


def share(
    session: Session, principal: Principal, name: str, visibility: str, group: str | None
) -> dict[str, Any]:
    row = managed(session, name, principal)
    access.share_entry(
        session, principal, row, kind="template", name=name, visibility=visibility, group=group
    )
    view = template_view(session, row)
    session.commit()
    return view


def delete_template(session: Session, principal: Principal, name: str) -> None:
    """The template and all its versions (jobs made from it keep their own specs). Commits."""
    row = managed(session, name, principal)
    last = session.scalar(
        select(func.max(TemplateVersion.version)).where(TemplateVersion.template_id == row.id)
    )
    session.execute(delete(TemplateVersion).where(TemplateVersion.template_id == row.id))
    session.execute(delete(JobTemplate).where(JobTemplate.id == row.id))
    retired.retire(session, "template", name, int(last or 0))  # `use NAME --version N` stays one spec
    audit.record(session, actor=principal, action="template.delete", target_kind="template", target_id=name)
    session.commit()


def render_spec(
    session: Session,
    principal: Principal,
    name: str,
    values: Mapping[str, Any],
    version: int | None = None,
    extra_mounts: Sequence[MountV1] = (),
) -> tuple[JobTemplate, TemplateVersion, JobSpecV1]:
    """The job spec of a template with `values`: 422 naming the parameter for a bad value."""
    row = readable(session, name, principal)
    chosen = version_of(session, row, version)
    try:
        spec = render(chosen.body, values)
    except ParameterError as exc:
        raise parameter_invalid(exc) from None
    except ValidationError as exc:
        raise Invalid(
            f"template {name!r} with these values is not a valid job spec: {spec_errors(exc)}",
            ("body", "values"),
        ) from None
    if extra_mounts:
        taken = {m.target for m in spec.mounts}
        clash = [m.target for m in extra_mounts if m.target in taken]
        if clash:
            raise Conflict(f"template {name!r} already mounts something at {clash[0]}")
        spec = spec.model_copy(update={"mounts": [*spec.mounts, *extra_mounts]})
    return row, chosen, spec


def use(
    session: Session,
    principal: Principal,
    name: str,
    values: Mapping[str, Any],
    settings: Settings,
    profile: Profile,
    *,
    version: int | None = None,
    extra_mounts: Sequence[MountV1] = (),
) -> JobView:
    """Render and submit (the checks of `POST /jobs`: mounts, quota, fit); the use is counted
    in the submission's transaction, so a refused job counts nothing. Commits."""
    row, _, spec = render_spec(session, principal, name, values, version, extra_mounts)
    spec = check_job_storage(session, principal, spec, settings)
    spec = check_job_environment(session, principal, spec)  # as POST /jobs: 422 or pinned
    session.execute(update(JobTemplate).where(JobTemplate.id == row.id).values(uses=JobTemplate.uses + 1))
    return submit_job(session, principal, spec, profile)
