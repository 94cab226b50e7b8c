"""What one job gets from storage when it is launched: its uid and group gids, its binds (home,
the user's groups, the spec's mounts, the `--code` snapshot, the outputs dir) and the dirs to make
first. Built by the dispatch loop for a batch of jobs with a few queries (server/dispatch.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy import and_, bindparam, select
from sqlalchemy.orm import Session, aliased

from corral.config import Settings
from corral.db.models import Group, Job, Membership, User
from corral.db.storage_models import StorageIdentity
from corral.environments.mounts import plan_environments
from corral.environments.store import environment_place
from corral.spec import JobSpecV1
from corral.storage import code
from corral.storage.identities import IdRange, IdsExhausted, allocate_missing
from corral.storage.layout import StorageDir, StorageError, job_logs_dir, outputs_dir
from corral.storage.mounts import (
    SANDBOX_CODE,
    SANDBOX_OUTPUTS,
    Bind,
    MountContext,
    MountRefused,
    default_binds,
    resolve_all,
    seen_through,
)

log = logging.getLogger("corral.storage.plan")


@dataclass(frozen=True, slots=True)
class JobStorage:
    uid: int
    gids: tuple[int, ...]
    binds: tuple[Bind, ...] = ()
    cwd: str | None = None
    home: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    refused: str = ""
    # The job's catalogue environment (corral.environments.mounts): the dir first on PATH, the
    # dirs bound read-only at their own paths, and a build job's outbound network.
    environment_bin: str = ""
    environment_paths: tuple[str, ...] = ()
    network_outbound: str = ""
    log_dir: str = ""  # the job's dir in the owner's logs dir (the `logs` source)


def id_ranges(settings: Settings) -> tuple[IdRange, IdRange]:
    uids = IdRange.parse("CORRAL_UID_RANGE", settings.uid_range)
    gids = IdRange.parse("CORRAL_GID_RANGE", settings.gid_range)
    if uids.overlaps(gids):
        raise ValueError(
            f"CORRAL_UID_RANGE {settings.uid_range} and CORRAL_GID_RANGE {settings.gid_range} overlap"
        )
    return uids, gids


_UID = aliased(StorageIdentity, name="uid")
_GID = aliased(StorageIdentity, name="gid")
# Each user's groups with the uid and gids given so far, in one read (was three: the memberships,
# then the users' and the groups' numbers apart). A number is matched on the subject's id and
# created_at, as identities._lookup matches it (a re-made user or group gets a new one). Read in
# the launch claim's own transaction, never kept: a number allocated by a transaction that rolled
# back is never seen, and one given since by another server is read by the next claim.
MEMBERS_AND_IDS = (
    select(User.id, _UID.number, Group, _GID.number)
    .select_from(User)
    .outerjoin(Membership, Membership.user_id == User.id)
    .outerjoin(Group, Group.id == Membership.group_id)
    .outerjoin(
        _UID,
        and_(_UID.kind == "user", _UID.subject_id == User.id, _UID.subject_created_at == User.created_at),
    )
    .outerjoin(
        _GID,
        and_(_GID.kind == "group", _GID.subject_id == Group.id, _GID.subject_created_at == Group.created_at),
    )
    .where(User.id.in_(bindparam("user_ids", expanding=True)))
)


@dataclass(slots=True)
class Members:
    """What MEMBERS_AND_IDS read for a batch of users."""

    groups_of: dict[int, list[Group]] = field(default_factory=dict)  # {user id: their groups}
    uids: dict[int, int] = field(default_factory=dict)  # {user id: uid}, those given so far
    gids: dict[int, int] = field(default_factory=dict)  # {group id: gid}, those given so far


def members_and_ids(session: Session, user_ids: Sequence[int]) -> Members:
    out = Members()
    for user_id, uid, group, gid in session.execute(MEMBERS_AND_IDS, {"user_ids": sorted(set(user_ids))}):
        groups = out.groups_of.setdefault(user_id, [])
        if uid is not None:
            out.uids[user_id] = uid
        if group is None:  # a user in no group: the outer join's one row
            continue
        if all(g.id != group.id for g in groups):
            groups.append(group)
        if gid is not None:
            out.gids[group.id] = gid
    return out


def plan_jobs(
    session: Session, jobs: Sequence[Job], settings: Settings, builds: Mapping[int, str]
) -> dict[int, JobStorage]:
    """{job id: its storage}. Allocates missing uids/gids in `session` (the caller commits).
    `builds`: the environment builds among `jobs` as the caller read them (plan_environments)."""
    if not jobs:
        return {}
    root = settings.storage_path
    members = members_and_ids(session, [j.user_id for j in jobs])
    groups_of = members.groups_of
    users: dict[int, User] = {j.user_id: j.user for j in jobs}
    all_groups = {g.id: g for gs in groups_of.values() for g in gs}
    uid_range, gid_range = id_ranges(settings)
    try:
        uids, gids = allocate_missing(
            session, users.values(), all_groups.values(), members.uids, members.gids, uid_range, gid_range
        )
    except IdsExhausted as exc:  # the launches fail saying so; the loop itself goes on
        log.error("storage: %s", exc)
        return {j.id: JobStorage(0, (), refused=f"storage: {exc}") for j in jobs}
    plans = {}
    contexts = {}
    for job in jobs:
        groups = groups_of.get(job.user_id, [])
        group_gids = {g.name: gids[g.id] for g in groups}
        ctx = contexts[job.id] = MountContext(
            job.user.name, frozenset(group_gids), root, job.user.is_admin, session
        )
        plans[job.id] = _plan_one(job, ctx, uids[job.user_id], group_gids, build=job.id in builds)
    for job_id, env in plan_environments(jobs, contexts, settings, builds).items():
        plan = plans[job_id]
        if isinstance(env, str):
            plans[job_id] = replace(plan, refused=plan.refused or env)
        elif not plan.refused:
            plans[job_id] = replace(
                plan,
                binds=(*plan.binds, *env.binds),
                environment_bin=env.bin_dir,
                environment_paths=env.paths,
                network_outbound=env.network_outbound,
            )
    return plans


def resolve_spec_mounts(ctx: MountContext, spec: JobSpecV1) -> list[Bind]:
    """A spec's mounts resolved and checked together, none on or around the place its own
    environment is bound (checked at submit by services.storage and again at launch here)."""
    return resolve_all(
        ctx,
        [(m.source, m.target or "", m.mode == "ro") for m in spec.mounts],
        environment_place(spec.environment),
    )


def _plan_one(
    job: Job, ctx: MountContext, uid: int, group_gids: dict[str, int], *, build: bool
) -> JobStorage:
    """One job's binds and env. An environment's build job gets no home and no group dirs: it
    needs neither (its uv cache is in its work dir), and a file the user left there (a `.pth`
    in ~/.local, a poisoned uv cache) would run in, or feed, a job with the index's network
    whose venv goes into the store (docs/catalogues.md, "Build jobs are closed")."""
    gids = tuple(sorted(group_gids.values()))
    try:
        spec_binds = resolve_spec_mounts(ctx, job.spec)
        binds = [] if build else default_binds(ctx, group_gids)
    except (MountRefused, StorageError) as exc:
        return JobStorage(uid, gids, refused=f"storage: {exc}")
    taken = {b.target for b in spec_binds}
    binds = [b for b in binds if b.target not in taken]
    binds += [b for b in spec_binds if not seen_through(b, binds)]
    env = {"CORRAL_OUTPUTS": SANDBOX_OUTPUTS}
    cwd = None
    if job.spec.code:
        snapshot = code.snapshot_dir(ctx.root, job.spec.code)
        if not snapshot.is_dir():
            return JobStorage(uid, gids, refused=f"storage: code snapshot {job.spec.code} is gone")
        binds.append(Bind(str(snapshot), SANDBOX_CODE, True, f"code/{job.spec.code}"))
        env["CORRAL_CODE"] = cwd = SANDBOX_CODE
    out = outputs_dir(ctx.root, job.id)
    binds.append(
        Bind(str(out), SANDBOX_OUTPUTS, False, "outputs", (StorageDir(str(out), "user", None, 0o700),))
    )
    home = next((b.target for b in binds if b.source == "home"), None)
    logs = str(job_logs_dir(ctx.root, ctx.user, job.id))
    return JobStorage(uid, gids, tuple(binds), cwd, home, env, log_dir=logs)
