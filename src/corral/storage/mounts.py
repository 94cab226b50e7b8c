"""The one mount mechanism: a registry of mount sources, used at submit (rights, existence) and at
launch (host paths) by both engines. The local engine binds each `Bind` with bubblewrap
(`--bind`/`--ro-bind`); the Slurm engine writes the same binds into the rank script, whose bwrap
binds the same paths of the shared storage root on the node.

A source is `<prefix>[/<ref>]` (`home`, `group/vision/sub`, `data/cifar@3`). Each prefix has a
resolver, registered once at import of its module:

    register_source("data", resolve_dataset)

    def resolve_dataset(ctx: MountContext, req: MountRequest) -> Bind: ...

The built-in resolvers are pure: they read only `ctx` (who mounts, their groups, the root) and
the request, may look at the filesystem, and raise MountRefused naming the source when the user
may not have it or it does not exist. Catalogue sources (`data/`: corral.datasets.mounts) also read
their rows through `ctx.session`, the caller's database session (submit and launch both have one).
A resolver returns the host path, the target in the sandbox
(`req.target`, or its own default when that is empty), read-only or not, the exact source it
resolved (recorded in the job's spec: `data/cifar` -> `data/cifar@3`, the lineage of the job)
and the dirs to make on first use.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from corral.storage.layout import (
    StorageDir,
    StorageError,
    check_name,
    check_subpath,
    group_dir,
    home_dir,
    logs_dir,
    through_symlink,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

SANDBOX_HOME = "/home"
SANDBOX_GROUP = "/group"
SANDBOX_CODE = "/code"
SANDBOX_OUTPUTS = "/outputs"
SANDBOX_LOGS = "/logs"
# Where a job's mounts may not go: the system, the sandbox's own dirs, and Corral's fixed binds.
RESERVED_TARGETS = (
    "/proc", "/dev", "/sys", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/run", "/tmp", "/job", SANDBOX_CODE, SANDBOX_OUTPUTS,
)  # fmt: skip
MAX_MOUNTS = 32


class MountRefused(ValueError):
    """A mount that cannot be served. forbidden: the user lacks the right (403), else the
    request itself is wrong (400, unknown source, bad path)."""

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.forbidden = forbidden


@dataclass(frozen=True, slots=True)
class MountContext:
    user: str
    groups: frozenset[str]  # every group the user is a member of
    root: Path  # the storage root
    is_admin: bool = False
    session: Session | None = None  # for catalogue sources (datasets); None: they refuse


@dataclass(frozen=True, slots=True)
class MountRequest:
    source: str  # as written: "group/vision/sub"
    ref: str  # after the prefix: "vision/sub" ("" for "home")
    target: str  # absolute path in the sandbox, or "" for the source's default
    readonly: bool


@dataclass(frozen=True, slots=True)
class Bind:
    host_path: str
    target: str
    readonly: bool
    source: str = ""  # the exact source resolved (lineage)
    prepare: tuple[StorageDir, ...] = field(default_factory=tuple)


Resolver = Callable[[MountContext, MountRequest], Bind]
_SOURCES: dict[str, Resolver] = {}


def register_source(prefix: str, resolver: Resolver) -> None:
    """Serve mounts `<prefix>` and `<prefix>/...` with `resolver` (another module's source)."""
    check_name("mount source prefix", prefix)
    _SOURCES[prefix] = resolver


def sources() -> list[str]:
    return sorted(_SOURCES)


def plain_path(path: str) -> str:
    """`path` without a trailing '/', when that is how the kernel reads it: absolute, no NUL, no
    empty, '.' or '..' part. Else ''. `posixpath.normpath` keeps a leading '//' (POSIX leaves its
    meaning open), which the kernel reads as '/': '//usr/bin' passed every prefix test below as
    something other than /usr/bin, and bwrap then bound a user's dir over /usr/bin."""
    if "\x00" in path or not path.startswith("/"):
        return ""
    parts = path.rstrip("/").split("/")[1:]
    if not parts or any(p in ("", ".", "..") for p in parts):
        return ""
    return "/" + "/".join(parts)


def check_target(target: str) -> str:
    if "\x00" in target or not target.startswith("/"):
        raise MountRefused(f"mount target {target!r} must be an absolute path in the job")
    norm = plain_path(target)
    if not norm:
        raise MountRefused(
            f"mount target {target!r} must be a plain absolute path (no '..', '.' or '//', not '/')"
        )
    for reserved in RESERVED_TARGETS:
        if norm == reserved or norm.startswith(reserved + "/"):
            raise MountRefused(f"mount target {target!r} is reserved ({reserved} belongs to the sandbox)")
    return norm


def resolve(ctx: MountContext, source: str, target: str = "", readonly: bool = True) -> Bind:
    """One spec mount -> its Bind, or MountRefused naming the source."""
    prefix, _, ref = source.partition("/")
    resolver = _SOURCES.get(prefix)
    if resolver is None:
        raise MountRefused(
            f"mount source {source!r}: unknown source {prefix!r}; known: {', '.join(sources())}"
        )
    if target:
        target = check_target(target)
    try:
        bind = resolver(ctx, MountRequest(source, ref, target, readonly))
    except StorageError as exc:
        raise MountRefused(f"mount source {source!r}: {exc}") from exc
    check_target(bind.target)
    default = resolver(ctx, MountRequest(source, ref, "", readonly)).target if target else bind.target
    if bind.target != default and any(
        bind.target == top or bind.target.startswith(top + "/") for top in (SANDBOX_HOME, SANDBOX_GROUP)
    ):
        # Another bind's place: bwrap (root) would make the mount point inside a user's dir.
        raise MountRefused(f"mount target {target!r}: /home and /group hold only their own sources")
    if through_symlink(bind.host_path):
        raise MountRefused(f"mount source {source!r} goes through a symlink")
    if prefix == "group" and bind.readonly:
        _refuse_read_only_in_group(source, ref, bind.target)
    return bind


def _refuse_read_only_in_group(source: str, ref: str, target: str) -> None:
    """A read-only `group/<g>/<sub>` inside /group/<g>, which every job of the user gets
    read-write (default_binds), would be a mount point that bwrap (root) makes and mounts on
    through the group's dir, by name, where any member may swap a part of the path for a symlink
    in between: the bind would land wherever that points in the sandbox (over /usr/bin, before
    root runs setpriv from there). A read-write one is what the group's bind shows there already
    (plan leaves it out: seen_through)."""
    name, _, sub = ref.partition("/")
    if sub and _inside(target, f"{SANDBOX_GROUP}/{name}"):
        raise MountRefused(
            f"mount source {source!r}: read-only at {target!r} it would lie inside "
            f"{SANDBOX_GROUP}/{name}, which your jobs get read-write; give it a target of its own "
            f"(e.g. target: /mnt/{posixpath.basename(sub)}) or use mode rw"
        )


def resolve_all(
    ctx: MountContext, requests: Iterable[tuple[str, str, bool]], taken: Mapping[str, str] | None = None
) -> list[Bind]:
    """The spec's mounts (source, target, readonly), checked together: no two on one target, none
    inside another, and none on or around `taken` ({target: what the job binds there itself}, e.g.
    its environment at /env/<name>)."""
    requests = list(requests)
    binds = [resolve(ctx, source, target, readonly) for source, target, readonly in requests]
    if len(binds) > MAX_MOUNTS:
        raise MountRefused(f"{len(binds)} mounts; at most {MAX_MOUNTS} are allowed")
    seen: set[str] = set()
    for b in binds:
        if b.target in seen:
            raise MountRefused(f"two mounts on {b.target}")
        seen.add(b.target)
    placed = [(b.target, f"mount source {req[0]!r}") for b, req in zip(binds, requests, strict=True)]
    _refuse_nested(placed, taken or {})
    return binds


def _inside(inner: str, outer: str) -> bool:
    return inner.startswith(outer.rstrip("/") + "/")


def _refuse_nested(placed: list[tuple[str, str]], taken: Mapping[str, str]) -> None:
    """One mount inside another made bwrap (root) create the inner one's mount point in the
    outer one: a failed launch ("Can't mkdir /mnt/x/y: Read-only file system") inside a dataset,
    a root-owned dir left in the user's home or group dir otherwise. A mount on the job's own
    environment was hidden by it without a word. Both are refused at submit, naming the two."""
    for target, what in placed:
        for other, other_what in placed:
            if _inside(target, other):
                raise MountRefused(
                    f"{what} at {target!r} is inside {other_what} at {other!r}: "
                    "give each mount a place of its own, not one inside another"
                )
        for fixed, fixed_what in taken.items():
            if target == fixed or _inside(target, fixed) or _inside(fixed, target):
                raise MountRefused(
                    f"{what} at {target!r} overlaps {fixed!r}, where {fixed_what} is bound: "
                    "mount it elsewhere"
                )


# -- the built-in sources: home and group --------------------------------------------------------


def _home(ctx: MountContext, req: MountRequest) -> Bind:
    if req.ref:
        raise MountRefused(f"mount source {req.source!r}: 'home' takes no path (your home is 'home')")
    path = home_dir(ctx.root, ctx.user)
    prepare = (StorageDir(str(path), "user", None, 0o700),)
    target = req.target or f"{SANDBOX_HOME}/{ctx.user}"
    return Bind(str(path), target, req.readonly, "home", prepare)


def _group(ctx: MountContext, req: MountRequest) -> Bind:
    name, _, sub = req.ref.partition("/")
    if not name:
        raise MountRefused(f"mount source {req.source!r}: name the group, e.g. group/vision")
    check_name("group", name)
    if name not in ctx.groups:
        raise MountRefused(
            f"mount source {req.source!r}: you are not a member of group {name!r}", forbidden=True
        )
    path = group_dir(ctx.root, name)
    if sub:
        path = path / check_subpath("group path", sub)
        if sub != ctx.user and _missing(path):  # the user's own subdir is made on first use
            raise MountRefused(
                f"mount source {req.source!r} does not exist yet; make it first, e.g. from a job "
                f"of yours: mkdir -p {SANDBOX_GROUP}/{req.ref}"
            )
    target = req.target or f"{SANDBOX_GROUP}/{req.ref}"
    return Bind(str(path), target, req.readonly, req.source)


def _missing(path: Path) -> bool:
    """Is `path` known not to exist? A path the server may not look into (no rights to list the
    group's dir) is not: the launch, which prepares it as root, tells then."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:  # e.g. no rights to look
        pass
    return False


def _logs(ctx: MountContext, req: MountRequest) -> Bind:
    """`logs`: the user's own jobs' logs at /logs/<job id>/ (the engine links each new job's
    there, so a running workspace sees them appear); `logs/<job id>`: one job's. Only ever the
    user's own dir, and read-only: the engine writes the logs, nobody else."""
    if not req.readonly:
        raise MountRefused(f"mount source {req.source!r} is read-only: use mode ro")
    path = logs_dir(ctx.root, ctx.user)
    # root:<the user's gid> 0750: the user may read and list it, never write or plant a symlink.
    prepare = (StorageDir(str(path), "root", None, 0o750),)
    if req.ref:
        if not req.ref.isdigit():
            raise MountRefused(f"mount source {req.source!r}: name a job by its number, e.g. logs/42")
        path = path / str(int(req.ref))
        if not path.is_dir():  # the engine makes a job's dir when it launches it
            raise MountRefused(f"mount source {req.source!r}: you have no job {int(req.ref)} with logs")
    target = req.target or (f"{SANDBOX_LOGS}/{int(req.ref)}" if req.ref else SANDBOX_LOGS)
    return Bind(str(path), target, True, req.source, prepare)


register_source("home", _home)
register_source("group", _group)
register_source("logs", _logs)


def seen_through(bind: Bind, others: Iterable[Bind]) -> bool:
    """Does one of `others` show `bind` already, at its target and with its rights (a read-write
    `group/<g>/<sub>` at `/group/<g>/<sub>` within the group's own read-write bind)? Such a bind is
    left out: bound on its own it would be a mount point inside a dir the user may change."""
    for other in others:
        if other.readonly or not _inside(bind.target, other.target):
            continue
        if bind.host_path == other.host_path + bind.target[len(other.target) :] and not bind.readonly:
            return True
    return False


def default_binds(ctx: MountContext, group_gids: dict[str, int]) -> list[Bind]:
    """Mounted in every job without a spec entry: the home, and each group the user is a member
    of (that has a gid) with the user's own subdir made on first use."""
    binds = [_home(ctx, MountRequest("home", "", "", False))]
    for name in sorted(ctx.groups):
        gid = group_gids.get(name)
        if gid is None:
            continue
        path = group_dir(ctx.root, name)
        prepare = (
            StorageDir(str(path), "root", gid, 0o2770),
            StorageDir(str(path / ctx.user), "user", gid, 0o2770),
        )
        binds.append(Bind(str(path), f"{SANDBOX_GROUP}/{name}", False, f"group/{name}", prepare))
    return binds
