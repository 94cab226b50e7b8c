"""The network namespace of one attempt on the local engine (see docs/isolation.md, "Network").

The attempt's supervisor moves ITSELF into a new network namespace before it starts any instance
(`enter_new_namespace`): every instance it forks (bwrap and the job below it) inherits that
namespace, so all instances of one job share one loopback and rendezvous on 127.0.0.1
(MASTER_ADDR of the local node), while nothing on the host's loopback (the Corral API,
PostgreSQL, Prometheus, abstract unix sockets) is reachable. No holder process is needed and
nothing can leak: the kernel frees the namespace when its last process (the supervisor or a job
process) is gone. The supervisor talks to the engine only through files and signals, so it does
not need the host's network itself. A restarted server finds the namespace, should it need to
enter it, at /proc/<supervisor pid>/ns/net (`namespace_path`).

Outbound policy `internet`: slirp4netns (a user-mode TCP/IP stack) runs in the HOST namespace
and gives the job's namespace a tap device with a default route; `--disable-host-loopback`
refuses connections to the gateway 10.0.2.2, which slirp would otherwise map to the host's
127.0.0.1. It exits when the supervisor closes its exit pipe (at the end of the attempt or when
the supervisor dies, even by SIGKILL).

This module is imported by the lean supervisor: standard library C modules only at import time;
ctypes (~5-20 ms to import) is loaded when a namespace is made, and the launcher preloads it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # mypy reads this as typing.TYPE_CHECKING; typing itself is not imported
if TYPE_CHECKING:  # ctypes and socket are imported when used (not at the supervisor's start)
    import ctypes
    import socket

    from corral.engine.local.files import NetworkSpec

CLONE_NEWNET = 0x40000000
SIOCSIFFLAGS = 0x8914
IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40
NETWORK_MODES = ("isolated", "host")
OUTBOUND_POLICIES = ("none", "internet")
SLIRP_READY_TIMEOUT_S = 10.0
SLIRP_TAP = "tap0"
SLIRP_DNS = "10.0.2.3"  # slirp's DNS forwarder, which asks the host's resolvers from outside


class NetworkSetupError(Exception):
    """The attempt's namespace could not be made as its policy asks: the attempt must not run."""


def _libc() -> ctypes.CDLL:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise NetworkSetupError(f"{what} failed: {os.strerror(errno)} (errno {errno})")


def enter_new_namespace() -> int:
    """Moves the calling process into a new network namespace with `lo` up. Returns an fd of the
    namespace it came from (the host's), for starting slirp4netns there; the caller closes it."""
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        bring_up_loopback()
    except BaseException:
        os.close(host_ns)
        raise
    return host_ns


def bring_up_loopback() -> None:
    """`ip link set lo up`, without starting a process: SIOCSIFFLAGS on a throwaway socket (the
    kernel gives a new namespace's lo 127.0.0.1/8 and ::1, but leaves it down)."""
    import _socket
    import fcntl
    import struct

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", IFF_UP_LOOPBACK_RUNNING))
    except OSError as exc:
        raise NetworkSetupError(f"cannot bring up lo in the job's network namespace: {exc}") from exc
    finally:
        sock.close()


def start_slirp(slirp4netns: str, host_ns: int, log_path: str) -> tuple[int, int]:
    """Starts slirp4netns in the host namespace, attached to the caller's (new) namespace, and
    waits until the tap device is configured. Returns (pid, exit pipe fd): closing the fd makes
    slirp4netns exit, and so does the death of the caller, which holds the only write end."""
    target = os.getpid()
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs
        _exec_slirp(slirp4netns, host_ns, target, ready_w, exit_r, log_path)
    os.close(ready_w)
    os.close(exit_r)
    try:
        ready = _read_with_timeout(ready_r, SLIRP_READY_TIMEOUT_S)
    finally:
        os.close(ready_r)
    if ready != b"1":
        os.close(exit_w)
        _kill_and_reap(pid)
        raise NetworkSetupError(
            f"slirp4netns exited or did not configure the job's network within "
            f"{SLIRP_READY_TIMEOUT_S:.0f} s (see {log_path})"
        )
    return pid, exit_w


def _exec_slirp(
    slirp4netns: str, host_ns: int, target: int, ready_w: int, exit_r: int, log_path: str
) -> None:
    try:
        _check(_libc().setns(host_ns, CLONE_NEWNET), "setns(host network)")
        os.set_inheritable(ready_w, True)
        os.set_inheritable(exit_r, True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        argv = [
            slirp4netns,
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            # It parses the job's packets as root in the host's namespace: confine it (own mount
            # namespace with an empty root, capabilities dropped; seccomp denies execve, mount,
            # setns, ptrace and the like), so a libslirp bug does not give the job the host.
            "--enable-sandbox",
            "--enable-seccomp",
            f"--ready-fd={ready_w}",
            f"--exit-fd={exit_r}",
            str(target),
            SLIRP_TAP,
        ]
        os.execv(slirp4netns, argv)
    except BaseException as exc:
        try:
            os.write(2, f"corral supervisor: cannot start slirp4netns: {exc}\n".encode())
        finally:
            os._exit(127)


def _read_with_timeout(fd: int, timeout_s: float) -> bytes:
    import select

    readable, _, _ = select.select([fd], [], [], timeout_s)
    return os.read(fd, 16) if readable else b""


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def namespace_path(supervisor_pid: int) -> str:
    """Where the attempt's namespace can be entered (`nsenter --net=<path>`, setns) while its
    supervisor runs: the hook for proxies that must reach inside (port-forward, JupyterLab)."""
    return f"/proc/{supervisor_pid}/ns/net"


def connect_inside(namespace: str, port: int, timeout_s: float = 5.0) -> socket.socket:
    """A TCP connection to 127.0.0.1:`port` of a job's namespace (`namespace_path`), made from
    outside: the hook for a JupyterLab proxy or `corral port-forward`, which must reach a job's
    loopback without letting the job out. A throwaway thread `setns`es into the namespace and
    connects; the socket stays in the namespace it was made in, whichever thread then uses it,
    and the rest of the process never changes namespace. Needs root (CAP_SYS_ADMIN)."""
    import socket
    import threading

    result: list[socket.socket | OSError | NetworkSetupError] = []

    def connect() -> None:
        try:
            fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _check(_libc().setns(fd, CLONE_NEWNET), f"setns({namespace})")
            finally:
                os.close(fd)
            result.append(socket.create_connection(("127.0.0.1", port), timeout=timeout_s))
        except (OSError, NetworkSetupError) as exc:
            result.append(exc)

    thread = threading.Thread(target=connect, name="corral-netns-connect", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if not result:
        raise TimeoutError(f"no connection to port {port} in {namespace} within {timeout_s} s")
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


class NetworkPolicy:
    """The admin's network settings for jobs, checked against what this machine can do."""

    def __init__(self, mode: str, outbound: str) -> None:
        if mode not in NETWORK_MODES:
            raise ValueError(f"job network {mode!r} is not one of {', '.join(NETWORK_MODES)}")
        if outbound not in OUTBOUND_POLICIES:
            raise ValueError(f"job outbound {outbound!r} is not one of {', '.join(OUTBOUND_POLICIES)}")
        self.mode = mode
        self.outbound = outbound
        self.slirp4netns: str | None = None
        self.problems: list[str] = []

    @property
    def isolated(self) -> bool:
        return self.mode == "isolated"

    def probe(self) -> NetworkPolicy:
        """Fills `problems` with what stops this machine from applying the policy."""
        import shutil
        import subprocess

        if not self.isolated:
            return self
        if os.geteuid() != 0:
            self.problems.append("not running as root: cannot give jobs their own network namespace")
            return self
        try:
            trial = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10)
            err = trial.stderr.decode(errors="replace").strip() if trial.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            err = f"{exc} (unshare is in util-linux)"
        if err:
            self.problems.append(f"cannot create network namespaces here: {err}")
        if self.outbound == "internet":
            self.slirp4netns = shutil.which("slirp4netns")
            if self.slirp4netns is None:
                self.problems.append(
                    "outbound policy 'internet' needs slirp4netns: apt-get install slirp4netns"
                )
        return self

    def summary(self) -> str:
        if not self.isolated:
            return "host network (jobs share the node's network namespace)"
        if self.problems:
            return "NO network isolation: " + "; ".join(self.problems)
        outbound = "none"
        if self.outbound == "internet":
            outbound = "internet via slirp4netns, host loopback blocked"
        return f"own network namespace per job, outbound: {outbound}"

    def etc_files(self, etc_dir: str | os.PathLike[str]) -> dict[str, str]:
        """Files of the job's /etc that the policy needs ({sandbox path: host path}): with
        `internet`, a resolv.conf naming slirp's DNS, as the host's may name a resolver on its
        loopback (systemd-resolved's 127.0.0.53), which the job cannot reach."""
        if self.spec() is None or self.outbound != "internet":
            return {}
        path = os.path.join(str(etc_dir), "resolv.conf")
        with open(path, "w") as f:
            f.write(f"nameserver {SLIRP_DNS}\n")
        os.chmod(path, 0o644)
        return {"/etc/resolv.conf": path}

    def spec(self) -> NetworkSpec | None:
        """What the supervisor needs (None: stay in the host's namespace)."""
        if not self.isolated or self.problems:
            return None
        return {"outbound": self.outbound, "slirp4netns": self.slirp4netns}


def setup(network: NetworkSpec, log_path: str) -> tuple[int, int] | None:
    """For the supervisor, before it starts any instance: enter the attempt's own namespace and,
    for outbound `internet`, attach slirp4netns. Returns what `teardown` needs (None: no slirp)."""
    host_ns = enter_new_namespace()
    try:
        if network.get("outbound") != "internet":
            return None
        slirp = network.get("slirp4netns")
        if not slirp:
            raise NetworkSetupError("outbound policy 'internet' but no slirp4netns on this node")
        return start_slirp(slirp, host_ns, log_path)
    finally:
        os.close(host_ns)


def teardown(slirp: tuple[int, int] | None, timeout_s: float = 2.0) -> None:
    """Stops slirp4netns (closing its exit pipe) and reaps it; SIGKILL if it lingers."""
    if slirp is None:
        return
    import time

    pid, exit_fd = slirp
    try:
        os.close(exit_fd)
    except OSError:
        pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # already reaped with the other children
        if done:
            return
        time.sleep(0.005)
    _kill_and_reap(pid)
