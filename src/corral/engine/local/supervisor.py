"""The per-attempt supervisor of the local engine (`main()`, argument: the attempt dir).

One supervisor runs every instance of one attempt, each under its own cgroup and (when isolated)
its own bubblewrap sandbox. It lives in its own session, detached from the server, so a server
crash or restart leaves jobs running. It owns the sandboxes: it forwards stops, enforces the
runtime limit, stops the gang when one instance fails, reads OOM counters, and writes its state
atomically into the attempt dir, where a (re)started engine reads it:

  spec.marshal     written by the engine before the start: what to run, where, with which limits
                   (root's 0600: it holds the job's env values)
  supervisor.json  {pid, proc_start, started_at}  written once its signals are blocked, by the
                   first supervisor of the attempt only: a second one started for the same dir
                   finds it and exits without running anything
  state.json       {phase: running, pids, starts, started_at} once every instance is started
                   (starts: each pid's /proc start time, so that the engine can kill an
                   instance's process group once this supervisor is dead, never another's)
  ended.json       what status.json will say, written once every instance has been reaped and
                   before the clean-up: a supervisor killed during the clean-up (SIGKILL, the OOM
                   killer) leaves the attempt's real end on record, which the engine then
                   publishes as status.json instead of declaring the attempt lost
  status.json      {phase, exit_code, reason, message, started_at, finished_at, instances}  final

(Their shapes are the TypedDicts of corral.engine.local.files.)
  stop             written by the engine: the grace period in seconds; then it sends SIGUSR1
  rank-<r>.log     stdout+stderr of the instance with global rank r (kept after the job)
  bwrap-<r>.status bwrap's --json-status-fd lines for rank r (sandboxed instances): whether the
                   job's command ever ran (isolation/bwrap_status.py); when bwrap refused to set
                   the sandbox up, the attempt fails as launch_failed with bwrap's message
  secrets/         the values of the secrets the job names (isolation/secret_files.py); removed
                   by `finish`
  slirp4netns.log  output of the attempt's slirp4netns (outbound policy `internet` only)

With a `network` entry in the spec, the supervisor first moves itself into a new network
namespace that all its instances inherit (isolation/netns.py).

Start-up cost is on every job's critical path, so this file imports only the standard library
and the import-free `cgroupfs` and `netns` modules, and the engine runs it with -I -S (no site
packages).
Reason strings match corral.engine.base.FailureReason values.
"""

from __future__ import annotations

import marshal
import os
import sys
import time

TYPE_CHECKING = False  # mypy reads this as typing.TYPE_CHECKING; typing itself is not imported
if TYPE_CHECKING:
    import signal as _signal
    from collections.abc import Iterable, Iterator, Mapping
    from types import ModuleType

    from corral.engine.isolation.cgroupfs import CgroupHandle
    from corral.engine.local.files import AttemptSpec, FinalStatus, InstanceSpec, Outcome
else:
    import _signal  # the C module: `signal` would import enum, several ms per job start

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)

from corral.engine.isolation import (  # noqa: E402 - after the sys.path line
    bind_sources,
    bwrap_status,
    cgroupfs,
    netns,
    secret_files,
)
from corral.engine.isolation.root_env import stash_env, without_shell_owned  # noqa: E402

HANDLED = {_signal.SIGCHLD, _signal.SIGUSR1, _signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP}
DEFAULT_STOP_GRACE_S = 10.0
SIGNAL_STOP_GRACE_S = 2.0
ORPHANED_EXIT = 125  # an instance's child whose supervisor died before it ran anything


def to_json(value: object) -> str:
    """JSON for the few plain types the state files hold (json would import re and enum)."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_escape(c) for c in value) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(f"{to_json(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _escape(c: str) -> str:
    if c == '"' or c == "\\":
        return "\\" + c
    return f"\\u{ord(c):04x}" if ord(c) < 0x20 else c


def write_json(path: str, data: Mapping[str, object]) -> None:
    """Atomic: readers see the old file or the whole new one, never half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(to_json(data).encode("utf-8"))
    os.replace(tmp, path)


def write_json_once(path: str, data: Mapping[str, object]) -> bool:
    """Atomic and exclusive: the whole file appears for the first writer only (a hard link does
    not replace); False, with nothing written, when the file is there already."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(to_json(data).encode("utf-8"))
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.remove(tmp)
    return True


def read_spec(path: str) -> AttemptSpec | None:
    try:
        with open(path, "rb") as f:
            data: AttemptSpec = marshal.loads(f.read())  # written by the engine just before our start
            return data
    except (OSError, ValueError, EOFError):
        return None


def proc_start(pid: int) -> str | None:
    """Kernel start time of `pid` (field 22 of /proc/pid/stat): with the pid, it names one
    process for good (pids are reused, start times are not); None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def become_subreaper() -> bool:
    """Makes orphans below us (bwrap's init outlives bwrap by a moment) our children, so that
    `reap` collects them instead of leaving zombies to pid 1, which in a container may never
    reap. Needs ctypes, whose import costs ~5 ms: only done when it is loaded already (the
    launcher preloads it), never on the slow direct-start path."""
    ctypes: ModuleType | None = sys.modules.get("ctypes")
    if ctypes is None:
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def exited_children() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of each child (or orphan we reap as subreaper) that has exited; never blocks."""
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, wait_status


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


class Instance:
    def __init__(self, spec: InstanceSpec) -> None:
        self.rank: int = spec["rank"]
        self.spec = spec
        self.cgroup: CgroupHandle | None = spec["cgroup"]
        self.sandboxed: bool = spec["sandboxed"]
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.oom = False
        # Why its sandbox did not start, when bwrap says the job's command never ran
        # (isolation/bwrap_status.py): the attempt then fails as launch_failed, not the job's
        # exit, when no other rank's command ran either (Supervisor.outcome)
        self.refused: str | None = None

    def may_have_run(self) -> bool:
        """Whether the job's command may have run in this instance: it was forked and its sandbox
        did not refuse to start it. A bwrap killed by a signal (a stop, the OOM killer) says
        nothing either way, so it may have."""
        return self.pid is not None and self.refused is None

    @property
    def running(self) -> bool:
        return self.pid is not None and self.exit_code is None

    def spawn(self, old_mask: Iterable[int], bind_fds: Mapping[str, int]) -> None:
        """Forks the instance's child; `bind_fds`: the attempt's open mount sources by host path
        (isolation/bind_sources.py), of which the child hands bwrap those its argv names."""
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._exec_child(old_mask, supervisor, bind_fds)
        self.pid = pid

    def _exec_child(self, old_mask: Iterable[int], supervisor: int, bind_fds: Mapping[str, int]) -> None:
        try:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
            for sig in (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT):  # Python changed these
                _signal.signal(sig, _signal.SIG_DFL)
            os.setsid()
            if self.cgroup:
                cgroupfs.join(self.cgroup, os.getpid())
            if os.getppid() != supervisor:
                # The supervisor died between the fork and the join above, so the engine may
                # already have emptied the cgroup and declared the attempt lost (its retry may
                # be running): a child that went on would run beside it, out of everyone's
                # sight. Checked after the join: a child still here when the supervisor dies is
                # in the cgroup by then, where the engine's kill finds it (the kernel reparents
                # a dead process's children before anyone can see it dead).
                os._exit(ORPHANED_EXIT)
            fd = os.open(self.spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            argv = bind_sources.hand_over(self.spec["argv"], self.spec.get("bind_fds", ()), bind_fds)
            status_path = self.spec.get("bwrap_status")
            if status_path:  # after the hand-over above, which closes every fd it does not keep
                argv = bwrap_status.hand_over(argv, status_path)
            os.chdir(self.spec["cwd"])
            if self.sandboxed:
                # Files in shared group dirs come out rw for the group and closed to others: a
                # hard link a member plants elsewhere then leads non-members to an unreadable inode.
                os.umask(0o007)
            env = self.spec["env"]
            secret_env = self.spec.get("secret_env")
            if secret_env:  # read here, in the child, so the values live only in the job's env
                env = {**env, **secret_files.read_env_secrets(secret_env)}
            if self.sandboxed:  # bwrap and setpriv run as root: see isolation/root_env.py
                env = stash_env(env)
            else:  # no restoring shell: the shell's own names left out as it does, said in the log
                env, notes = without_shell_owned(env)
                for note in notes:
                    os.write(2, f"{note}\n".encode())
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            try:
                os.write(2, f"corral supervisor: cannot start instance: {exc}\n".encode())
            finally:
                os._exit(127)

    def terminate(self) -> bool:
        """SIGTERM to the job's own processes. In a sandbox: every process below bwrap's init
        (pid 1 there ignores SIGTERM, and SIGTERM to bwrap itself would end the sandbox at once
        via --die-with-parent, skipping the grace period). False when the job's processes do not
        exist yet (bwrap still setting up, or no setsid() yet): the caller tries again shortly."""
        if not self.running or self.pid is None:
            return True
        if not self.sandboxed:
            # Until the child's setsid() its process group does not exist and killpg finds no
            # one: the signal would be lost and the stop wait for the whole grace period.
            return _killpg(self.pid, _signal.SIGTERM)
        targets = [p for init in children(self.pid) for p in descendants(init)]
        for p in targets:
            _kill(p, _signal.SIGTERM)
        return bool(targets)

    def kill(self) -> None:
        """SIGKILL of everything: bwrap (its init and pid namespace die with it), the process
        group and then whatever the cgroup still holds."""
        if self.pid is not None and self.exit_code is None:
            _kill(self.pid, _signal.SIGKILL)
            _killpg(self.pid, _signal.SIGKILL)
        if self.cgroup:
            cgroupfs.kill_all(self.cgroup, timeout_s=2.0)

    def finished(self, wait_status: int) -> None:
        if self.cgroup:
            self.oom = cgroupfs.oom_kills(self.cgroup) > 0
        if os.WIFSIGNALED(wait_status):
            self.exit_code = 128 + os.WTERMSIG(wait_status)
        else:
            self.exit_code = os.WEXITSTATUS(wait_status)
            status_path = self.spec.get("bwrap_status")
            # Never a refusal: an OOM kill in the rank's cgroup (during the setup too: the OOM
            # check wins), nor a bwrap that exits 128+N because a signal killed its sandbox
            # before the exec (bwrap's own refusals exit 1) (review109 #4)
            if self.exit_code != 0 and status_path and not self.oom and not _by_signal(self.exit_code):
                self.refused = bwrap_status.refusal(status_path, self.spec["log"], self.exit_code)
        if self.pid is not None and not self.sandboxed:
            _killpg(self.pid, _signal.SIGKILL)  # leftovers of the job's process group


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(pgid: int, sig: int) -> bool:
    """False when no process is in the group (yet, or any more)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _by_signal(exit_code: int) -> bool:
    """Whether an exit code is a shell's (or bwrap's monitor's) 128+N for a signal N."""
    return 128 < exit_code < 128 + 65


def describe_failure(inst: Instance) -> tuple[str, str]:
    code = inst.exit_code or 0
    limit = inst.spec["memory_mib"]
    if inst.oom:
        return "oom", f"rank {inst.rank} was OOM-killed by the kernel inside its {limit} MiB memory limit"
    if _by_signal(code):
        return "signal", f"rank {inst.rank} was killed by signal {code - 128}"
    hint = {126: " (command not executable)", 127: " (command not found)"}.get(code, "")
    return "exit_code", f"rank {inst.rank} exited with code {code}{hint}"


class Supervisor:
    def __init__(self, attempt_dir: str) -> None:
        self.dir = attempt_dir
        spec = read_spec(os.path.join(attempt_dir, "spec.marshal"))
        if spec is None:
            raise SystemExit(f"no readable spec.marshal in {attempt_dir}")
        self.spec = spec
        self.instances = [Instance(s) for s in spec["instances"]]
        self.started_at = time.time()
        self.stop_reason: str | None = None
        self.failed: Instance | None = None
        self.kill_at: float | None = None
        self.unterminated: list[Instance] = []  # stopping, but their processes were not there yet
        self.grace_s = float(spec["gang_grace_s"])
        # Why the attempt could not start (its network, a mount source): it fails, launch_failed
        self.launch_error: str | None = None
        self.slirp: tuple[int, int] | None = None  # (pid, exit pipe) of slirp4netns
        # When the attempt's processes were all gone, before the clean-up (finish): its end time.
        self.ended_at: float | None = None

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def run(self) -> None:
        old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, HANDLED)
        become_subreaper()
        me = {"pid": os.getpid(), "proc_start": proc_start(os.getpid()), "started_at": self.started_at}
        if not write_json_once(self.path("supervisor.json"), me):
            # Another supervisor of this attempt claimed it first: the launcher forked one but its
            # answer was lost (killed before it answered, or slower than the engine's wait), and
            # the engine started one directly. That one runs the attempt; this one does nothing.
            return
        bind_fds = (
            self.open_bind_sources() if self.stop_requested() is None and self.enter_network() else None
        )
        if bind_fds is not None:
            try:
                for inst in self.instances:
                    inst.spawn(old_mask, bind_fds)
            finally:
                bind_sources.close_all(bind_fds.values())  # each child has its own copies
            pids = {str(i.rank): i.pid for i in self.instances}
            starts = {r: proc_start(pid) if pid else None for r, pid in pids.items()}
            state = {"phase": "running", "pids": pids, "starts": starts, "started_at": self.started_at}
            write_json(self.path("state.json"), state)
            self.loop()
        elif self.launch_error is None:
            self.stop_reason = "stopped"
        # The end is when the last instance was reaped, not when status.json is written after
        # the clean-up (cgroups, network, secrets: up to seconds): the engine reports the attempt
        # running until then, so a stop may go out meanwhile, and an exit 0 that came before it
        # must read as before the stop (services.lifecycle, rule 1), not as the job answering it.
        self.ended_at = time.time()
        status = self.final_status()
        write_json(self.path("ended.json"), status)
        self.finish()
        write_json(self.path("status.json"), status)

    def enter_network(self) -> bool:
        """Into the attempt's own network namespace, which every instance then inherits (none in
        the spec: the host's). False, with `launch_error` set, when it cannot be made."""
        network = self.spec.get("network")
        if not network:
            return True
        try:
            self.slirp = netns.setup(network, self.path("slirp4netns.log"))
        except (netns.NetworkSetupError, OSError) as exc:
            self.launch_error = f"could not set up the job's network: {exc}"
            return False
        return True

    def open_bind_sources(self) -> dict[str, int] | None:
        """The instances' mount sources, opened now, just before bwrap binds them, without
        following a symlink (isolation/bind_sources.py): {host path: fd}. None, with
        `launch_error` naming the mount, when one is a symlink, missing or not a directory."""
        try:
            return bind_sources.open_sources(
                [i.spec["argv"] for i in self.instances], [i.spec.get("bind_fds", ()) for i in self.instances]
            )
        except bind_sources.BindSourceRefused as exc:
            self.launch_error = f"could not start the job: {exc}"
            return None

    def stop_requested(self) -> float | None:
        """The grace period of a stop the engine asked for (file `stop`), None when none."""
        try:
            with open(self.path("stop")) as f:
                text = f.read().strip()
        except OSError:
            return None
        try:
            return float(text)
        except ValueError:
            return DEFAULT_STOP_GRACE_S

    def loop(self) -> None:
        max_runtime = self.spec["max_runtime_s"]
        runtime_deadline = time.monotonic() + max_runtime if max_runtime else None
        while any(i.running for i in self.instances):
            now = time.monotonic()
            if self.kill_at is not None and now >= self.kill_at:
                for inst in self.instances:
                    inst.kill()
                self.kill_at = now + 1.0  # re-check until every instance has been reaped
            if runtime_deadline is not None and now >= runtime_deadline and self.stop_reason is None:
                self.begin_stop("timeout", self.grace_s)
                runtime_deadline = None
            self.unterminated = [i for i in self.unterminated if i.running and not i.terminate()]
            deadlines = [d for d in (self.kill_at, runtime_deadline) if d is not None]
            if self.unterminated:
                deadlines.append(now + 0.02)
            timeout = max(0.0, min(deadlines) - now) if deadlines else 3600.0
            info = _signal.sigtimedwait(HANDLED, timeout)
            if info is None:
                continue
            if info.si_signo == _signal.SIGCHLD:
                self.reap()
            else:
                # SIGUSR1 comes with the engine's `stop` file. A bare SIGTERM/SIGINT/SIGHUP is
                # someone stopping the supervisor itself (shutdown, cleanup script): stop the
                # jobs quickly so that the cgroups are gone before a SIGKILL may follow.
                grace = self.stop_requested()
                self.begin_stop("stopped", SIGNAL_STOP_GRACE_S if grace is None else grace)

    def reap(self) -> None:
        by_pid = {i.pid: i for i in self.instances if i.running}
        for pid, wait_status in exited_children():
            inst = by_pid.get(pid)
            if inst is None:
                continue
            inst.finished(wait_status)
            if inst.exit_code != 0 and self.failed is None and self.stop_reason is None:
                self.failed = inst
                self.begin_stop("gang", self.grace_s)

    def begin_stop(self, reason: str, grace_s: float) -> None:
        kill_at = time.monotonic() + max(0.0, grace_s)
        if self.stop_reason is not None:
            self.kill_at = min(self.kill_at or kill_at, kill_at)  # a later, shorter stop wins
            return
        self.stop_reason = reason
        self.kill_at = kill_at
        self.unterminated = [inst for inst in self.instances if not inst.terminate()]

    def outcome(self) -> Outcome:
        codes = [i.exit_code for i in self.instances if i.exit_code is not None]
        first_code = codes[0] if codes else None
        if self.launch_error is not None:
            message = self.launch_error
            return {"phase": "failed", "exit_code": None, "reason": "launch_failed", "message": message}
        if self.failed is not None and self.failed.refused is not None:
            return self.refusal_outcome(self.failed)
        if self.failed is not None:
            reason, message = describe_failure(self.failed)
            return {
                "phase": "failed",
                "exit_code": self.failed.exit_code,
                "reason": reason,
                "message": message,
            }
        if self.stop_reason == "timeout":
            limit = self.spec["max_runtime_s"]
            return {
                "phase": "failed",
                "exit_code": first_code,
                "reason": "timeout",
                "message": f"ran past {limit} s",
            }
        if self.stop_reason is not None:
            return {
                "phase": "failed",
                "exit_code": first_code,
                "reason": "stopped",
                "message": "stopped by Corral",
            }
        return {"phase": "succeeded", "exit_code": 0, "reason": None, "message": ""}

    def refusal_outcome(self, refused: Instance) -> Outcome:
        """A rank whose sandbox did not start the job's command (bwrap's refusal). The platform's
        failure, launch_failed (retried on the platform's budget), only when no rank's command
        ran: nothing of the job happened. Once another rank's may have run (its side effects,
        partial outputs), the attempt is the job's own failure, with bwrap's words, so that a
        re-run is charged to the job, and a job cannot turn its retries into the platform's by
        removing a dir bound for a later rank (review109 #3)."""
        message = f"rank {refused.rank}: the sandbox did not start the job: {refused.refused}"
        ran = [str(i.rank) for i in self.instances if i.may_have_run()]
        if not ran:
            return {"phase": "failed", "exit_code": None, "reason": "launch_failed", "message": message}
        ranks = f"rank{'s' if len(ran) > 1 else ''} {', '.join(ran)}"
        message += f"; {ranks} may have run the job's command, so this is the job's own failure"
        return {"phase": "failed", "exit_code": refused.exit_code, "reason": "exit_code", "message": message}

    def finish(self) -> None:
        """The clean-up once every instance has been reaped (status.json is written after it)."""
        for inst in self.instances:
            if inst.cgroup:
                cgroupfs.kill_all(inst.cgroup, timeout_s=5.0)
                cgroupfs.remove(inst.cgroup)
                cgroupfs.remove_attempt_dirs(inst.cgroup)
            work_dir = inst.spec["work_dir"]
            if inst.sandboxed and work_dir:
                # The job's uid goes back to the pool; its files must not be reachable by the
                # next job that gets the same uid.
                try:
                    os.chown(work_dir, 0, 0)
                    os.chmod(work_dir, 0o700)
                except OSError:
                    pass
        netns.teardown(self.slirp)
        secret_files.remove_secrets(self.path("secrets"))  # the values live as long as the attempt
        for _ in exited_children():  # orphans that were left to us
            pass
        uid_lock = self.spec["uid_lock"]
        if uid_lock:
            try:
                os.remove(os.path.join(uid_lock, "attempt"))
                os.rmdir(uid_lock)
            except OSError:
                pass

    def final_status(self) -> FinalStatus:
        return {
            **self.outcome(),
            "started_at": self.started_at,
            "finished_at": self.ended_at if self.ended_at is not None else time.time(),
            "instances": {str(i.rank): {"exit_code": i.exit_code, "oom": i.oom} for i in self.instances},
        }


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: supervisor.py <attempt_dir>")
    Supervisor(sys.argv[1]).run()


if __name__ == "__main__":
    main()
