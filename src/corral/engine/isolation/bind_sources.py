"""Bind sources handed to bwrap as open directories, not as names (local engine).

A mount source such as `group/<g>/<sub>` is a path inside a dir every member of the group may
write: the server checks it (no symlink anywhere, storage/mounts.py) when the job is submitted
and again when the launch is prepared, but bwrap runs later, as root, and a `--bind <path>` would
resolve the path by name, following symlinks on the host, at the moment it mounts. A member who
swapped `<sub>` for a symlink in between would get any host directory bound into the job.

So the sandbox's argv names such a source with `--bind-fd`/`--ro-bind-fd` and its host path as
a placeholder (sandbox.py, `SandboxSpec.mounts_by_fd`), and the supervisor, the root process that
runs bwrap, opens each one just before it forks the instances: from `/`, one component at a
time, each opened relative to the previous one with O_PATH|O_NOFOLLOW|O_DIRECTORY. A symlink or
a non-directory anywhere on the way refuses the launch, naming the mount. The instance's child
puts the fd's number in place of the placeholder and keeps the fd open across exec (a dup for a
source bound twice: bwrap closes each bind's fd); bwrap binds
`/proc/self/fd/<n>` (the directory the fd holds, whatever its name points to by then) and closes
it before the job runs. A swap after the open changes nothing.

Imported by the supervisor at every job start: the standard library's `os` only.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

FD_BIND_OPTIONS = ("--bind-fd", "--ro-bind-fd")
_OPEN_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_S_IFMT = 0o170000
_S_IFDIR = 0o040000
_S_IFLNK = 0o120000
MAX_FD = 4096  # the child closes every fd below this but the ones it hands bwrap


class BindSourceRefused(Exception):
    """A bind source that cannot be opened safely; the message names the mount and why."""


def fd_bind_indexes(argv: Sequence[str]) -> list[int]:
    """Where in a bwrap argv the sources of `--bind-fd`/`--ro-bind-fd` stand (host paths, to be
    replaced by fd numbers): bwrap's options only, i.e. before the first `--`."""
    end = argv.index("--") if "--" in argv else len(argv)
    return [i + 1 for i in range(end - 1) if argv[i] in FD_BIND_OPTIONS]


def open_dir_nofollow(path: str) -> int:
    """An O_PATH fd (close-on-exec) of the directory `path`, reached from `/` one component at a
    time without following any symlink. BindSourceRefused saying which component is wrong."""
    if not path.startswith("/") or "\x00" in path:
        raise BindSourceRefused(f"{path!r} is not an absolute path")
    parts = [p for p in path.split("/") if p]
    if "." in parts or ".." in parts:
        raise BindSourceRefused(f"{path!r} is not a plain path ('.' or '..' in it)")
    fd = os.open("/", _OPEN_FLAGS)
    walked = ""
    try:
        for part in parts:
            walked += "/" + part
            try:
                nxt = os.open(part, _OPEN_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise BindSourceRefused(f"{walked} {_why_not(part, fd, exc)}") from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _why_not(name: str, dir_fd: int, exc: OSError) -> str:
    """Why `name` in `dir_fd` could not be opened as a directory without following it."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "does not exist"
    except OSError:
        return f"cannot be opened ({exc.strerror})"
    kind = st.st_mode & _S_IFMT
    if kind == _S_IFLNK:
        return "is a symlink (never followed into a bind)"
    if kind != _S_IFDIR:
        return "is not a directory"
    return f"cannot be opened ({exc.strerror})"


def open_sources(argvs: Iterable[Sequence[str]], indexes: Iterable[Sequence[int]]) -> dict[str, int]:
    """{host path: fd} of every fd-bound source of the given argvs (each opened once), or
    BindSourceRefused naming the first mount that cannot be opened; nothing stays open then."""
    fds: dict[str, int] = {}
    try:
        for argv, where in zip(argvs, indexes, strict=True):
            for i in where:
                source = argv[i]
                if source in fds:
                    continue
                try:
                    fds[source] = open_dir_nofollow(source)
                except BindSourceRefused as exc:
                    raise BindSourceRefused(f"mount {source} -> {argv[i + 1]}: {exc}") from None
    except BaseException:
        close_all(fds.values())
        raise
    return fds


def close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def hand_over(argv: Sequence[str], indexes: Sequence[int], fds: Mapping[str, int]) -> list[str]:
    """In an instance's child, before its exec: the argv with each fd-bound source replaced by
    an fd of it, every other fd from 3 up closed and those kept open across the exec. bwrap
    closes each bind's fd once it is bound, so a source bound twice gets a second fd (a dup)."""
    out = list(argv)
    keep: set[int] = set()
    for i in indexes:
        fd = fds[argv[i]]
        if fd in keep:
            fd = os.dup(fd)
        keep.add(fd)
        out[i] = str(fd)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        os.set_inheritable(fd, True)
        low = fd + 1
    os.closerange(low, MAX_FD)
    return out
