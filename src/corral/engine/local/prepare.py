"""How the local engine prepares an attempt before its supervisor runs it (engine.py `launch`):
the checks that refuse it on this node, its `/etc`, secrets, uid, work dirs, cgroups and sandbox
argv, written into the attempt dir and returned as the supervisor's spec (files.AttemptSpec).

`AttemptPreparation` is the engine's mixin: the fields of `LocalEngine` it reads are declared on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import corral
from corral.engine.base import AttemptLaunch, InstanceLaunch
from corral.engine.gpus import GpuInventory, device_paths
from corral.engine.isolation import cgroupfs
from corral.engine.isolation.bind_sources import fd_bind_indexes
from corral.engine.isolation.bwrap_status import with_status_fd
from corral.engine.isolation.netns import NetworkPolicy
from corral.engine.isolation.sandbox import (
    SANDBOX_WORK_DIR,
    IsolationStatus,
    SandboxSpec,
    allocate_uid,
    bwrap_argv,
    write_etc,
    write_nsswitch,
)
from corral.engine.isolation.secret_files import SANDBOX_SECRETS_DIR, SECRETS_DIR_ENV, write_secrets
from corral.engine.local.files import AttemptSpec, InstanceSpec
from corral.engine.local.process_files import host_path, release_uid_lock, remove_unjoined_cgroups
from corral.engine.log_links import link_attempt_logs
from corral.storage.layout import prepare_dirs, through_symlink
from corral.storage.mounts import plain_path

if TYPE_CHECKING:
    from corral.engine.isolation.cgroupfs import CgroupHandle


# Env values naming a bind target: an unsandboxed job (no binds) gets the host's path instead.
HOST_MAPPED_ENV = (
    "CORRAL_OUTPUTS",
    "CORRAL_CODE",
    "CORRAL_ENV_STORE",
    "CORRAL_ENV_FIND_LINKS",
    "CORRAL_ENV_TOOLS",
)


def default_environments() -> dict[str, list[str]]:
    """The "default" Python environment: the interpreter and packages Corral itself runs with
    (virtualenv, its base interpreter, an editable source tree), bound read-only."""
    paths: list[str] = []
    for p in (sys.prefix, sys.base_prefix, str(Path(corral.__file__).resolve().parents[1])):
        real = os.path.realpath(p)
        if real.startswith("/usr/") or real == "/usr" or real in paths:
            continue
        if any(real.startswith(q + "/") for q in paths):
            continue
        paths.append(real)
    return {"default": paths}


class LaunchRefused(Exception):
    pass


@dataclass(frozen=True, slots=True)
class JobSecrets:
    """Where an attempt's secrets were written (paths only, never values)."""

    files_dir: str | None  # bound at /run/secrets in the sandbox
    env_files: dict[str, str]  # env var -> file holding its value, read by the supervisor


class AttemptPreparation:
    """LocalEngine's launch preparation; the engine's fields it reads are declared here."""

    home: Path
    node_name: str
    uid_locks: Path
    cgroup_root: Path
    cgroup_parent: str
    pids_max: int
    gang_grace_s: float
    environments: Mapping[str, Sequence[str]]
    allow_unisolated: bool
    isolation_requested: bool
    inventory: GpuInventory
    status: IsolationStatus
    network: NetworkPolicy
    _build_network: NetworkPolicy | None

    @property
    def problems(self) -> list[str]:
        """What keeps jobs from the isolation asked for: sandbox, cgroups and network."""
        return [*self.status.problems, *self.network.problems]

    @property
    def refusing(self) -> bool:
        incomplete = not self.status.complete or bool(self.network.problems)
        return self.isolation_requested and incomplete and not self.allow_unisolated

    def _refuse_unfit(self, attempt: AttemptLaunch) -> None:
        """LaunchRefused naming why this node cannot run the attempt as given."""
        if self.refusing:
            raise LaunchRefused(
                f"job isolation unavailable on {self.node_name}: "
                f"{'; '.join(self.problems)} (allow_unisolated is off)"
            )
        if not attempt.environment_bin and attempt.environment not in self.environments:
            raise LaunchRefused(
                f"unknown environment {attempt.environment!r}; "
                f"this node has: {', '.join(sorted(self.environments))}"
            )
        for inst in attempt.instances:
            if inst.node != self.node_name:
                raise LaunchRefused(
                    f"rank {inst.rank} is placed on node {inst.node!r}, "
                    f"but this local engine is node {self.node_name!r}"
                )
        if attempt.refused:
            raise LaunchRefused(attempt.refused)

    @staticmethod
    def _refuse_bad_mounts(attempt: AttemptLaunch) -> None:
        """The first look at the mounts; the supervisor opens their sources again, without
        following a symlink, just before bwrap binds them (isolation/bind_sources.py)."""
        for m in attempt.mounts:
            if not os.path.isabs(m.source) or not os.path.isabs(m.target) or not os.path.exists(m.source):
                raise LaunchRefused(
                    f"mount {m.source} -> {m.target}: both must be absolute and the source must exist"
                )
            if plain_path(m.target) != m.target:
                # every test below is on the written form, which the kernel must read the same
                # way ('//usr/bin' is /usr/bin to it, and starts with no reserved prefix)
                raise LaunchRefused(f"mount {m.source} -> {m.target}: the target is not a plain path")
            if through_symlink(m.source):
                raise LaunchRefused(f"mount {m.source} -> {m.target}: the source goes through a symlink")
            outer = next((o for o in attempt.mounts if m.target.startswith(o.target.rstrip("/") + "/")), None)
            if outer is not None:
                # bwrap (root) would make and mount on m's mount point through outer's host dir,
                # by name, following any symlink its user put there meanwhile (anywhere in the
                # sandbox: over /usr/bin, which root runs setpriv from)
                raise LaunchRefused(
                    f"mount {m.source} -> {m.target} is inside mount {outer.source} -> {outer.target}: "
                    "a mount point in a bound dir is never made"
                )

    def _prepare(self, attempt: AttemptLaunch, adir: Path) -> AttemptSpec:
        self._refuse_unfit(attempt)
        sandboxed = self.isolation_requested and self.status.sandbox
        use_cgroups = self.isolation_requested and self.status.cgroups
        if attempt.uid is not None:
            # The user's stable uid (corral.storage.identities) with a private gid of the same
            # number; its home, group and outputs dirs are made and handed over first.
            prepare_dirs(attempt.storage_dirs, attempt.uid, attempt.uid)
        self._refuse_bad_mounts(attempt)
        network = self._network_for(attempt)
        uid_lock: Path | None = None
        uid = 0
        etc_files: dict[str, str] = {}
        if sandboxed:
            if attempt.uid is not None:
                uid = attempt.uid
            else:
                uid = allocate_uid(self.uid_locks, attempt.attempt_id)
                uid_lock = self.uid_locks / str(uid)
        try:
            if sandboxed:
                etc_files = write_etc(adir / "etc", attempt.user, uid, home=attempt.home)
                etc_files.update(write_nsswitch(self.home / "engine" / "etc"))
                etc_files.update(network.etc_files(adir / "etc"))
            secrets = self._write_secrets(attempt, adir, uid if sandboxed else None)
            instances = [
                self._prepare_instance(attempt, inst, adir, sandboxed, use_cgroups, uid, etc_files, secrets)
                for inst in attempt.instances
            ]
            if sandboxed and attempt.log_dir and attempt.uid is not None:
                link_attempt_logs(
                    Path(attempt.log_dir),
                    attempt.attempt,
                    [i.rank for i in attempt.instances],
                    adir,
                    uid=attempt.uid,
                    gid=attempt.uid,  # the user's private gid
                    attempt_id=attempt.attempt_id,
                )
        except BaseException:
            # No supervisor can run this attempt (spec.marshal is not written), so nothing joined
            # the cgroups made for its instances, and nobody else would remove them: they go now
            # (those of every rank, a half-made one included), and the uid it was given goes back
            # at once, or the failed launch held it for good.
            if use_cgroups:
                remove_unjoined_cgroups(self.cgroup_root, self.cgroup_parent, attempt.attempt_id)
            if uid_lock is not None:
                release_uid_lock(uid_lock, adir)
            raise
        return {
            "attempt_id": attempt.attempt_id,
            "max_runtime_s": attempt.max_runtime_s,
            "gang_grace_s": self.gang_grace_s,
            "uid_lock": str(uid_lock) if uid_lock else None,
            "uid": uid,
            "instances": instances,
            "network": network.spec(),
        }

    @staticmethod
    def _write_secrets(attempt: AttemptLaunch, adir: Path, job_uid: int | None) -> JobSecrets:
        """The attempt's secrets under <attempt dir>/secrets (isolation/secret_files.py): the
        files owned by the job's uid, the env values readable by the supervisor (root) alone,
        which puts them into each instance's environment; the supervisor removes them at the
        end. Nothing of the values goes into spec.marshal."""
        if not attempt.secrets:
            return JobSecrets(None, {})
        me = (os.getuid(), os.getgid())
        files_owner = (job_uid, job_uid) if job_uid is not None else me
        files_dir, env_files = write_secrets(str(adir / "secrets"), attempt.secrets, files_owner, me)
        return JobSecrets(files_dir, env_files)

    def _prepare_instance(
        self,
        attempt: AttemptLaunch,
        inst: InstanceLaunch,
        adir: Path,
        sandboxed: bool,
        use_cgroups: bool,
        uid: int,
        etc_files: dict[str, str],
        secrets: JobSecrets,
    ) -> InstanceSpec:
        work_dir = adir / "work" / str(inst.rank)
        work_dir.mkdir(parents=True)
        devices = device_paths(inst.gpus, self.inventory)
        env = self._instance_env(attempt, inst, work_dir, sandboxed)
        if secrets.files_dir is not None:
            env[SECRETS_DIR_ENV] = SANDBOX_SECRETS_DIR if sandboxed else secrets.files_dir
        cgroup: CgroupHandle | None = None
        if use_cgroups:
            allowed = [(d.major, d.minor) for d in devices] if self.status.devices_cgroup else None
            cgroup = cgroupfs.create_instance_cgroup(
                self.cgroup_root,
                self.status.cgroup_version or 1,
                self.cgroup_parent,
                f"{attempt.attempt_id}/{inst.rank}",
                inst.memory_mib,
                inst.cpus,
                self.pids_max,
                allowed,
            )
        # Where bwrap says whether the job's command ever ran (isolation/bwrap_status.py)
        status_path = None
        if sandboxed and self.status.json_status:
            status_path = str(adir / f"bwrap-{inst.rank}.status")
        if sandboxed:
            os.chown(work_dir, uid, uid)
            os.chmod(work_dir, 0o700)
            assert self.status.bwrap and self.status.setpriv
            argv = bwrap_argv(
                self.status.bwrap,
                self.status.setpriv,
                SandboxSpec(
                    command=inst.command,
                    work_dir=str(work_dir),
                    uid=uid,
                    etc_files=etc_files,
                    env_paths=self._env_paths(attempt),
                    mounts=[(m.source, m.target, m.read_only) for m in attempt.mounts],
                    devices=devices,
                    gids=attempt.gids if attempt.uid is not None else (),
                    cwd=attempt.cwd or SANDBOX_WORK_DIR,
                    secrets_dir=secrets.files_dir,
                    env_names=[*env, *secrets.env_files],
                    mounts_by_fd=self.status.bind_fd,
                ),
            )
            if status_path is not None:
                argv = with_status_fd(argv, status_path)
        else:
            argv = ["/bin/sh", "-c", inst.command]
        spec: InstanceSpec = {
            "rank": inst.rank,
            "argv": argv,
            "env": env,
            "cwd": str(work_dir) if not sandboxed else "/",
            "log": str(adir / f"rank-{inst.rank}.log"),
            "work_dir": str(work_dir),
            "cgroup": cgroup,
            "sandboxed": sandboxed,
            "memory_mib": inst.memory_mib,
            "secret_env": secrets.env_files,
        }
        if sandboxed:
            spec["bind_fds"] = fd_bind_indexes(argv)
            if status_path is not None:
                spec["bwrap_status"] = status_path
        return spec

    def _instance_env(
        self, attempt: AttemptLaunch, inst: InstanceLaunch, work_dir: Path, sandboxed: bool
    ) -> dict[str, str]:
        """The caller's env wins; we only fill in what a process needs and the caller left out."""
        env = dict(inst.env)
        env_bin = [
            f"{p}/bin" for p in self.environments.get(attempt.environment, ()) if os.path.isdir(f"{p}/bin")
        ]
        if attempt.environment_bin:  # a catalogue environment (or a build job's), bound by storage
            env_bin = [attempt.environment_bin]
            if not sandboxed:  # no binds: the host's path of the same dir
                env_bin = [host_path(attempt.environment_bin, attempt.mounts)]
        env.setdefault("PATH", ":".join([*env_bin, "/usr/local/bin", "/usr/bin", "/bin"]))
        inside = SANDBOX_WORK_DIR if sandboxed else str(work_dir)
        env.setdefault("HOME", attempt.home if sandboxed and attempt.home else inside)
        if not sandboxed:  # no binds: storage paths in the env name the host's dirs
            hosted = {m.target: m.source for m in attempt.mounts}
            for key in HOST_MAPPED_ENV:
                if env.get(key) in hosted:
                    env[key] = hosted[env[key]]
        env.setdefault("CORRAL_WORK_DIR", inside)
        env.setdefault("USER", attempt.user)
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(g.uuid for g in inst.gpus))
        env.setdefault("LANG", "C.UTF-8")
        return env

    def _env_paths(self, attempt: AttemptLaunch) -> Sequence[str]:
        if attempt.environment_bin:
            return attempt.environment_paths
        return self.environments[attempt.environment]

    def _network_for(self, attempt: AttemptLaunch) -> NetworkPolicy:
        """The node's policy, except for an environment build job, which reaches the package
        index: an isolated namespace with slirp4netns outbound (docs/security.md, "Network")."""
        if attempt.network_outbound != "internet" or not self.network.isolated:
            return self.network
        if self.network.outbound == "internet" or self.network.problems:
            return self.network
        if self._build_network is None:
            self._build_network = NetworkPolicy("isolated", "internet").probe()
        return self._build_network
