"""The environments catalogue: create (a new version, built by a build job submitted through the
normal job path as the submitter), list, show, delete, and the submit-time check that pins a
job's `environment: NAME[@VERSION]` to a ready version (422 for an unknown, building or failed
one). Rights: an environment is read by its owner, admins, the members of its group when its
visibility is `group`, and everyone when `public`; it is changed by its owner and admins. Only
admins set `official`."""

from __future__ import annotations

import re
import time
import tomllib
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import delete as sa_delete
from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.catalog.access import flush_or_conflict, name_taken
from corral.catalog.retired import carried_over, retire
from corral.config import Settings
from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import Group, Job, User
from corral.environments import interpreter, tools
from corral.environments.buildstep import CACHE_DOMAIN_ENV, cache_domain, lock_pins
from corral.environments.store import DEFAULT_ENVIRONMENT
from corral.scheduler import Profile
from corral.services import audit
from corral.services.accounts import visible_group_id
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.lifecycle import JobState
from corral.spec import JobSpecV1, parse_spec

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
REF_RE = re.compile(r"^(?P<name>[^@]+)(?:@(?P<version>\d{1,9}))?$")
MAX_SOURCE_BYTES = 32 * 1024  # goes to the build job in its env (MAX_ENV_BYTES is 64 KiB)
Visibility = Literal["private", "group", "public"]
SourceKind = Literal["requirements", "pyproject"]
BUILDING, READY, FAILED = "building", "ready", "failed"
# A requirement line may not pick its own index or fetch from elsewhere: the build reaches the
# admin's index and nothing else (docs/catalogues.md).
_DIRECT_REF = re.compile(r"(^-)|(\s@\s)|(://)|(^\.{0,2}/)|(^git\+)|(^file:)", re.IGNORECASE)


class EnvRefError(ValueError):
    """An environment reference that cannot be used (unknown, not readable, not ready)."""


@dataclass(frozen=True, slots=True)
class CreateRequest:
    name: str
    source: str
    source_kind: SourceKind = "requirements"
    visibility: Visibility = "private"
    group: str | None = None
    official: bool = False
    description: str = ""


def parse_ref(ref: str) -> tuple[str, int | None]:
    match = REF_RE.match(ref)
    if match is None or not NAME_RE.match(match["name"]):
        raise EnvRefError(f"environment {ref!r} is not NAME or NAME@VERSION (letters, digits, '.', '_', '-')")
    version = match["version"]
    return match["name"], int(version) if version is not None else None


def check_source(kind: str, text: str) -> list[str]:
    """The requirement strings of a request, refused (422) when it names an index, a URL or a
    path of its own. The syntax of each requirement is uv's to judge, in the build's log."""
    if len(text.encode()) > MAX_SOURCE_BYTES:
        raise Invalid(f"the {kind} text is over {MAX_SOURCE_BYTES} bytes", ("body", "source"))
    if kind == "pyproject":
        try:
            project = tomllib.loads(text).get("project")
        except tomllib.TOMLDecodeError as exc:
            raise Invalid(f"pyproject is not valid TOML: {exc}", ("body", "source")) from exc
        deps = project.get("dependencies") if isinstance(project, dict) else None
        if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            raise Invalid("pyproject needs [project] dependencies = [...] (strings)", ("body", "source"))
        lines = [d.strip() for d in deps]
    else:
        lines = [ln.split(" #", 1)[0].strip() for ln in text.splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("#")]
    for number, line in enumerate(lines, 1):
        if _DIRECT_REF.search(line):
            raise Invalid(
                f"requirement {number} ({line[:80]!r}): options, URLs and paths are not allowed; "
                "builds use the package index the admin configured",
                ("body", "source"),
            )
    if not lines:
        raise Invalid(f"the {kind} names no packages", ("body", "source"))
    return lines


# -- rights ------------------------------------------------------------------------------------


def can_read(env: Environment, user_id: int, group_ids: set[int], is_admin: bool) -> bool:
    if is_admin or env.owner_id == user_id or env.visibility == "public" or env.official:
        return True
    return env.visibility == "group" and env.group_id is not None and env.group_id in group_ids


# `corral env ls` lists the server's own environment first, so "there is no environment named
# 'default'" (show, rm) and "does not exist" (a job's `default@1`) contradicted it.
NOT_IN_CATALOGUE = (
    f"{DEFAULT_ENVIRONMENT!r} is the server's own interpreter and packages, not a catalogue "
    "environment: it has no versions to show, pin or delete (a job names it as "
    f"`environment: {DEFAULT_ENVIRONMENT}`)"
)


def _readable(session: Session, principal: Principal, name: str) -> Environment:
    if name == DEFAULT_ENVIRONMENT:
        raise NotFound(NOT_IN_CATALOGUE)
    env = session.scalar(select(Environment).where(Environment.name == name))
    if env is None or not can_read(env, principal.user_id, set(principal.group_roles), principal.is_admin):
        raise NotFound(f"there is no environment named {name!r}")
    return env


def _writable(session: Session, principal: Principal, name: str) -> Environment:
    env = _readable(session, principal, name)
    if not principal.is_admin and env.owner_id != principal.user_id:
        raise Forbidden(f"environment {name!r} belongs to another user; only they or an admin change it")
    return env


# -- create ------------------------------------------------------------------------------------


def create(
    session: Session, principal: Principal, settings: Settings, profile: Profile, req: CreateRequest
) -> dict[str, Any]:
    """A new version of `req.name` (the environment too when new), in state `building`, and its
    build job, queued as the submitter. Commits; returns the version's view."""
    from corral.services.jobs import submit_job

    if not NAME_RE.match(req.name) or req.name == DEFAULT_ENVIRONMENT:
        raise Invalid(
            f"environment name {req.name!r} must be letters, digits, '.', '_' or '-' (at most 64) "
            f"and not {DEFAULT_ENVIRONMENT!r} (the server's own)",
            ("body", "name"),
        )
    check_source(req.source_kind, req.source)
    if not settings.env_index_url and settings.env_find_links is None:
        raise Conflict(
            "environments cannot be built here: the admin has configured no package index "
            "(CORRAL_ENV_INDEX_URL or CORRAL_ENV_FIND_LINKS)"
        )
    if req.official and not principal.is_admin:
        raise Forbidden("only admins mark environments official")
    group_id = _group_id(session, principal, req)
    python, python_version, build_tools = _build_prerequisites(settings)
    # A concurrent create of the same name, or of its next version, is a 409 (flush_or_conflict).
    env = _upsert_environment(session, principal, req, group_id)
    version = _new_version(session, principal, env, req, python, python_version)
    number = version.version
    audit.record(
        session,
        actor=principal,
        action="environment.version.create",
        target_kind="environment",
        target_id=f"{env.name}@{number}",
        after={"visibility": env.visibility, "official": env.official, "source_kind": req.source_kind},
    )
    domain = cache_domain(principal.user_id, principal.is_admin)
    spec = build_spec(settings, env.name, number, req, req.group, python, build_tools, domain)
    try:
        job = submit_job(session, principal, spec, profile, build=True)  # commits the rows above too
    except Invalid as exc:
        if exc.loc != ("body", "tasks"):
            raise
        why = str(exc).removeprefix("this job can never run on this cluster: ")
        raise Conflict(  # e.g. a Slurm cluster of GPU nodes only (CORRAL_CPU_JOBS_ON_GPU_NODES)
            f"environments cannot be built here: their build job (1 CPU, 2 GiB, no GPU) fits no node: {why}"
        ) from exc
    version.build_job_id = job["id"]
    session.commit()
    return version_view(env, version)


def _upsert_environment(
    session: Session, principal: Principal, req: CreateRequest, group_id: int | None
) -> Environment:
    """The environment named `req.name`, made or updated by its owner (or an admin)."""
    env = session.scalar(select(Environment).where(Environment.name == req.name))
    if env is None:
        env = Environment(
            name=req.name,
            owner_id=principal.user_id,
            group_id=group_id,
            visibility=req.visibility,
            official=req.official,
            description=req.description,
            created_at=time.time(),
            last_version=carried_over(session, "environment", req.name),  # a deleted one's, if any
        )
        session.add(env)
        flush_or_conflict(session, f"environment {req.name!r}")
        return env
    if not principal.is_admin and env.owner_id != principal.user_id:
        raise name_taken("environment", req.name)
    env.visibility, env.group_id = req.visibility, group_id
    env.official = req.official or (env.official and not principal.is_admin)
    env.description = req.description or env.description
    return env


def _new_version(
    session: Session,
    principal: Principal,
    env: Environment,
    req: CreateRequest,
    interpreter: str,
    python_version: str,
) -> EnvironmentVersion:
    """The environment's next version, in state `building` (flushed, not committed): above every
    number given before (`last_version`), so a deleted latest version's is not given again. Two
    creations at once may pick the same one: the version's unique key makes the second a 409."""
    env.last_version = (env.last_version or 0) + 1  # every number given is counted (migration 0022)
    version = EnvironmentVersion(
        environment_id=env.id,
        version=env.last_version,
        state=BUILDING,
        source_kind=req.source_kind,
        source=req.source,
        python=python_version,
        interpreter=interpreter,
        cache_hit=False,
        error="",
        created_by=principal.name,
        created_at=time.time(),
    )
    session.add(version)
    flush_or_conflict(session, f"environment {env.name!r}")
    return version


def _group_id(session: Session, principal: Principal, req: CreateRequest) -> int | None:
    if req.group is None:
        if req.visibility == "group":
            raise Invalid("visibility 'group' needs the group it is shared with", ("body", "group"))
        return None
    return visible_group_id(session, principal, req.group)


def _build_prerequisites(settings: Settings) -> tuple[str, str, tools.BuildTools]:
    """The interpreter, its version and the published build tools; 409 naming what is missing."""
    python = interpreter.configured(settings)
    try:
        return python, interpreter.version(python), tools.publish(settings.storage_path)
    except (interpreter.InterpreterUnavailable, tools.ToolsUnavailable) as exc:
        raise Conflict(f"environments cannot be built here: {exc}") from exc


def build_spec(
    settings: Settings,
    name: str,
    number: int,
    req: CreateRequest,
    group_name: str | None,
    python: str,
    build_tools: tools.BuildTools,
    domain: str,
) -> JobSpecV1:
    """The build job: the environment's interpreter running the published build step (with the
    published uv; corral.environments.tools), the request and its cache domain (buildstep.
    cache_domain) in its env. The same on every engine; its tools, store and find-links binds
    and its network are added at launch (mounts.py)."""
    from corral.environments.store import BUILD_FIND_LINKS, BUILD_STORE

    spec: dict[str, Any] = {
        "name": f"env-build-{name}-v{number}"[:128],
        # -I: no PYTHON* variables, no user site dir, no script dir on sys.path (standard
        # library only): nothing of the user's is imported by the build step.
        "command": f'exec "$CORRAL_ENV_PYTHON" -I "$CORRAL_ENV_TOOLS/{build_tools.buildstep}"',
        "resources": {"cpus": 1, "memory": "2GiB"},
        "max_runtime": settings.env_build_timeout_s,
        "env": {
            "CORRAL_ENV_SOURCE_KIND": req.source_kind,
            "CORRAL_ENV_SOURCE": req.source,
            "CORRAL_ENV_PYTHON": python,
            tools.BUILD_TOOLS_ENV: tools.BUILD_TOOLS,
            "CORRAL_ENV_UV": build_tools.uv,
            "CORRAL_ENV_INDEX_URL": settings.env_index_url,
            "CORRAL_ENV_FIND_LINKS": BUILD_FIND_LINKS if settings.env_find_links is not None else "",
            "CORRAL_ENV_STORE": BUILD_STORE,
            CACHE_DOMAIN_ENV: domain,
        },
    }
    if group_name is not None:
        spec["group"] = group_name
    return parse_spec(spec)


# -- read --------------------------------------------------------------------------------------


def version_view(env: Environment, v: EnvironmentVersion) -> dict[str, Any]:
    return {
        "name": env.name,
        "version": v.version,
        "ref": f"{env.name}@{v.version}",
        "state": v.state,
        "source_kind": v.source_kind,
        "source": v.source,
        "python": v.python,
        "interpreter": v.interpreter,
        "lock": v.lock,
        "cache_key": v.cache_key,
        "cache_hit": v.cache_hit,
        "build_job_id": v.build_job_id,
        "error": v.error,
        "created_by": v.created_by,
        "created_at": v.created_at,
        "built_at": v.built_at,
    }


def env_view(session: Session, env: Environment, versions: list[EnvironmentVersion]) -> dict[str, Any]:
    owner = session.get(User, env.owner_id)
    group = session.get(Group, env.group_id) if env.group_id is not None else None
    latest_ready = max((v.version for v in versions if v.state == READY), default=None)
    return {
        "name": env.name,
        "owner": owner.name if owner is not None else "",
        "group": group.name if group is not None else None,
        "visibility": env.visibility,
        "official": env.official,
        "description": env.description,
        "created_at": env.created_at,
        "latest_ready": latest_ready,
        "versions": [version_view(env, v) for v in versions],
    }


def _versions(session: Session, env_id: int) -> list[EnvironmentVersion]:
    query = select(EnvironmentVersion).where(EnvironmentVersion.environment_id == env_id)
    return list(session.scalars(query.order_by(EnvironmentVersion.version)))


def list_environments(session: Session, principal: Principal) -> list[dict[str, Any]]:
    envs = session.scalars(select(Environment).order_by(Environment.official.desc(), Environment.name))
    groups = set(principal.group_roles)
    return [
        env_view(session, e, _versions(session, e.id))
        for e in envs
        if can_read(e, principal.user_id, groups, principal.is_admin)
    ]


def show(session: Session, principal: Principal, name: str) -> dict[str, Any]:
    env = _readable(session, principal, name)
    return env_view(session, env, _versions(session, env.id))


def get_version(session: Session, principal: Principal, name: str, number: int) -> dict[str, Any]:
    env = _readable(session, principal, name)
    v = _version_row(session, env, number)
    return version_view(env, v)


def _version_row(session: Session, env: Environment, number: int) -> EnvironmentVersion:
    v = session.scalar(
        select(EnvironmentVersion).where(
            EnvironmentVersion.environment_id == env.id, EnvironmentVersion.version == number
        )
    )
    if v is None:
        raise NotFound(f"environment {env.name!r} has no version {number}")
    return v


# -- delete ------------------------------------------------------------------------------------


def jobs_using(session: Session, refs: set[str]) -> list[int]:
    """Active jobs pinned to any of `refs` ("name@3"), which keep their environment: as their
    `environment:`, or as a mount of the `env/` source (pinned to `env/name@3` at submit)."""
    active = [s.value for s in JobState if not s.terminal]
    rows = session.execute(select(Job.id, Job.spec).where(Job.state.in_(active)))
    sources = {f"env/{ref}" for ref in refs}
    return sorted(
        job_id
        for job_id, spec in rows
        if spec.environment in refs or any(m.source in sources for m in spec.mounts)
    )


def delete(session: Session, principal: Principal, name: str, number: int | None) -> None:
    """One version, or the environment with all its versions; refused (409) while an active job
    runs in it or its build has not ended. Its store copy goes when no version names it (gc)."""
    env = _writable(session, principal, name)
    versions = [_version_row(session, env, number)] if number is not None else _versions(session, env.id)
    building = [v.version for v in versions if v.state == BUILDING]
    if building:
        raise Conflict(f"environment {name!r} version {building[0]} is still building")
    using = jobs_using(session, {f"{name}@{v.version}" for v in versions})
    if using:  # the version asked for, not the environment (its other versions may be unused)
        what = f"environment {name!r}" if number is None else f"environment version '{name}@{number}'"
        raise Conflict(f"{what} is in use by active job {using[0]}; delete it when that ends")
    before = {"versions": [v.version for v in versions]}
    ids = [v.id for v in versions]
    session.execute(sa_delete(EnvironmentVersion).where(EnvironmentVersion.id.in_(ids)))
    if number is None:
        last = env.last_version or 0  # every number it gave (migration 0022), read before the delete
        session.execute(sa_delete(Environment).where(Environment.name == name))
        retire(session, "environment", name, last)  # a new environment of this name goes on from there
    audit.record(
        session,
        actor=principal,
        action="environment.delete",
        target_kind="environment",
        target_id=name if number is None else f"{name}@{number}",
        before=before,
    )
    session.commit()


# -- jobs --------------------------------------------------------------------------------------


def resolve_ready(
    session: Session, user_id: int, group_ids: set[int], is_admin: bool, ref: str
) -> tuple[Environment, EnvironmentVersion]:
    """`NAME` (its newest ready version) or `NAME@V` (that one, which must be ready)."""
    name, number = parse_ref(ref)
    if name == DEFAULT_ENVIRONMENT:
        raise EnvRefError(f"environment {ref!r}: {NOT_IN_CATALOGUE}")
    env = session.scalar(select(Environment).where(Environment.name == name))
    if env is None or not can_read(env, user_id, group_ids, is_admin):
        raise EnvRefError(f"environment {name!r} does not exist (see `corral env ls`)")
    query = select(EnvironmentVersion).where(EnvironmentVersion.environment_id == env.id)
    if number is None:
        found = session.scalar(
            query.where(EnvironmentVersion.state == READY)
            .order_by(EnvironmentVersion.version.desc())
            .limit(1)
        )
        if found is None:
            raise EnvRefError(f"environment {name!r} has no ready version (its builds failed or are running)")
        return env, found
    v = session.scalar(query.where(EnvironmentVersion.version == number))
    if v is None:
        raise EnvRefError(f"environment {name!r} has no version {number}")
    if v.state != READY:
        detail = f": {v.error.splitlines()[0]}" if v.state == FAILED and v.error else ""
        raise EnvRefError(f"environment {name}@{number} is {v.state}, not ready{detail}")
    return env, v


def check_job_environment(session: Session, principal: Principal, spec: JobSpecV1) -> JobSpecV1:
    """The spec with its environment pinned (`digits` -> `digits@2`), or 422 naming it."""
    if spec.environment == DEFAULT_ENVIRONMENT:
        return spec
    try:
        env, v = resolve_ready(
            session, principal.user_id, set(principal.group_roles), principal.is_admin, spec.environment
        )
    except EnvRefError as exc:
        raise Invalid(str(exc), ("body", "environment")) from exc
    return spec.model_copy(update={"environment": f"{env.name}@{v.version}"})


# What a workspace's environment must hold: JupyterLab, and Corral, whose launcher
# (`python -m corral.workspaces.launch`) the environment's python runs.
WORKSPACE_PACKAGES = ("jupyterlab", "corral")


def lock_packages(lock: str) -> set[str]:
    """The normalized names (PEP 503) pinned in a `uv pip compile` lock: `name==1.2`, `name @ url`
    (its pins as the store's key reads them: buildstep.lock_pins); options and hashes skipped."""
    names = set()
    for line in lock_pins(lock):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:==|===|@)", line)
        if match:
            names.add(re.sub(r"[-_.]+", "-", match[1]).lower())
    return names


def check_workspace_environment(session: Session, ref: str) -> None:
    """Refuse (422) a pinned catalogue environment (`NAME@V`) whose lock lacks what a workspace
    runs (WORKSPACE_PACKAGES): it would be accepted, then fail at start. `default` has both; a
    version without a recorded lock cannot be judged here (its start says what is missing)."""
    if ref == DEFAULT_ENVIRONMENT:
        return
    name, number = parse_ref(ref)
    lock = session.scalar(
        select(EnvironmentVersion.lock)
        .join(Environment, Environment.id == EnvironmentVersion.environment_id)
        .where(Environment.name == name, EnvironmentVersion.version == number)
    )
    if not lock:
        return
    have = lock_packages(lock)
    missing = [p for p in WORKSPACE_PACKAGES if p not in have]
    if missing:
        names = " and ".join(missing)
        raise Invalid(
            f"environment {ref!r} cannot run a workspace: its packages lack {names} (JupyterLab runs "
            f"in it, started by Corral's launcher); add {names} to its requirements and build a new "
            f"version (corral env create {name} -r FILE), or pick another environment (default "
            "has both)",
            ("body", "environment"),
        )
