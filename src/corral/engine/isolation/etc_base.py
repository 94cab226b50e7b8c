"""One prepared copy of the host's whitelisted /etc, bound read-only as a sandbox's /etc in one mount.

bwrap binding each whitelisted file or dir (`ETC_WHITELIST`, 12 entries here) cost one mount each
inside every job's sandbox: ~0.9 ms of CPU per job start of ~5.2 ms for the sandbox's own part
(bwrap + setpriv; cpuacct, docs/isolation.md, "At saturation"). This module copies those entries
once into `<engine home>/etc-base/<signature>/` (root's, 0755, the host files' own modes)
with empty placeholders for the files each job binds over it (passwd, group, and the network's
resolv.conf/hosts), so a job's /etc is `--ro-bind <base> /etc` plus its own few binds.

The copy is what bind mounts showed: a top-level symlink (/etc/resolv.conf ->
/run/systemd/resolve/...) is copied as the file it names (a bind follows it; /run is not in the
sandbox), symlinks inside the copied dirs (/etc/ssl/certs/<hash>.0 -> ..., /etc/alternatives/*)
stay symlinks, read through the sandbox's own /usr. Changes on the host reach new jobs once the
signature changes: the mtime, size and inode of each whitelisted entry and of everything below it,
re-read at most every REFRESH_S seconds (a new cert, an edited hosts file, a changed time zone
all change one of them). A refresh builds a new dir beside the old one and switches to
it; the older ones are removed except the previous (a launch may be between its argv and bwrap).
One change to the copy: nsswitch.conf looks users and groups up in files only (see
_files_only_accounts). What the job could not read through a bind is not copied: a dir closed to others
(/etc/ssl/private, 0700) is left out, a file closed to others is an empty file of its mode, so
no key lands in the copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

REFRESH_S = 2.0
# Files every sandbox binds over the base (write_etc, NetworkPolicy.etc_files): a bind needs its
# target to exist in the read-only base.
PER_JOB_FILES = ("passwd", "group", "hosts", "resolv.conf")
ACCOUNT_DATABASES = ("passwd", "group", "shadow", "gshadow")  # nsswitch.conf: files only


class EtcBase:
    """The current base dir for one engine home; thread-safe (the dispatch pool launches in parallel)."""

    def __init__(self, root: Path, whitelist: Iterable[str], host_etc: str = "/etc") -> None:
        self.root = root
        self.whitelist = tuple(whitelist)
        self.host_etc = host_etc
        self._lock = threading.Lock()
        self._checked = 0.0
        self._signature = ""
        self._current: str | None = None

    def path(self) -> str:
        """The base dir to bind at /etc, rebuilt first when the host's entries changed."""
        now = time.monotonic()
        with self._lock:
            if self._current is not None and now - self._checked < REFRESH_S:
                return self._current
            self._checked = now
            signature = self._sign()
            if signature != self._signature or self._current is None or not os.path.isdir(self._current):
                self._current = self._build(signature)
                self._signature = signature
            return self._current

    def _entries(self) -> list[str]:
        return [n for n in self.whitelist if os.path.exists(os.path.join(self.host_etc, n))]

    def _sign(self) -> str:
        """A digest of the stats of every whitelisted entry (followed, as a bind would) and of
        everything below one (not followed: a symlink is copied as a symlink); ~4 ms of CPU for
        this machine's ~700 entries, at most every REFRESH_S (0.2% of a core)."""
        digest = hashlib.sha256()
        for name in self._entries():
            top = os.path.join(self.host_etc, name)
            stats = [(top, _stat(top, follow=True))]
            if os.path.isdir(top):
                for d, subs, files in os.walk(top):
                    stats += [
                        (os.path.join(d, e), _stat(os.path.join(d, e), follow=False)) for e in subs + files
                    ]
            for p, st in stats:
                if st is not None:
                    digest.update(f"{p}\0{st.st_mtime_ns}\0{st.st_size}\0{st.st_ino}\n".encode())
        return digest.hexdigest()[:16]

    def _build(self, signature: str) -> str:
        final = self.root / signature
        if not final.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            os.chmod(self.root, 0o755)
            tmp = self.root / f".{signature}.{os.getpid()}.{threading.get_ident()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            for name in self._entries():
                source = os.path.join(self.host_etc, name)
                target = tmp / name
                if os.path.isdir(source):  # a top-level symlink to a dir is followed, as a bind would
                    shutil.copytree(
                        source, target, symlinks=True, ignore=_closed_dirs, copy_function=_copy_readable
                    )
                else:
                    _copy_readable(source, str(target))  # follows a top-level symlink
            _files_only_accounts(tmp / "nsswitch.conf")
            for name in PER_JOB_FILES:
                placeholder = tmp / name
                if not placeholder.exists():
                    placeholder.touch()
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
        previous = Path(self._current).name if self._current else None
        for old in self.root.iterdir():  # and the temp dirs of a build a crash interrupted
            if old.name not in (final.name, previous):
                shutil.rmtree(old, ignore_errors=True)
        return str(final)


def _stat(path: str, *, follow: bool) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=follow)
    except OSError:
        return None


def _files_only_accounts(nsswitch: Path) -> None:
    """Users and groups from files alone: in the sandbox they are the job's generated passwd and
    group, and the host's other sources (systemd's userdb, sss, ldap) are out of reach there
    anyway. Each lookup through `systemd` loaded libnss_systemd with libcap and libm and probed
    six userdb dirs; setpriv does one per job start (its --reuid tries the number as a name
    first): ~0.3 ms of CPU per start."""
    if not nsswitch.is_file():
        return
    lines = []
    for line in nsswitch.read_text().splitlines():
        database = line.split(":", 1)[0].strip()
        lines.append(f"{database}: files" if ":" in line and database in ACCOUNT_DATABASES else line)
    nsswitch.write_text("\n".join(lines) + "\n")


def _open_to_others(mode: int, bits: int) -> bool:
    return mode & bits == bits


def _closed_dirs(directory: str, names: list[str]) -> set[str]:
    """Dirs others cannot enter (e.g. /etc/ssl/private): left out of the copy."""
    closed = set()
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            st = os.stat(path)
            if not _open_to_others(st.st_mode, 0o005):
                closed.add(name)
    return closed


def _copy_readable(source: str, target: str) -> str:
    """copy2, except a file others cannot read, which becomes an empty file of the same mode."""
    st = os.stat(source)
    if _open_to_others(st.st_mode, 0o004):
        return str(shutil.copy2(source, target))
    Path(target).touch(mode=0o600)
    os.chmod(target, st.st_mode & 0o7777)
    return target
