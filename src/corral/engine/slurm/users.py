"""Which Unix account runs a Corral user's jobs on Slurm: the one question the engine asks
(`UserMap.account`). Set by CORRAL_SLURM_USER_MAP (see docs/slurm.md):

    same            the Corral user name IS the Unix account name (site accounts, LDAP)
    /path/map.yaml  a YAML mapping {corral_user: unix_account}; re-read when the file changes

Unset, or a user the map does not name, or an account that does not exist on the server's host,
or one below CORRAL_SLURM_MIN_UID (root, daemons, SlurmUser) or the server's own account: the
launch is refused with a message naming the user and the setting. A job never runs as the server.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from corral.storage.layout import StorageDir
from corral.yaml_lines import safe_load

USER_MAP_SETTING = "CORRAL_SLURM_USER_MAP"
MIN_UID_SETTING = "CORRAL_SLURM_MIN_UID"
SAME_NAME = "same"
DEFAULT_MIN_UID = 1000


class UnmappedUser(ValueError):
    """The Corral user has no Unix account to run its jobs as (the message says why)."""


@dataclass(frozen=True, slots=True)
class UnixAccount:
    name: str
    uid: int
    gid: int


def closed_group_dirs(account: UnixAccount, dirs: Sequence[StorageDir]) -> list[StorageDir]:
    """The group dirs (root-owned, of a Corral group's gid) that a job of `account` cannot enter:
    Slurm gives a job its account's own Unix groups (initgroups), not the gids Corral records for
    its groups, so the site must give each such gid to a Unix group of the members' accounts
    (docs/storage.md, "Identities"). One per gid, in order; the groups as the server's host
    sees them, which shares the nodes' accounts."""
    groups = account_gids(account)
    closed: dict[int, StorageDir] = {}
    for d in dirs:
        if d.owner == "root" and d.gid is not None and d.gid not in groups:
            closed.setdefault(d.gid, d)
    return list(closed.values())


def account_gids(account: UnixAccount) -> set[int]:
    """The gids a job of `account` runs with: its own Unix groups as this host sees them (Slurm's
    initgroups on a node that shares the host's group database)."""
    return set(os.getgrouplist(account.name, account.gid))


def gid_name(gid: int) -> str | None:
    """The name of the Unix group of `gid` on this host, or None: no Unix group has it."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


# A name groupadd takes everywhere (shadow-utils' default NAME_REGEX, 32 characters at most);
# a Corral group's name may be longer, start with a digit or hold a "." (api/schemas.py).
PORTABLE_GROUP_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def corral_unix_names(group: str, gid: int) -> tuple[str, ...]:
    """The names a Unix group made for Corral group `group` (of gid `gid`) may have, in the order
    the fix below tries them; a Unix group of the gid under any other name is the host's own."""
    return (group, f"corral-{group}", f"corral-g{gid}")


def unix_group_fix(group: str, gid: int, accounts: Sequence[str]) -> tuple[str, str | None]:
    """(what is missing, the commands that give it) for the gid `gid` of Corral group `group`,
    which the Unix `accounts` (its members') lack, as this host's group database says: no Unix
    group has the gid (`groupadd -g`, under the first of corral_unix_names that groupadd takes
    and no Unix group holds), or the one that has it does not list them (`usermod -aG`). When the
    gid is a Unix group named otherwise, it is the host's own group (CORRAL_GID_RANGE overlaps
    the host's groups): no command, as adding accounts to it would give them that group's rights."""
    commands = []
    name = gid_name(gid)
    if name is None:
        missing = f"no Unix group has gid {gid}"
        free = [
            n
            for n in corral_unix_names(group, gid)
            if PORTABLE_GROUP_NAME.fullmatch(n) and _group_name_free(n)
        ]
        if not free:
            taken = " and ".join(n for n in corral_unix_names(group, gid) if PORTABLE_GROUP_NAME.fullmatch(n))
            return f"{missing}, and Unix groups of other gids hold the names it could have ({taken})", None
        name = free[0]
        commands.append(f"groupadd -g {gid} {shlex.quote(name)}")
    elif name not in corral_unix_names(group, gid):
        return foreign_gid(group, gid, name), None
    else:
        missing = f"Unix group {name} (gid {gid}) does not list {', '.join(accounts)}"
    commands += [f"usermod -aG {shlex.quote(name)} {shlex.quote(a)}" for a in accounts]
    return missing, "; ".join(commands)


def foreign_gid(group: str, gid: int, unix_name: str) -> str:
    """Corral group `group`'s gid is the host's own Unix group `unix_name`, not one made for it."""
    *first, last = corral_unix_names(group, gid)
    return (
        f"gid {gid} is Unix group {unix_name}, not Corral group {group}'s (named {', '.join(first)} or "
        f"{last}): CORRAL_GID_RANGE overlaps this host's groups, and the group's dir is open to "
        f"{unix_name}'s members"
    )


def _group_name_free(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return True
    return False


def lacks_gid(account: UnixAccount, gid: int) -> bool:
    """Is `account` outside `gid` (its own groups as this host sees them, as Slurm's initgroups)?"""
    return gid not in account_gids(account)


class UserMap:
    def __init__(self, source: str | None, min_uid: int = DEFAULT_MIN_UID) -> None:
        """source: None (unset: every launch is refused), "same", or the path of a YAML file."""
        self.source = (source or "").strip() or None
        self.min_uid = min_uid
        self._lock = threading.Lock()
        self._loaded: tuple[float, dict[str, str]] | None = None  # (mtime, map) of the YAML file
        if self.source not in (None, SAME_NAME):
            self._table()  # a bad file is an error when the engine starts, not at the first job

    @classmethod
    def from_env(cls) -> UserMap:
        raw = os.environ.get(MIN_UID_SETTING) or str(DEFAULT_MIN_UID)
        try:
            min_uid = int(raw)
        except ValueError:
            raise ValueError(f"{MIN_UID_SETTING}={raw!r} is not a whole number")
        if min_uid < 1:
            raise ValueError(f"{MIN_UID_SETTING} must be >= 1 (uid 0 is root), got {min_uid}")
        return cls(os.environ.get(USER_MAP_SETTING), min_uid)

    def describe(self) -> str:
        if self.source is None:
            return "unset"
        return "Corral user name = Unix account name" if self.source == SAME_NAME else f"file {self.source}"

    def account(self, corral_user: str) -> UnixAccount:
        """The Unix account that runs `corral_user`'s jobs; UnmappedUser naming what is missing."""
        if self.source is None:
            raise UnmappedUser(
                f"Corral user {corral_user!r} has no Unix account on Slurm: {USER_MAP_SETTING} is not "
                f"set (set it to '{SAME_NAME}' or to a YAML file of corral_user: unix_account); "
                "jobs never run as the Corral server's own account"
            )
        if self.source == SAME_NAME:
            name = corral_user
        else:
            found = self._table().get(corral_user)
            if found is None:
                raise UnmappedUser(
                    f"Corral user {corral_user!r} is not in the Slurm user map {self.source} "
                    f"({USER_MAP_SETTING}); add a line '{corral_user}: <unix account>'"
                )
            name = found
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise UnmappedUser(
                f"Corral user {corral_user!r} maps to Unix account {name!r} ({USER_MAP_SETTING}: "
                f"{self.describe()}), which does not exist on this host"
            )
        if entry.pw_uid < self.min_uid or entry.pw_uid == os.geteuid():
            raise UnmappedUser(
                f"Corral user {corral_user!r} maps to Unix account {name!r} (uid {entry.pw_uid}), "
                f"which may not run jobs: system accounts below {MIN_UID_SETTING}={self.min_uid} and "
                "the Corral server's own account are refused"
            )
        return UnixAccount(name, entry.pw_uid, entry.pw_gid)

    def _table(self) -> dict[str, str]:
        assert self.source is not None
        path = Path(self.source)
        try:
            mtime = path.stat().st_mtime
        except OSError as exc:
            raise UnmappedUser(f"{USER_MAP_SETTING}={self.source}: cannot read the user map ({exc})")
        with self._lock:
            if self._loaded is not None and self._loaded[0] == mtime:
                return self._loaded[1]
            try:
                data = safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise UnmappedUser(f"{USER_MAP_SETTING}={self.source}: not a readable YAML file ({exc})")
            if not isinstance(data, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in data.items()
            ):
                raise UnmappedUser(
                    f"{USER_MAP_SETTING}={self.source}: must be a mapping of corral_user: unix_account "
                    "(both strings)"
                )
            self._loaded = (mtime, dict(data))
            return self._loaded[1]
