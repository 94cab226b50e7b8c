"""Where built environments live: `<storage root>/env/store/<cache key>/`, one read-only copy
(root's, no write bit anywhere) per distinct lock and cache domain (buildstep.cache_key), shared
by every version whose build resolved to that lock in that domain. Standard library only below
the storage layer; both engines read these paths.

A copy enters the store by `ingest`: the build job's venv (in its outputs dir, owned by the
job's uid) is renamed to a temporary name inside the store, made root's and read-only, then
renamed to its key: a crash leaves a `.incoming-*` dir that `gc` removes, never a half copy
under a key."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from pathlib import Path

DEFAULT_ENVIRONMENT = "default"  # the server's own interpreter and packages (engine built-in)
SANDBOX_ENV = "/env"  # a job's environment is bound read-only at /env/<name>
BUILD_STORE = "/corral/env-store"  # the store, read-only, in a build job (its cache check)
BUILD_FIND_LINKS = "/corral/find-links"  # CORRAL_ENV_FIND_LINKS, read-only, in a build job
INCOMING = ".incoming-"
KEY_LEN = 64


def environment_place(environment: str) -> dict[str, str]:
    """{where the job's environment is bound: what it is} for a spec's `environment` ("name" or
    "name@3"); none for the server's own. The spec's mounts may not go there (corral.storage.mounts)."""
    name = environment.partition("@")[0]
    if name == DEFAULT_ENVIRONMENT:
        return {}
    return {f"{SANDBOX_ENV}/{name}": f"the job's environment {name!r}"}


def base_python() -> str:
    """The interpreter environments are built for: the server's base interpreter (a venv's
    `bin/python` is a symlink to it), which must exist at the same path on every node."""
    return os.path.realpath(os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}"))


def base_prefix() -> str:
    return os.path.realpath(sys.base_prefix)


def store_dir(root: Path) -> Path:
    return root / "env" / "store"


def copy_dir(root: Path, key: str) -> Path:
    if len(key) != KEY_LEN or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"environment cache key {key!r} is not a sha256 hex digest")
    return store_dir(root) / key


def ensure_store(root: Path) -> Path:
    path = store_dir(root)
    path.mkdir(mode=0o755, exist_ok=True)
    os.chmod(path, 0o755)
    return path


def _make_read_only(top: Path) -> None:
    """Root's (when we are root), r-x for all on dirs, r-- (r-x if executable) on files; links
    left as they are (lchown, never followed)."""
    as_root = os.geteuid() == 0
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            _settle_entry(os.path.join(dirpath, name), as_root)
    _settle_entry(str(top), as_root)


def _settle_entry(path: str, as_root: bool) -> None:
    """One entry of a build's venv, made root's and read-only through a descriptor of its own,
    never by name (the job's uid owned the tree: a name may have been swapped for a symlink). A
    file with other hard links is removed: the build copies every file (UV_LINK_MODE=copy), so a
    link was made on purpose (the owner can write the build's outputs: on Slurm from their login
    shell) to a file elsewhere, another member's in a group dir say, which would have become
    root's and read-only."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if as_root:
            os.lchown(path, 0, 0)
        return
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) or (
        stat.S_ISREG(st.st_mode) and st.st_nlink > 1
    ):  # a fifo, socket or device has no place in an environment; nor a shared file
        os.unlink(path)
        return
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        now = os.fstat(fd)
        if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev) or now.st_nlink != st.st_nlink:
            raise OSError(f"{path} changed while the environment was being settled")
        if as_root:
            os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o555 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111 else 0o444)
    finally:
        os.close(fd)


def ingest(root: Path, key: str, venv: Path) -> bool:
    """Move a build's venv into the store under `key`; False when the key was there already (the
    venv is removed: the earlier copy is the one shared). NotADirectoryError when `venv` is no
    directory (a symlink: nothing it names is touched)."""
    final = copy_dir(root, key)
    store = ensure_store(root)
    if final.is_dir():
        shutil.rmtree(venv, ignore_errors=True)
        return False
    staging = store / f"{INCOMING}{key}-{os.getpid()}-{time.monotonic_ns()}"
    os.rename(venv, staging)  # same filesystem: the storage root
    if not stat.S_ISDIR(os.lstat(staging).st_mode):
        # Swapped for a symlink since the caller looked (on Slurm the user's login shell may
        # write their outputs dir): os.walk would go where it points, as root.
        os.unlink(staging)
        raise NotADirectoryError(f"{venv} is not a directory")
    _make_read_only(staging)
    try:
        os.rename(staging, final)
    except OSError:  # another build of the same lock got there first
        remove_tree(staging)
        return False
    return True


def remove_tree(path: Path) -> None:
    """A read-only tree: give its dirs back their write bit, then remove it."""
    for dirpath, _dirs, _files in os.walk(path):
        if not os.path.islink(dirpath):
            os.chmod(dirpath, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def gc(root: Path, referenced: set[str], *, min_age_s: float, now: float | None = None) -> list[str]:
    """Remove the store copies no version names and the leftovers of interrupted ingests, when
    older than `min_age_s` (a build that just checked for its key is not robbed of it)."""
    store = store_dir(root)
    if not store.is_dir():
        return []
    now = time.time() if now is None else now
    removed = []
    for entry in os.scandir(store):
        if entry.name in referenced:
            continue
        if now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
            continue
        remove_tree(Path(entry.path))
        removed.append(entry.name)
    return removed
