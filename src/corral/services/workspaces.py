"""Interactive workspaces: named, persistent objects of one user (db/workspace_models.py).

Each start submits a job of kind `workspace` through the normal job path (corral.services.jobs:
quotas, fair share, placement, why-pending; not preemptible), running JupyterLab in the job's
sandbox (corral.workspaces.launch); stop cancels that job (the cancel contract: the loops stop it
and the lifecycle module settles it), start submits a new one, rm removes the workspace. The
user's files are in their home (corral.storage) and outlive all of it.

A workspace and its job are written in one transaction: a start that does not fit (or any other
refusal) leaves nothing behind. The proxy (corral.workspaces.proxy) and the SSH gateway find a
workspace's running job here (`proxy_target`, `current_job_id`).
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from types import EllipsisType
from typing import TypedDict

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import Attempt, Group, Job, Node, User
from corral.db.workspace_models import Workspace, WorkspaceGroupPolicy
from corral.environments.service import check_job_environment, check_workspace_environment
from corral.scheduler import Profile
from corral.services import audit
from corral.services import jobs as job_service
from corral.services.auth import Principal, load_principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.job_logs import WaitingStatus, waiting_status
from corral.services.lifecycle import AttemptState, JobState
from corral.spec import (
    IdleGpuV1,
    JobSpecV1,
    MountV1,
    ResourcesV1,
    TaskV1,
    duration_text,
    format_seconds,
    parse_duration_s,
)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# `<user>+job-<id>` is the SSH gateway's login for a job (corral.gateway.resolver), so a workspace
# may not be named so: `<user>+<its name>` would enter that job instead.
JOB_LOGIN_RE = re.compile(r"^job-(?P<id>[0-9]{1,10})$")
LAUNCH_COMMAND = "exec python -m corral.workspaces.launch"
TOKEN_ENV = "CORRAL_WORKSPACE_TOKEN"  # corral.workspaces.launch reads and removes it
ACTIVE = frozenset(s.value for s in JobState if not s.terminal)


@dataclass(frozen=True, slots=True)
class WorkspaceRequest:
    """What `corral ws create` asks for; memory in MiB, idle timeout in seconds (None: default)."""

    name: str | None = None
    gpus: int = 0
    gpu_model: str | None = None
    cpus: float = 1.0
    memory_mib: int = 4096
    environment: str = "default"
    idle_timeout_s: float | None = None
    group: str | None = None
    start: bool = True


class WorkspaceView(TypedDict):
    id: int
    name: str
    user: str
    group: str
    state: str  # stopped | pending | starting | running | stopping
    job_id: int | None
    job_state: str | None
    gpus: int
    gpu_model: str | None
    cpus: float
    memory_mib: int
    environment: str
    idle_timeout_s: float
    url: str  # JupyterLab, relative to the portal (which hands browsers over: workspaces.origin)
    ssh_user: str  # `<ssh_user>@host -p <ssh_port>` through the SSH gateway
    ssh_port: int
    waiting: WaitingStatus | None
    failure: str | None  # why its current job failed (the job's reason); None unless it failed
    reclaimed_gpu_hours: float
    idle_stopped_at: float | None  # when the idle policy stopped its current job (else None)
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class ProxyTarget:
    """Where the proxy sends `/ws/<id>/` and who may go there."""

    workspace_id: int
    owner_user_id: int
    job_id: int | None
    attempt_id: str | None  # the running attempt ("42.1"), None while not running
    token: str
    node_address: str | None = None  # its rank-0 node's address (Slurm: JupyterLab listens there)
    name: str = ""  # told to its owner only (the proxy's 503)
    starting: bool = False  # its current job is queued or launching: no JupyterLab yet, but soon


def workspace_state(job: Job | None) -> str:
    if job is None or JobState(job.state).terminal:
        return "stopped"
    if job.cancel_requested or job.state == JobState.PREEMPTED.value:
        return "stopping"
    if job.state in (JobState.QUEUED.value, JobState.SCHEDULED.value):
        return "pending"
    return "starting" if job.state == JobState.STARTING.value else "running"


def idle_timeout_s(session: Session, settings: Settings, ws: Workspace) -> float:
    """`ws`'s idle timeout, its group's policy read here (by key)."""
    return _idle_timeout_s(settings, ws, session.get(WorkspaceGroupPolicy, ws.group_id))


def _idle_timeout_s(settings: Settings, ws: Workspace, policy: WorkspaceGroupPolicy | None) -> float:
    """The workspace's own timeout, else its group's default, else the server's; at most the
    group's (else the server's) maximum. `policy`: its group's (None: the group has none)."""
    default, maximum = _limits(settings, policy)
    return min(ws.idle_timeout_s or default, maximum)


def group_limits(session: Session, settings: Settings, group_id: int) -> tuple[float, float]:
    return _limits(settings, session.get(WorkspaceGroupPolicy, group_id))


def _limits(settings: Settings, policy: WorkspaceGroupPolicy | None) -> tuple[float, float]:
    default = settings.workspace_idle_timeout_s
    maximum = settings.workspace_max_idle_timeout_s
    if policy is not None:
        default = policy.default_idle_timeout_s or default
        maximum = policy.max_idle_timeout_s or maximum
    return min(default, maximum), maximum


def _view(session: Session, settings: Settings, ws: Workspace, owner: str, group: str) -> WorkspaceView:
    """One workspace's view; its job and its group's policy read here (by key)."""
    job = session.get(Job, ws.current_job_id) if ws.current_job_id is not None else None
    return _view_of(settings, ws, owner, group, job, session.get(WorkspaceGroupPolicy, ws.group_id))


def _view_of(
    settings: Settings,
    ws: Workspace,
    owner: str,
    group: str,
    job: Job | None,
    policy: WorkspaceGroupPolicy | None,
) -> WorkspaceView:
    """The view from rows already read: `job` (its current job) and `policy` (its group's)."""
    return {
        "id": ws.id,
        "name": ws.name,
        "user": owner,
        "group": group,
        "state": workspace_state(job),
        "job_id": ws.current_job_id,
        "job_state": job.state if job is not None else None,
        "gpus": ws.gpus,
        "gpu_model": ws.gpu_model,
        "cpus": ws.cpus,
        "memory_mib": ws.memory_mib,
        "environment": ws.environment,
        "idle_timeout_s": _idle_timeout_s(settings, ws, policy),
        "url": f"/ws/{ws.id}/lab",
        "ssh_user": f"{owner}+{ws.name}",
        "ssh_port": settings.ssh_gateway_port,
        "waiting": waiting_status(job) if job is not None else None,
        "failure": (job.reason or "failed")
        if job is not None and job.state == JobState.FAILED.value
        else None,
        "reclaimed_gpu_hours": ws.reclaimed_gpu_hours,
        "idle_stopped_at": ws.idle_stopped_at,
        "created_at": ws.created_at,
        "updated_at": ws.updated_at,
    }


def _state_for_audit(ws: Workspace) -> dict[str, object]:
    return {"name": ws.name, "user_id": ws.user_id, "job_id": ws.current_job_id, "gpus": ws.gpus}


def _owner_id(session: Session, principal: Principal, user: str | None) -> tuple[int, str]:
    """The user whose workspaces are meant: the caller, or (admins only) another user."""
    if user is None or user == principal.name:
        return principal.user_id, principal.name
    if not principal.is_admin:
        raise Forbidden("only an administrator may act on another user's workspaces")
    user_id = session.scalar(select(User.id).where(User.name == user))
    if user_id is None:
        raise NotFound(f"there is no user named {user!r}")
    return user_id, user


def _find(session: Session, principal: Principal, name: str, user: str | None) -> tuple[Workspace, str]:
    user_id, owner = _owner_id(session, principal, user)
    ws = session.scalar(select(Workspace).where(Workspace.user_id == user_id, Workspace.name == name))
    if ws is None:
        raise NotFound(f"{owner} has no workspace named {name!r}; `corral ws ls` lists them")
    return ws, owner


def _group_name(session: Session, group_id: int) -> str:
    return session.scalar(select(Group.name).where(Group.id == group_id)) or ""


def list_workspaces(
    session: Session,
    principal: Principal,
    settings: Settings,
    *,
    user: str | None = None,
    all_users: bool = False,
) -> list[WorkspaceView]:
    """The workspaces with their owners, groups, current jobs and group policies in one read,
    however many there are (before, each workspace read its job, policy and idle stop apart)."""
    stmt = (
        select(Workspace, User.name, Group.name, Job, WorkspaceGroupPolicy)
        .join(User, User.id == Workspace.user_id)
        .join(Group, Group.id == Workspace.group_id)
        .outerjoin(Job, Job.id == Workspace.current_job_id)
        .outerjoin(WorkspaceGroupPolicy, WorkspaceGroupPolicy.group_id == Workspace.group_id)
        .order_by(User.name, Workspace.name)
    )
    if all_users:
        if not principal.is_admin:
            raise Forbidden("only an administrator may list every user's workspaces")
    else:
        user_id, _ = _owner_id(session, principal, user)
        stmt = stmt.where(Workspace.user_id == user_id)
    rows = session.execute(stmt)
    return [_view_of(settings, ws, owner, group, job, policy) for ws, owner, group, job, policy in rows]


def get_workspace(
    session: Session, principal: Principal, settings: Settings, name: str, user: str | None = None
) -> WorkspaceView:
    ws, owner = _find(session, principal, name, user)
    return _view(session, settings, ws, owner, _group_name(session, ws.group_id))


def _default_name(session: Session, user_id: int) -> str:
    taken = set(session.scalars(select(Workspace.name).where(Workspace.user_id == user_id)))
    n = 1
    while (name := "workspace" if n == 1 else f"workspace-{n}") in taken:
        n += 1
    return name


def _job_spec(ws: Workspace, group: str, settings: Settings, timeout_s: float) -> JobSpecV1:
    resources = ResourcesV1(gpus=ws.gpus, gpu_model=ws.gpu_model, cpus=ws.cpus, memory=ws.memory_mib)
    idle = IdleGpuV1.model_validate(
        {
            "below_percent": settings.workspace_idle_below_percent,
            "for": format_seconds(timeout_s),
            "grace": format_seconds(settings.workspace_idle_grace_s),
            "action": "stop",
        }
    )
    return JobSpecV1(
        name=f"ws-{ws.name}"[:128],
        group=group,
        environment=ws.environment,
        preemptible=False,
        kind="workspace",
        tasks={"main": TaskV1(resources=resources, command=LAUNCH_COMMAND)},
        env={
            "CORRAL_WORKSPACE": ws.name,
            "CORRAL_WORKSPACE_BASE_URL": f"/ws/{ws.id}/",
            **_listen_env(settings),
        },
        idle_gpu=idle,
        # The owner's training logs, read-only at /logs/<job id>/ (corral.storage.mounts `logs`).
        mounts=[MountV1(source="logs")],
    )


def _listen_env(settings: Settings) -> dict[str, str]:
    """On Slurm the server is not on the node: JupyterLab listens on the node's address (TCP)
    instead of a Unix socket in the job's dir (corral.workspaces.launch)."""
    return {"CORRAL_WORKSPACE_LISTEN": "tcp"} if settings.engine == "slurm" else {}


def _submit(
    session: Session, principal: Principal, settings: Settings, profile: Profile, ws: Workspace, now: float
) -> None:
    """A new job for `ws` in the caller's transaction (not committed)."""
    spec, owner = _checked_spec(session, principal, settings, ws)
    try:
        view = job_service.submit_job(session, owner, spec, profile, now=now, commit=False, workspace=True)
    except Invalid as exc:
        raise _never_fits(exc, ws.name) from None
    ws.current_job_id = view["id"]
    ws.jupyter_token = secrets.token_urlsafe(32)
    ws.idle_stopped_at = None  # the idle stop was the previous job's
    ws.updated_at = now


def _checked_spec(
    session: Session, principal: Principal, settings: Settings, ws: Workspace
) -> tuple[JobSpecV1, Principal]:
    """The job spec of a start of `ws`, its environment checked, and whom it runs as."""
    group = _group_name(session, ws.group_id)
    spec = _job_spec(ws, group, settings, idle_timeout_s(session, settings, ws))
    owner = principal
    if ws.user_id != principal.user_id:  # an admin starts another user's workspace: it runs as theirs
        owner = _principal_of(session, ws.user_id)
    # As `POST /jobs` does: an unknown environment is refused here (422), not left to fail at
    # every launch as a platform loss; a catalogue one is pinned (`sklearn` -> `sklearn@2`).
    spec = check_job_environment(session, owner, spec)
    check_workspace_environment(session, spec.environment)
    return spec, owner


def _check_startable(
    session: Session,
    principal: Principal,
    settings: Settings,
    profile: Profile,
    ws: Workspace,
    group: job_service.GroupRef,
) -> None:
    """What a start would check before it submits, for a workspace created stopped: its
    environment, and the fit a job is checked for at submit (the cluster, its group's quota),
    with the same words. A size no start could ever run was accepted and failed at every start."""
    spec, owner = _checked_spec(session, principal, settings, ws)
    try:
        job_service.check_fits(session, spec, group, owner.name, profile)
    except Invalid as exc:
        raise _never_fits(exc, ws.name) from None


def _never_fits(exc: Invalid, name: str) -> Invalid:
    """The quota check's refusal speaks of "this job" and of it being "not preemptible": to a
    workspace's user (who never wrote a job spec, and whose workspace is never preemptible) it
    says which workspace, and what to change. Other refusals pass as they are."""
    if exc.loc != ("body", "tasks") or not exc.message.startswith("this job can never run"):
        return exc
    # Its one task is the job's inside ("task main needs 9 GPUs"): the workspace itself needs them.
    text = (
        f"workspace {name!r} {exc.message.removeprefix('this job ').replace('task main needs', 'it needs')}"
    )
    if "not preemptible" in exc.message:
        text += (
            ". A workspace is never preemptible: its GPUs must be ones its group guarantees. "
            "Pick a group that guarantees them (--group) or ask for fewer (--gpus)"
        )
    # The whole request, not the field `tasks` of a job spec the user never wrote ("error:
    # tasks: workspace 'nb' can never run ...").
    return Invalid(text, ("body",))


def _principal_of(session: Session, user_id: int) -> Principal:
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"the owner (user {user_id}) of this workspace no longer exists")
    return load_principal(session, user, via="token")


def check_idle_timeout(session: Session, settings: Settings, group_id: int, seconds: float | None) -> None:
    if seconds is None:
        return
    policy = session.get(WorkspaceGroupPolicy, group_id)
    _, maximum = _limits(settings, policy)
    if seconds > maximum:
        group = session.get(Group, group_id)
        name = group.name if group is not None else str(group_id)
        whose = "the group's" if policy is not None and policy.max_idle_timeout_s else "the server's"
        raise Invalid(
            f"idle_timeout {duration_text(seconds)} is more than group {name}'s maximum, "
            f"{duration_text(maximum)} ({whose}): ask for {duration_text(maximum)} or less",
            ("body", "idle_timeout"),
        )


def create_workspace(
    session: Session, principal: Principal, settings: Settings, profile: Profile, req: WorkspaceRequest
) -> WorkspaceView:
    """Create (and unless `start` is false, start) a workspace; commits both or nothing."""
    now = time.time()
    name = req.name or _default_name(session, principal.user_id)
    if not NAME_RE.match(name):
        raise Invalid(
            f"workspace name {name!r} must be up to 63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            ("body", "name"),
        )
    if JOB_LOGIN_RE.match(name):
        raise Invalid(
            f"workspace name {name!r} reads as a job in SSH logins ({principal.name}+{name} enters "
            "that job); pick another name",
            ("body", "name"),
        )
    if req.gpu_model and not req.gpus:  # it was kept, shown as "no GPU (H100)", and meant nothing
        raise Invalid(
            f"gpu_model {req.gpu_model!r} chooses the model of the workspace's GPUs, but it asks for "
            "none: ask for some (--gpus N) or leave the model out",
            ("body", "gpu_model"),
        )
    taken = select(Workspace.id).where(Workspace.user_id == principal.user_id, Workspace.name == name)
    if session.scalar(taken) is not None:
        raise Conflict(f"you already have a workspace named {name!r}; pick another name or `corral ws rm` it")
    group = job_service.resolve_group(session, principal, req.group)
    check_idle_timeout(session, settings, group.id, req.idle_timeout_s)
    ws = Workspace(
        name=name,
        user_id=principal.user_id,
        group_id=group.id,
        gpus=req.gpus,
        gpu_model=req.gpu_model,
        cpus=req.cpus,
        memory_mib=req.memory_mib,
        environment=req.environment,
        idle_timeout_s=req.idle_timeout_s,
        jupyter_token=secrets.token_urlsafe(32),
        reclaimed_gpu_hours=0.0,
        created_at=now,
        updated_at=now,
    )
    try:
        session.add(ws)
        session.flush()  # its id is in the job's base URL
        if req.start:
            _submit(session, principal, settings, profile, ws, now)
        else:  # refused now as at a start: `ws create --stopped` kept a workspace none could start
            _check_startable(session, principal, settings, profile, ws, group)
        audit.record(
            session,
            actor=principal,
            action="workspace.create",
            target_kind="workspace",
            target_id=ws.id,
            after=_state_for_audit(ws),
        )
        session.commit()
    except Exception:
        session.rollback()  # a start that does not fit leaves no workspace behind
        raise
    return _view(session, settings, ws, principal.name, group.name)


def start_workspace(
    session: Session, principal: Principal, settings: Settings, profile: Profile, name: str, user: str | None
) -> WorkspaceView:
    ws, owner = _find(session, principal, name, user)
    job = session.get(Job, ws.current_job_id) if ws.current_job_id is not None else None
    if job is not None and job.state in ACTIVE:
        raise Conflict(f"workspace {name!r} is already {workspace_state(job)} (job {job.id})")
    before = _state_for_audit(ws)
    try:
        _claim_start(session, ws, name)
        _submit(session, principal, settings, profile, ws, time.time())
        audit.record(
            session,
            actor=principal,
            action="workspace.start",
            target_kind="workspace",
            target_id=ws.id,
            before=before,
            after=_state_for_audit(ws),
        )
        session.commit()
    except Exception:
        session.rollback()
        raise
    return _view(session, settings, ws, owner, _group_name(session, ws.group_id))


def _claim_start(session: Session, ws: Workspace, name: str) -> None:
    """Compare-and-set on the job the start replaces: of two starts at once (both saw it ended),
    the second waits on the first's row lock and then matches nothing (409), where both used to
    submit a job and one of the two ran on, owned by no workspace (bench/fuzz_api.py, admin)."""
    previous = Workspace.current_job_id
    same = previous.is_(None) if ws.current_job_id is None else previous == ws.current_job_id
    claimed = session.execute(
        update(Workspace).where(Workspace.id == ws.id, same).values(updated_at=Workspace.updated_at)
    )
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"workspace {name!r} is being started by another request")


def stop_workspace(
    session: Session, principal: Principal, settings: Settings, name: str, user: str | None
) -> WorkspaceView:
    """Cancel the running job (the loops stop it; files stay). 409 when it is not running."""
    ws, owner = _find(session, principal, name, user)
    job = session.get(Job, ws.current_job_id) if ws.current_job_id is not None else None
    if job is None or job.state not in ACTIVE:
        raise Conflict(f"workspace {name!r} is already stopped; `corral ws start {name}` starts it")
    before = _state_for_audit(ws)
    job_service.cancel_job(session, principal, job.id)  # commits, with its own audit record
    audit.record(
        session,
        actor=principal,
        action="workspace.stop",
        target_kind="workspace",
        target_id=ws.id,
        before=before,
    )
    session.commit()
    return _view(session, settings, ws, owner, _group_name(session, ws.group_id))


def remove_workspace(session: Session, principal: Principal, name: str, user: str | None) -> None:
    """Stop it if it runs, then delete it. The files in the user's home stay."""
    ws, _owner = _find(session, principal, name, user)
    job = session.get(Job, ws.current_job_id) if ws.current_job_id is not None else None
    if job is not None and job.state in ACTIVE and not job.cancel_requested:
        job_service.cancel_job(session, principal, job.id)
    audit.record(
        session,
        actor=principal,
        action="workspace.remove",
        target_kind="workspace",
        target_id=ws.id,
        before=_state_for_audit(ws),
    )
    session.delete(ws)
    session.commit()


# -- policies (admin) -------------------------------------------------------------------------


class PolicyView(TypedDict):
    group: str
    default_idle_timeout_s: float
    max_idle_timeout_s: float
    # whose each value is: "group" (set for the group) or "server" (CORRAL_WORKSPACE_*)
    default_idle_timeout_source: str
    max_idle_timeout_source: str


# set_policy's "leave this value as it is" (an API body that omits the field)
KEEP = ...


def _policy_view(session: Session, settings: Settings, group: str, group_id: int) -> PolicyView:
    default, maximum = group_limits(session, settings, group_id)
    policy = session.get(WorkspaceGroupPolicy, group_id)
    own_default = policy is not None and bool(policy.default_idle_timeout_s)
    own_max = policy is not None and bool(policy.max_idle_timeout_s)
    return {
        "group": group,
        "default_idle_timeout_s": default,
        "max_idle_timeout_s": maximum,
        "default_idle_timeout_source": "group" if own_default else "server",
        "max_idle_timeout_source": "group" if own_max else "server",
    }


def list_policies(session: Session, settings: Settings, principal: Principal) -> list[PolicyView]:
    """Every group's for an admin; the caller's groups' otherwise (names of the others are not
    disclosed: accounts.visible_group)."""
    stmt = select(Group.id, Group.name).order_by(Group.name)
    if not principal.is_admin:
        stmt = stmt.where(Group.id.in_(list(principal.group_roles)))
    groups = session.execute(stmt).all()
    return [_policy_view(session, settings, group, group_id) for group_id, group in groups]


def set_policy(
    session: Session,
    principal: Principal,
    settings: Settings,
    group: str,
    default_s: float | EllipsisType | None = KEEP,
    max_s: float | EllipsisType | None = KEEP,
) -> PolicyView:
    """Each value given replaces the group's (None: back to the server's); one left at KEEP stays
    as it is, so changing the default keeps the group's maximum and the other way round."""
    if not principal.is_admin:
        raise Forbidden("only an administrator may set workspace idle timeouts")
    group_id = session.scalar(select(Group.id).where(Group.name == group))
    if group_id is None:
        raise NotFound(f"there is no group named {group!r}")
    policy = session.get(WorkspaceGroupPolicy, group_id)
    before = None
    if policy is None:
        policy = WorkspaceGroupPolicy(group_id=group_id)
        session.add(policy)
    else:
        before = {"default": policy.default_idle_timeout_s, "max": policy.max_idle_timeout_s}
    default_kept, max_kept = isinstance(default_s, EllipsisType), isinstance(max_s, EllipsisType)
    default_s = policy.default_idle_timeout_s if isinstance(default_s, EllipsisType) else default_s
    max_s = policy.max_idle_timeout_s if isinstance(max_s, EllipsisType) else max_s
    if default_s is not None and max_s is not None and default_s > max_s:
        _refuse_default_over_max(group, default_s, max_s, default_kept, max_kept)
    policy.default_idle_timeout_s = default_s
    policy.max_idle_timeout_s = max_s
    audit.record(
        session,
        actor=principal,
        action="workspace.policy.set",
        target_kind="group",
        target_id=group,
        before=before,
        after={"default": default_s, "max": max_s},
    )
    session.commit()
    return _policy_view(session, settings, group, group_id)


def _refuse_default_over_max(
    group: str, default_s: float, max_s: float, default_kept: bool, max_kept: bool
) -> None:
    """The refusal names the field the caller gave (the other may be the group's, kept) and the
    values as people write them ("5h", not "18000s")."""
    default, maximum = duration_text(default_s), duration_text(max_s)
    if default_kept and not max_kept:
        raise Invalid(
            f"max_idle_timeout {maximum} given is less than group {group}'s default_idle_timeout "
            f"{default}, kept (lower the default too)",
            ("body", "max_idle_timeout"),
        )
    if max_kept and not default_kept:
        raise Invalid(
            f"default_idle_timeout {default} given is more than group {group}'s max_idle_timeout "
            f"{maximum}, kept (raise the maximum too)",
            ("body", "default_idle_timeout"),
        )
    raise Invalid(
        f"default_idle_timeout {default} is more than max_idle_timeout {maximum}",
        ("body", "default_idle_timeout"),
    )


def parse_timeout(text: str | None, field: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise Invalid(str(exc), ("body", field)) from exc


# -- for the proxy, the SSH gateway, dispatch and the idle policy -------------------------------


def current_job_id(session: Session, owner: str, name: str) -> int | None:
    """The id of the workspace's running job; None when it is stopped (or not running yet) or
    there is no such workspace. The SSH gateway's entry point."""
    row = session.execute(
        select(Job.id)
        .join(Workspace, Workspace.current_job_id == Job.id)
        .join(User, User.id == Workspace.user_id)
        .where(User.name == owner, Workspace.name == name, Job.state == JobState.RUNNING.value)
    ).first()
    return row[0] if row is not None else None


def not_running(session: Session, owner: str, name: str) -> tuple[bool, int | None]:
    """Of a workspace that is not running: whether it exists, and its job while that is still
    queued or launching (None: stopped). The SSH gateway says which."""
    found = session.execute(
        select(Workspace.id, Job.id, Job.state)
        .join(User, User.id == Workspace.user_id)
        .outerjoin(Job, Job.id == Workspace.current_job_id)
        .where(User.name == owner, Workspace.name == name)
    ).first()
    if found is None:
        return False, None
    _, job_id, state = found
    return True, job_id if job_id is not None and not JobState(state).terminal else None


def proxy_target(session: Session, workspace_id: int) -> ProxyTarget | None:
    ws = session.get(Workspace, workspace_id)
    if ws is None:
        return None
    attempt_id = address = None
    if ws.current_job_id is not None:
        attempt = session.scalar(
            select(Attempt)
            .join(Job, Job.id == Attempt.job_id)
            .where(
                Attempt.job_id == ws.current_job_id,
                Attempt.state == AttemptState.RUNNING.value,
                Job.state == JobState.RUNNING.value,
            )
            .order_by(Attempt.number.desc())
        )
        attempt_id = attempt.attempt_id if attempt is not None else None
        rank0 = (
            min(attempt.placement, key=lambda p: p.rank)
            if attempt is not None and attempt.placement
            else None
        )
        if rank0 is not None:
            address = session.scalar(select(Node.address).where(Node.name == rank0.node))
    # Not running: still starting (queued, launching) or stopped, which the owner is told apart.
    job = session.get(Job, ws.current_job_id) if attempt_id is None and ws.current_job_id else None
    starting = job is not None and not JobState(job.state).terminal
    return ProxyTarget(
        ws.id, ws.user_id, ws.current_job_id, attempt_id, ws.jupyter_token, address, ws.name, starting
    )


# A workspace job's credential (NULL for other jobs), as a column of a read of jobs: the launch
# claim takes it with the scheduled jobs (server/dispatch.py) instead of a read of its own.
LAUNCH_TOKEN = (
    select(Workspace.jupyter_token).where(Workspace.current_job_id == Job.id).correlate(Job).scalar_subquery()
)


def record_idle_stop(session: Session, job_id: int, gpu_hours: float, now: float) -> None:
    """The idle policy stopped `job_id`: the workspace whose current job it is (none: a batch job,
    nothing to do) records when (`corral ws ls/show` say so until the next start) and adds the
    GPU-hours it gave back. In the transaction that requests the cancel (corral.monitor.idle);
    the caller commits."""
    ws = session.scalar(select(Workspace).where(Workspace.current_job_id == job_id))
    if ws is not None:
        ws.reclaimed_gpu_hours += gpu_hours
        ws.idle_stopped_at = now


def workspace_job_ids(session: Session) -> dict[int, int]:
    """{job id: workspace id} of the workspaces' current jobs."""
    rows = session.execute(
        select(Workspace.current_job_id, Workspace.id).where(Workspace.current_job_id.is_not(None))
    )
    return {job_id: ws_id for job_id, ws_id in rows if job_id is not None}
