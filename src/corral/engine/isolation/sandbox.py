"""The bubblewrap sandbox of one task instance: what this machine can do (probe), the per-job uid,
the minimal /etc and the bwrap command line. See docs/isolation.md for why it is built this way.

Two privilege models share one command line:

Local engine: bwrap runs as root WITHOUT a user namespace (so it can bind whatever the job
needs, wherever it lies on the host), and inside the sandbox `setpriv` switches to the job's own
unprivileged uid/gid with no capabilities, no supplementary groups and no_new_privs before the
job's shell starts. A user namespace that maps the job to uid 1000 would not do: the kernel would
still check file access as host uid 0, i.e. the owner of /etc/shadow.

Slurm engine (`setpriv=None`): Slurm already started the job as its user's own Unix account, so
bwrap runs unprivileged in a user namespace that maps that uid to itself (file access is checked as
the user, as it should be) and nested user namespaces are disabled.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.engine.gpus import DeviceNode
from corral.engine.isolation import cgroupfs
from corral.engine.isolation.bwrap_status import EXEC_MARK
from corral.engine.isolation.root_env import restoring_argv
from corral.engine.isolation.secret_files import SANDBOX_SECRETS_DIR

SANDBOX_WORK_DIR = "/job"  # where the instance's private work dir appears inside the sandbox
UID_BASE = 200_000  # per-job uids: [UID_BASE, UID_BASE + UID_RANGE), never in /etc/passwd of the host
UID_RANGE = 60_000
# Host files a program reasonably needs from /etc; nothing that holds a secret (no shadow,
# gshadow, sudoers, ssh keys, machine-id), and passwd/group are generated per job.
ETC_WHITELIST = (
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "alternatives",
    "localtime",
    "mime.types",
)
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
# The name-service databases the sandbox answers from its own files only. Its passwd and group
# are generated (write_etc) and complete; the host's other sources for them (systemd, sss, ldap)
# reach nothing from inside (no /run, no host network), but setpriv's lookup of the job's uid as
# a user name and its gid as a group name would load each of their modules at every start.
LOCAL_NSS_DATABASES = ("passwd", "group", "shadow", "gshadow")


@dataclass
class IsolationStatus:
    """What isolation this machine supports, probed once when the engine starts."""

    bwrap: str | None = None
    setpriv: str | None = None
    cgroup_version: int | None = None
    devices_cgroup: bool = False
    root: bool = False
    problems: list[str] = field(default_factory=list)
    # bwrap takes `--bind-fd`/`--ro-bind-fd` (bubblewrap 0.10, or a distro's backport such as
    # Debian 12's 0.8.0-2+deb12u1): mount sources are then bound as the supervisor opened them
    # (bind_sources.py). Without it they are bound by name, and `warnings` says what that leaves.
    bind_fd: bool = False
    # bwrap reports through `--json-status-fd` whether it exec'd the job's command
    # (bwrap_status.py): a sandbox that refused to start then fails the attempt as launch_failed.
    # Without it such a refusal reads as the job's own exit 1, and `warnings` says so.
    json_status: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def sandbox(self) -> bool:
        return self.bwrap is not None and self.setpriv is not None and self.root

    @property
    def cgroups(self) -> bool:
        return self.cgroup_version is not None and self.root

    @property
    def complete(self) -> bool:
        return self.sandbox and self.cgroups

    def summary(self) -> str:
        if self.complete:
            devices = "devices cgroup" if self.devices_cgroup else "device binding only (no devices cgroup)"
            text = f"isolated: bubblewrap + setpriv, cgroup v{self.cgroup_version}, {devices}"
            return "; ".join([text, *self.warnings])
        return "NOT isolated: " + "; ".join(self.problems)


def probe(cgroup_root: Path = Path("/sys/fs/cgroup")) -> IsolationStatus:
    status = IsolationStatus(root=os.geteuid() == 0)
    if not status.root:
        status.problems.append("not running as root: cannot create cgroups or drop jobs to a per-job uid")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        status.problems.append("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    else:
        trial = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "true"],
            capture_output=True,
            timeout=10,
        )
        if trial.returncode == 0:
            status.bwrap = bwrap
            status.bind_fd = _bwrap_binds_fds(bwrap)
            if not status.bind_fd:
                status.warnings.append(
                    "this bubblewrap has no --bind-fd (0.10+, or a distro's backport): mount sources "
                    "are bound by name, so a group member who swaps a dir for a symlink at the moment "
                    "a job starts may get another host dir bound into it (docs/isolation.md)"
                )
            status.json_status = bwrap_reports_exec(bwrap)
            if not status.json_status:
                status.warnings.append(
                    "this bubblewrap has no --json-status-fd, or one that does not tell whether the "
                    "command ran: a sandbox that refuses to start (a mount it cannot make) ends as "
                    "the job's own exit 1, not launch_failed"
                )
        else:
            err = trial.stderr.decode(errors="replace").strip()
            status.problems.append(f"bubblewrap cannot create namespaces here: {err}")
    status.setpriv = shutil.which("setpriv")
    if status.setpriv is None:
        status.problems.append("setpriv (util-linux) is not installed: cannot drop privileges")
    status.cgroup_version = cgroupfs.detect_version(cgroup_root)
    if status.cgroup_version is None:
        status.problems.append(f"no usable cgroup v1 (memory, cpu, pids) or v2 hierarchy at {cgroup_root}")
    status.devices_cgroup = status.cgroup_version == 1 and cgroupfs.v1_has_devices(cgroup_root)
    return status


def _bwrap_binds_fds(bwrap: str) -> bool:
    """Whether `bwrap` binds a directory given as an open fd (`--ro-bind-fd`)."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        trial = subprocess.run(
            [
                bwrap,
                "--ro-bind-fd",
                str(fd),
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--unshare-pid",
                "true",
            ],
            capture_output=True,
            timeout=10,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    return trial.returncode == 0


# A mount source that never exists (procfs has no such entry): a sandbox bwrap refuses to set up
PROBE_MISSING_SOURCE = "/proc/nonexistent-corral-probe"


def bwrap_reports_exec(bwrap: str) -> bool:
    """Whether `bwrap --json-status-fd` says that it exec'd the command, and only then: `true`
    gets its exit-code line, and a sandbox refused before its exec (a bind of a missing source)
    gets none. A bubblewrap that wrote the line either way would make every refusal read as the
    job's own exit: it is then used as one without the option (review109 #6). Also the Slurm
    engine's, at its start (slurm/scripts.NodeSandbox.json_status)."""
    code, said = _json_status_of(bwrap, ["true"])
    if code != 0 or EXEC_MARK not in said:
        return False
    code, said = _json_status_of(bwrap, ["--ro-bind", PROBE_MISSING_SOURCE, "/mnt", "true"])
    return code != 0 and EXEC_MARK not in said


def _json_status_of(bwrap: str, args: list[str]) -> tuple[int, bytes]:
    """bwrap's exit code and what it wrote to its --json-status-fd, for a sandbox of the host's
    root read-only with `args` (options, then the command)."""
    read_end, write_end = os.pipe()
    try:
        trial = subprocess.run(
            [bwrap, "--json-status-fd", str(write_end), "--ro-bind", "/", "/", "--unshare-pid", *args],
            capture_output=True,
            timeout=10,
            pass_fds=(write_end,),
        )
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as f:
            read_end = -1
            said = f.read()
    finally:
        for fd in (read_end, write_end):
            if fd != -1:
                os.close(fd)
    return trial.returncode, said


def allocate_uid(locks_dir: Path, attempt_id: str) -> int:
    """A uid no running attempt holds: claimed by mkdir of `<locks_dir>/<uid>` (atomic), released
    by the supervisor once the attempt's processes are gone."""
    locks_dir.mkdir(parents=True, exist_ok=True)
    start = zlib.crc32(attempt_id.encode()) % UID_RANGE
    for step in range(UID_RANGE):
        uid = UID_BASE + (start + step) % UID_RANGE
        try:
            os.mkdir(locks_dir / str(uid))
        except FileExistsError:
            continue
        (locks_dir / str(uid) / "attempt").write_text(attempt_id)
        return uid
    raise RuntimeError(f"all {UID_RANGE} job uids are in use")


def write_etc(
    etc_dir: Path, user: str, uid: int, gid: int | None = None, home: str | None = None
) -> dict[str, str]:
    """passwd and group for the job (root, nobody and the job's user), readable by everyone.
    Returns {sandbox path: host path} of the files to bind. gid defaults to uid (local engine)."""
    name = user if _USER_NAME.match(user) else "job"
    gid = uid if gid is None else gid
    etc_dir.mkdir(parents=True, exist_ok=True)
    passwd = (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{name}:x:{uid}:{gid}:corral job:{home or SANDBOX_WORK_DIR}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\n{name}:x:{gid}:\nnogroup:x:65534:\n"
    (etc_dir / "passwd").write_text(passwd)
    (etc_dir / "group").write_text(group)
    for f in ("passwd", "group"):
        os.chmod(etc_dir / f, 0o644)
    return {"/etc/passwd": str(etc_dir / "passwd"), "/etc/group": str(etc_dir / "group")}


def write_nsswitch(shared_dir: Path, host_file: str = "/etc/nsswitch.conf") -> dict[str, str]:
    """The job's nsswitch.conf: the host's, read at every start (an admin's change reaches the
    next job, as with the bound whitelist), with the LOCAL_NSS_DATABASES answered from `files`.
    One file per content in `shared_dir`, named by its checksum and replaced, never changed in
    place (running jobs bind it): a start reads the host's and the kept copy and compares them.
    Bytes, not text: the host's file need not be UTF-8 (a comment in Latin-1), which glibc reads.
    Returns {sandbox path: host path}; it replaces the host's entry in the binds (one bind, not two)."""
    try:
        with open(host_file, "rb") as f:
            host_lines = f.read().splitlines()
    except FileNotFoundError:
        host_lines = []
    local = {db.encode() for db in LOCAL_NSS_DATABASES}
    kept = [line for line in host_lines if line.split(b":", 1)[0].strip() not in local]
    data = b"\n".join([*kept, *(db.encode() + b": files" for db in LOCAL_NSS_DATABASES)]) + b"\n"
    path = shared_dir / f"nsswitch-{zlib.crc32(data):08x}.conf"
    try:
        if path.read_bytes() == data:
            return {"/etc/nsswitch.conf": str(path)}
    except FileNotFoundError:
        shared_dir.mkdir(parents=True, exist_ok=True)
    # none yet, or one that differs (a checksum shared by two contents, a file a crash left short)
    tmp = shared_dir / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # renamed only once complete: a power cut leaves no empty copy
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # atomic: a concurrent launch sees the whole file or none
    finally:
        tmp.unlink(missing_ok=True)
    return {"/etc/nsswitch.conf": str(path)}


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    command: str
    work_dir: str  # host path, owned by uid, mode 0700
    uid: int
    etc_files: dict[str, str]
    env_paths: Sequence[str] = ()  # read-only: the job's Python environment
    mounts: Sequence[tuple[str, str, bool]] = ()  # (host source, sandbox target, read_only)
    devices: Sequence[DeviceNode] = ()
    gids: Sequence[int] = ()  # supplementary groups (local engine: the gids of the user's groups)
    cwd: str = SANDBOX_WORK_DIR  # e.g. /code for a job with a code snapshot
    secrets_dir: str | None = None  # host dir of the job's file secrets: read-only at /run/secrets
    # The names of the job's environment variables (local engine): they reach the sandbox stashed
    # (root_env.py) and the first step as the job's uid puts them back
    env_names: Sequence[str] = ()
    # Local engine: the mounts' sources go to bwrap as fds the supervisor opens at the start
    # (bind_sources.py), their host paths only placeholders here; Slurm binds them by name.
    mounts_by_fd: bool = False


@functools.cache
def _system_binds() -> tuple[str, ...]:
    """The host's system dirs, read-only (cached: the layout does not change under us)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return tuple(args)


@functools.cache
def _etc_whitelist() -> tuple[str, ...]:
    return tuple(f"/etc/{name}" for name in ETC_WHITELIST if os.path.exists(f"/etc/{name}"))


def _etc_binds(etc_files: dict[str, str]) -> list[str]:
    """The whitelisted host entries, but for those the job gets its own version of (`etc_files`):
    binding the host's first and the job's over it would be two mounts for one file."""
    args = ["--perms", "0755", "--dir", "/etc"]
    for host in _etc_whitelist():
        if host not in etc_files:
            args += ["--ro-bind", host, host]
    for target, source in etc_files.items():
        args += ["--ro-bind", source, target]
    return args


def _parent_dirs(targets: Sequence[str], covered: Sequence[str]) -> tuple[str, ...]:
    """Ancestors of bind targets that bwrap would otherwise create with mode 0700 (e.g. /root for
    a pyenv interpreter), made 0755 so the job's uid can walk to the bound path."""
    return _parent_dirs_of(tuple(targets), tuple(covered))


@functools.lru_cache(maxsize=1024)
def _parent_dirs_of(targets: tuple[str, ...], covered: tuple[str, ...]) -> tuple[str, ...]:
    """Cached: the same environment and storage paths come with every job of a user (computing
    them was ~0.1 ms a call, two calls per launch)."""
    seen: list[str] = []
    for target in targets:
        parts = Path(target).parts
        for i in range(2, len(parts)):
            parent = str(Path(*parts[:i]))
            if parent in seen or any(parent == c or parent.startswith(c + "/") for c in covered):
                continue
            seen.append(parent)
    return tuple(sorted(seen, key=lambda p: p.count("/")))


def bwrap_argv(bwrap: str, setpriv: str | None, spec: SandboxSpec) -> list[str]:
    head, tail = bwrap_argv_parts(bwrap, setpriv, spec)
    return [*head, *tail]


def bwrap_argv_parts(bwrap: str, setpriv: str | None, spec: SandboxSpec) -> tuple[list[str], list[str]]:
    """The bwrap command line in two parts: more binds (devices known only on the node, as on
    Slurm) may go between them. setpriv=None: the caller already runs as the job's own uid
    (Slurm), so bwrap makes a user namespace and nothing switches uid inside."""
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--new-session", "--die-with-parent"]
    if setpriv is None:
        args += ["--unshare-user", "--disable-userns"]
    args += _system_binds()
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
    args += _etc_binds(spec.etc_files)
    env_paths = [p for p in spec.env_paths if os.path.isdir(p)]
    # Below /usr (bound) the host's own dirs exist; everywhere else bwrap would create them 0700.
    covered = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/dev", SANDBOX_WORK_DIR, *env_paths]
    covered += [t for _, t, _ in spec.mounts]  # a bind inside another bind (/group/g/sub) is in place
    env_parents = _parent_dirs(env_paths, covered)
    mount_parents = [p for p in _parent_dirs([t for _, t, _ in spec.mounts], covered) if p not in env_parents]
    for parent in env_parents:
        args += ["--perms", "0755", "--dir", parent]
    for path in env_paths:
        args += ["--ro-bind", path, path]
    args += ["--bind", spec.work_dir, SANDBOX_WORK_DIR]
    for dev in spec.devices:
        args += ["--dev-bind", dev.host_path, dev.sandbox_path]
    for parent in mount_parents:
        args += ["--perms", "0755", "--dir", parent]
    for source, target, read_only in spec.mounts:
        if spec.mounts_by_fd:
            args += ["--ro-bind-fd" if read_only else "--bind-fd", source, target]
        else:
            args += ["--ro-bind" if read_only else "--bind", source, target]
    if spec.secrets_dir is not None:  # corral.engine.isolation.secret_files
        args += ["--perms", "0755", "--dir", "/run", "--ro-bind", spec.secrets_dir, SANDBOX_SECRETS_DIR]
    tail = ["--chdir", spec.cwd, "--"]
    if setpriv is None:
        # The Slurm rank script starts bwrap with SIGTERM ignored (a TERM to every process of the
        # job must not kill bwrap, which would SIGKILL the job without its grace); the job's own
        # shell gets the default action back.
        tail += ["/usr/bin/env", "--default-signal=TERM,INT"]
        if spec.env_names:
            # the rank script and bwrap ran with the job's variables stashed (scripts.py): the
            # job's come back here, inside the sandbox, as on the local engine
            return args, tail + restoring_argv(spec.env_names, ["/bin/sh", "-c", spec.command])
    else:
        groups = f"--groups={','.join(map(str, spec.gids))}" if spec.gids else "--clear-groups"
        tail += [setpriv, f"--reuid={spec.uid}", f"--regid={spec.uid}", groups]
        tail += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        # bwrap and setpriv run as root with the stashed environment: the job's comes back here
        return args, tail + restoring_argv(spec.env_names, ["/bin/sh", "-c", spec.command])
    tail += ["/bin/sh", "-c", spec.command]
    return args, tail
