"""cgroup v1 and v2 handling for one task instance.

The engine creates an instance's cgroup and writes its limits; the supervisor (a lean process
started per attempt) joins it, signals and kills its processes and reads its OOM counters. Both
use this module. It sits on every job's start-up path, so it imports only `os` and `time`:
no pathlib, typing or signal (each would add milliseconds to every start).

An instance's cgroup is described by a plain dict (it travels in the supervisor's spec):
  {"version": 1 | 2, "dirs": [every cgroup dir of the instance], "procs_dir": dir whose
   cgroup.procs lists its processes, "memory_dir": dir with the memory counters,
   "kill_file": v2 cgroup.kill or None}
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING; importing typing costs ms
if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Literal, TypedDict

    StrPath = str | os.PathLike[str]

    class CgroupHandle(TypedDict):
        """An instance's cgroup as create_instance_cgroup made it (kept in the attempt's spec)."""

        version: Literal[1, 2]
        dirs: list[str]  # one per hierarchy (v1) or the one dir (v2)
        procs_dir: str
        memory_dir: str
        kill_file: str | None  # v2's cgroup.kill


V1_CONTROLLERS = ("memory", "cpu", "pids", "devices")
V2_CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000  # also the kernel's default for a new v1 cgroup (cpu.cfs_period_us)
# A fractional-CPU job gets a 1 s period instead: its quota is then at least 10 ms at once, which
# covers starting the sandbox (bwrap + setpriv + sh, ~8 ms of CPU). With 100 ms, a 0.01-CPU job
# would get 1 ms per period and need most of a second just to start; the average is the same.
FRACTIONAL_CPU_PERIOD_US = 1_000_000


def cpu_quota(cpus: float) -> tuple[int, int]:
    """(quota_us, period_us) for a CPU limit of `cpus` cores."""
    period = FRACTIONAL_CPU_PERIOD_US if cpus < 1 else CPU_PERIOD_US
    return max(1000, int(cpus * period)), period


SIGKILL = 9  # the same number on every Linux architecture
DEFAULT_ROOT = "/sys/fs/cgroup"
# Character devices every sandbox needs: mem devices (null, zero, random ...), tty/ptmx, pts.
BASE_DEVICE_RULES = ("c 1:* rwm", "c 5:* rwm", "c 136:* rwm")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def detect_version(root: StrPath = DEFAULT_ROOT) -> int | None:
    """2 when `root` is a cgroup2 mount with the controllers we need, 1 when the v1 memory, cpu and
    pids hierarchies are mounted under it (hybrid counts as v1: its unified tree holds no
    controllers), None when neither is usable."""
    root = os.fspath(root)
    controllers = os.path.join(root, "cgroup.controllers")
    if os.path.exists(controllers):
        present = set(_read(controllers).split())
        return 2 if set(V2_CONTROLLERS) <= present else None
    if all(os.path.exists(os.path.join(root, c, "cgroup.procs")) for c in ("memory", "cpu", "pids")):
        return 1
    return None


def v1_has_devices(root: StrPath = DEFAULT_ROOT) -> bool:
    return os.path.exists(os.path.join(os.fspath(root), "devices", "devices.allow"))


def create_instance_cgroup(
    root: StrPath,
    version: int,
    parent: str,
    name: str,
    memory_mib: int | None,
    cpus: float | None,
    pids_max: int | None,
    allowed_devices: list[tuple[int, int]] | None = None,
) -> CgroupHandle:
    """Creates `<parent>/<name>` (name may hold a '/') and writes the limits. `allowed_devices`
    (v1 only): when given, the devices controller denies every character device except the
    basic ones and these (major, minor) pairs."""
    if version == 1:
        return _create_v1(os.fspath(root), parent, name, memory_mib, cpus, pids_max, allowed_devices)
    if version == 2:
        return _create_v2(os.fspath(root), parent, name, memory_mib, cpus, pids_max)
    raise ValueError(f"unsupported cgroup version {version!r}; expected 1 or 2")


def _create_v1(
    root: str,
    parent: str,
    name: str,
    memory_mib: int | None,
    cpus: float | None,
    pids_max: int | None,
    allowed_devices: list[tuple[int, int]] | None,
) -> CgroupHandle:
    controllers = [c for c in V1_CONTROLLERS if c != "devices" or allowed_devices is not None]
    dirs = {c: os.path.join(root, c, parent, name) for c in controllers}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    if memory_mib:
        limit = str(memory_mib << 20)
        _write(os.path.join(dirs["memory"], "memory.limit_in_bytes"), limit)
        memsw = os.path.join(dirs["memory"], "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):  # no swapping around the limit: an overrun is an OOM kill
            _write(memsw, limit)
    if cpus and cpus > 0:
        quota, period = cpu_quota(cpus)
        if period != CPU_PERIOD_US:  # a new cgroup's period is the kernel's 100 ms already
            _write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(period))
        _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(quota))
    if pids_max:
        _write(os.path.join(dirs["pids"], "pids.max"), str(pids_max))
    if allowed_devices is not None:
        allow = os.path.join(dirs["devices"], "devices.allow")
        _write(os.path.join(dirs["devices"], "devices.deny"), "a")
        for rule in BASE_DEVICE_RULES:
            _write(allow, rule)
        for major, minor in allowed_devices:
            _write(allow, f"c {major}:{minor} rw")
    return {
        "version": 1,
        "dirs": list(dirs.values()),
        "procs_dir": dirs["pids"],
        "memory_dir": dirs["memory"],
        "kill_file": None,
    }


def _create_v2(
    root: str, parent: str, name: str, memory_mib: int | None, cpus: float | None, pids_max: int | None
) -> CgroupHandle:
    path = os.path.join(root, parent, name)
    # Controllers must be enabled in every ancestor's subtree_control, top down.
    enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
    level = root
    for part in f"{parent}/{name}".split("/"):
        if not part:
            continue
        _write(os.path.join(level, "cgroup.subtree_control"), enable)
        level = os.path.join(level, part)
        os.makedirs(level, exist_ok=True)
    if memory_mib:
        _write(os.path.join(path, "memory.max"), str(memory_mib << 20))
        _write(os.path.join(path, "memory.swap.max"), "0")
    if cpus and cpus > 0:
        quota, period = cpu_quota(cpus)
        _write(os.path.join(path, "cpu.max"), f"{quota} {period}")
    if pids_max:
        _write(os.path.join(path, "pids.max"), str(pids_max))
    return {
        "version": 2,
        "dirs": [path],
        "procs_dir": path,
        "memory_dir": path,
        "kill_file": os.path.join(path, "cgroup.kill"),
    }


def join(cgroup: CgroupHandle, pid: int) -> None:
    """Moves `pid` into every hierarchy of the instance's cgroup (children inherit it)."""
    for d in cgroup["dirs"]:
        _write(os.path.join(d, "cgroup.procs"), str(pid))


def pids(cgroup: CgroupHandle) -> list[int]:
    try:
        text = _read(os.path.join(cgroup["procs_dir"], "cgroup.procs"))
    except OSError:
        return []
    return [int(p) for p in text.split()]


def signal_all(cgroup: CgroupHandle, sig: int, skip: Collection[int] = ()) -> int:
    sent = 0
    for pid in pids(cgroup):
        if pid in skip:
            continue
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            pass
    return sent


def kill_all(cgroup: CgroupHandle, timeout_s: float = 5.0) -> bool:
    """SIGKILLs everything in the cgroup until it is empty (a fork bomb is bounded by pids.max,
    so the loop converges). True when the cgroup ended empty."""
    kill_file = cgroup.get("kill_file")
    if kill_file and os.path.exists(kill_file):
        try:
            _write(kill_file, "1")
        except OSError:
            pass
    deadline = time.monotonic() + timeout_s
    pause = 0.0005  # usually the last process is already on its way out: look again soon
    while True:
        if signal_all(cgroup, SIGKILL) == 0 and not pids(cgroup):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def oom_kills(cgroup: CgroupHandle) -> int:
    """The kernel's own count of OOM kills inside this cgroup's memory limit."""
    memory_dir = cgroup["memory_dir"]
    if cgroup["version"] == 2:
        return _counter(os.path.join(memory_dir, "memory.events"), "oom_kill") or 0
    count = _counter(os.path.join(memory_dir, "memory.oom_control"), "oom_kill")
    if count is not None:
        return count
    # Kernels before 4.13 lack oom_kill in oom_control; failcnt is the next best own counter.
    try:
        return int(_read(os.path.join(memory_dir, "memory.failcnt")).strip() or 0)
    except (OSError, ValueError):
        return 0


def _counter(path: str, key: str) -> int | None:
    """The value of a `key value` line; None when the file or the key is missing."""
    try:
        text = _read(path)
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return None


def remove(cgroup: CgroupHandle, attempts: int = 50) -> bool:
    """rmdir of the instance's dirs; retries while the last exits are settling."""
    ok = True
    for d in cgroup["dirs"]:
        for _ in range(attempts):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
        else:
            ok = False
    return ok


def remove_attempt_dirs(cgroup: CgroupHandle) -> None:
    """rmdir of the per-attempt level above an instance's dirs, once its last instance is gone."""
    for d in cgroup["dirs"]:
        try:
            os.rmdir(os.path.dirname(d))
        except OSError:
            pass
