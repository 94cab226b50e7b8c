"""A real Slurm cluster on one machine for tests and benchmarks.

munged (private socket), slurmctld and one `slurmd -N nodeX` per emulated node (Debian's slurmd is
built with multiple-slurmd support), each node with fake GPUs (character devices made with mknod:
slurmd rejects plain files in gres.conf). Everything lives in one temp dir, listens on free ports
and is stopped by PID. Recipe and timings: ../shared/notes/slurm-on-one-machine.md.

Each slurmd runs in its own UTS+PID namespace (`unshare --kill-child`): jobs see hostname=nodeX,
and one SIGKILL of the wrapper is a clean node crash (slurmd, slurmstepd and the job's processes
all die together; killing slurmd alone leaves its jobs running, which is the double-run trap).

Usage:
    with SlurmCluster() as cluster:
        env = cluster.env  # SLURM_CONF for sbatch/squeue/...
"""

from __future__ import annotations

import contextlib
import grp
import itertools
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel", "srun")
# Unix accounts the test jobs run as (Corral user -> account), made with useradd when missing and
# left in place afterwards (other sessions may be using them).
TEST_ACCOUNTS = {"alice": "corralt-alice", "bob": "corralt-bob", "admin": "corralt-admin"}
_state_dirs = itertools.count(1)


def ensure_accounts(names: list[str]) -> None:
    """Create the missing accounts: no home, no login shell, a group of their own."""
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            command = [*("useradd", "--no-create-home", "--home-dir", "/nonexistent"), "--user-group", name]
            done = _admin(command)
            try:
                pwd.getpwnam(name)
            except KeyError:  # (not root?): say what useradd said, not a bare KeyError
                raise AssertionError(f"{' '.join(command)} made no account {name}: {_said(done)}") from None


# The group gids a test server gives out (CORRAL_GID_RANGE, helpers.server_env), each the gid of a
# Unix group listing every test account: the admin step of docs/storage.md, "Identities", done as a
# site would, so that a server's jobs can enter their /group/<g> (and their logs do not open with
# the line saying that they cannot). A server test makes a handful of groups.
TEST_GIDS = range(4_300_000, 4_300_016)


def ensure_group_gids(gids: range, accounts: list[str]) -> None:
    """A Unix group `corralt-g<gid>` for each gid, listing `accounts` (made if missing)."""
    for gid in gids:
        try:
            grp.getgrgid(gid)
        except KeyError:  # (another session's harness may make it at the same time: checked below)
            command = ["groupadd", "-g", str(gid), f"corralt-g{gid}"]
            done = _admin(command)
            try:
                grp.getgrgid(gid)
            except KeyError:  # (not root? the name taken by another gid?): say what groupadd said
                raise AssertionError(
                    f"{' '.join(command)} made no group of gid {gid}: {_said(done)}"
                ) from None
        group = grp.getgrgid(gid)
        said = []
        for account in sorted(set(accounts) - set(group.gr_mem)):
            said.append(_said(_admin(["usermod", "-aG", group.gr_name, account])))
        missing = set(accounts) - set(grp.getgrgid(gid).gr_mem)
        assert not missing, (
            f"usermod could not add {sorted(missing)} to Unix group {group.gr_name}: {'; '.join(said)}"
        )


def _admin(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=30)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """What an admin command said, for the failure that follows it."""
    return f"exit {done.returncode}: {(done.stderr or done.stdout).strip() or 'nothing said'}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_binaries() -> list[str]:
    def found(name: str) -> bool:
        return shutil.which(name) is not None or os.path.exists(f"/usr/sbin/{name}")

    missing = [b for b in BINARIES if not found(b)]
    if shutil.which("unshare") is None:
        missing.append("unshare")
    return missing


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(p) for p in f.read().split())
    return out


def _stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(5)


@dataclass
class _Node:
    name: str
    port: int
    wrapper: subprocess.Popen[bytes] | None = None


class SlurmCluster:
    """Context manager that starts and stops a real Slurm cluster of `nodes` emulated nodes."""

    def __init__(
        self,
        nodes: int = 3,
        gpus_per_node: int = 4,
        cpus_per_node: int = 4,
        memory_mib: int = 4000,
        gpu_type: str = "vgpu",
        base_dir: Path | None = None,
        memory_cgroups: bool = False,
    ) -> None:
        """memory_cgroups: TaskPlugin=task/cgroup with ConstrainRAMSpace, so that a job over its
        --mem is OOM-killed and Slurm reports OUT_OF_MEMORY (needs a writable cgroup v1 memory
        hierarchy; off by default, the emulated nodes claim more memory than the box has)."""
        if nodes < 1 or gpus_per_node < 0:
            raise ValueError(f"need nodes >= 1 and gpus_per_node >= 0, got {nodes}, {gpus_per_node}")
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.memory_mib = memory_mib
        self.gpu_type = gpu_type
        self.memory_cgroups = memory_cgroups
        self._own_base = base_dir is None
        self.base = Path(base_dir or tempfile.mkdtemp(prefix="corral-slurm-"))
        self.ctld_port = free_port()
        # distinct job ids per cluster: two clusters on one machine share cgroup paths (uid_0/job_N)
        self.first_job_id = random.randint(1_000, 5_000_000)
        self.nodes = {f"node{i}": _Node(f"node{i}", free_port()) for i in range(1, nodes + 1)}
        self._munged: subprocess.Popen[bytes] | None = None
        self._ctld: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0

    # ---- paths and environment -------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands talking to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def node_names(self) -> list[str]:
        return list(self.nodes)

    @property
    def user_map(self) -> Path:
        """CORRAL_SLURM_USER_MAP for this cluster: TEST_ACCOUNTS as YAML."""
        return self.base / "etc" / "corral-users.yaml"

    @property
    def gpu_device(self) -> str:
        """CORRAL_SLURM_GPU_DEVICE: where the fake GPUs' device files lie."""
        return f"{self.base}/fakegpu/nvidia{{index}}"

    def new_state_dir(self) -> Path:
        """A fresh CORRAL_SLURM_STATE_DIR the job accounts can reach (pytest's tmp dirs are 0700)."""
        path = self.base / "corral" / f"state-{next(_state_dirs)}"
        path.mkdir(parents=True)
        return path

    def scratch_dir(self) -> Path:
        """A fresh dir any job may write in when it is mounted into its sandbox (tests' markers)."""
        path = self.base / "corral" / f"scratch-{next(_state_dirs)}"
        path.mkdir(parents=True)
        os.chmod(path, 0o1777)
        return path

    # ---- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        t0 = time.monotonic()
        try:
            self._write_files()
            self._start_munged()
            self.start_controller(fresh=True)
            for name in self.nodes:
                self.start_node(name, wait=False)
            self.wait_nodes_idle(list(self.nodes), timeout_s=60)
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - t0

    def stop(self) -> None:
        """Stop everything by PID. Nodes are SIGKILLed (their namespace takes the jobs with it):
        a graceful slurmd shutdown takes seconds per node and buys nothing at teardown."""
        for name in self.nodes:
            self.crash_node(name)
        if self._ctld is not None:
            _stop_process(self._ctld)
            self._ctld = None
        if self._munged is not None:
            _stop_process(self._munged)
            self._munged = None
        self._remove_cgroups()
        if self._own_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def _remove_cgroups(self) -> None:
        """task/cgroup leaves its per-node top directories (slurm_nodeX) behind; remove the empty
        ones (a busy one belongs to another cluster's running job and stays)."""
        for controller in Path("/sys/fs/cgroup").iterdir():
            for name in self.nodes:
                top = controller / f"slurm_{name}"
                if not top.is_dir():
                    continue
                for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)

    # ---- files ----------------------------------------------------------------------------------
    def _write_files(self) -> None:
        for sub in ("etc", "state", "log", "run", "fakegpu", "out", *(f"spool/{n}" for n in self.nodes)):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        os.chmod(self.base / "out", 0o1777)
        (self.base / "corral").mkdir(mode=0o711, exist_ok=True)
        ensure_accounts(list(TEST_ACCOUNTS.values()))
        ensure_group_gids(TEST_GIDS, list(TEST_ACCOUNTS.values()))
        self.user_map.write_text("".join(f"{user}: {account}\n" for user, account in TEST_ACCOUNTS.items()))
        key = self.base / "etc" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        for g in range(self.gpus_per_node):
            dev = self.base / "fakegpu" / f"nvidia{g}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, g))  # S_IFCHR, nvidia major
            os.chmod(dev, 0o666)  # as the driver makes them: access is the devices cgroup's call
        self.conf.write_text(self._slurm_conf())
        devices = f"{self.base}/fakegpu/nvidia[0-{self.gpus_per_node - 1}]"
        gres = "".join(
            f"NodeName={n} Name=gpu Type={self.gpu_type} File={devices}\n"
            for n in self.nodes
            if self.gpus_per_node
        )
        (self.base / "etc" / "gres.conf").write_text(gres)
        # slurmd always loads a cgroup plugin; IgnoreSystemd keeps cgroup/v2 from needing dbus
        # ConstrainDevices: a job can open only the GPUs Slurm allocated to it (devices cgroup)
        cgroup = "CgroupPlugin=autodetect\nIgnoreSystemd=yes\nConstrainDevices=yes\n"
        if self.memory_cgroups:
            cgroup += "ConstrainRAMSpace=yes\nConstrainSwapSpace=yes\nAllowedSwapSpace=0\n"
        (self.base / "etc" / "cgroup.conf").write_text(cgroup)

    def _slurm_conf(self) -> str:
        b = self.base
        gres = f" Gres=gpu:{self.gpu_type}:{self.gpus_per_node}" if self.gpus_per_node else ""
        node_lines = "".join(
            f"NodeName={n.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={n.port} "
            f"CPUs={self.cpus_per_node} RealMemory={self.memory_mib}{gres} State=UNKNOWN\n"
            for n in self.nodes.values()
        )
        # Why each non-default line is here: see the notes. In short: config_overrides lets fake
        # nodes claim more CPUs than the box has; batch_sched_delay=0 removes a 3 s scheduling delay;
        # SlurmdTimeout/MessageTimeout make node-failure detection ~12 s; no accounting DB.
        return f"""ClusterName=corraltest
FirstJobId={self.first_job_id}
SlurmctldHost=localhost
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={b}/run/munge.sock
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={b}/log/jobcomp.txt
SlurmdTimeout=5
MessageTimeout=3
SlurmctldTimeout=10
KillWait=3
MinJobAge=600
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
{node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    # ---- daemons --------------------------------------------------------------------------------
    def _log(self, name: str) -> int:
        return os.open(self.base / "log" / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _popen(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        fd = self._log(log)
        try:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd="/", start_new_session=True
            )
        finally:
            os.close(fd)

    def _start_munged(self) -> None:
        b = self.base
        self._munged = self._popen(
            [
                _binary("munged"),
                "-F",
                "-f",
                f"--socket={b}/run/munge.sock",
                f"--key-file={b}/etc/munge.key",
                f"--pid-file={b}/run/munged.pid",
                f"--log-file={b}/log/munged.log",
                f"--seed-file={b}/run/munged.seed",
            ],
            "munged.stdout",
        )
        self._wait(lambda: (b / "run" / "munge.sock").exists(), 10, "munged socket", self._munged)

    def start_controller(self, fresh: bool = False) -> None:
        """Start slurmctld; fresh=True ignores saved state (-i), else it recovers its jobs."""
        argv = [_binary("slurmctld"), "-D", "-f", str(self.conf)]
        if fresh:
            argv.insert(2, "-i")
        self._ctld = self._popen(argv, "slurmctld.stdout")
        self._wait(self.controller_up, 30, "slurmctld", self._ctld)

    def stop_controller(self) -> None:
        if self._ctld is not None:
            _stop_process(self._ctld)
            self._ctld = None

    def pause_controller(self) -> None:
        """SIGSTOP slurmctld: every Slurm command then waits on it (a controller too busy to
        answer), and a request sent meanwhile is taken once it is resumed."""
        assert self._ctld is not None, "slurmctld is not running"
        os.kill(self._ctld.pid, signal.SIGSTOP)

    def resume_controller(self) -> None:
        if self._ctld is not None:
            os.kill(self._ctld.pid, signal.SIGCONT)

    def controller_up(self) -> bool:
        r = subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True, text=True, timeout=15)
        return "is UP" in r.stdout

    def start_node(self, name: str, wait: bool = True) -> None:
        """Start one node's slurmd as the init of its own UTS+PID namespace (a `sh` that reaps
        orphans: slurmd as pid 1 would leave a zombie per job step)."""
        node = self.nodes[name]
        script = f"hostname {name}; {_binary('slurmd')} -D -N {name} -f {self.conf} & wait"
        node.wrapper = self._popen(
            ["unshare", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script],
            f"slurmd-{name}.stdout",
        )
        if wait:
            self.wait_nodes_idle([name], timeout_s=30)

    def crash_node(self, name: str) -> None:
        """SIGKILL the node's namespace: slurmd, slurmstepd and every job process die at once."""
        node = self.nodes[name]
        if node.wrapper is not None:
            _stop_process(node.wrapper, signal.SIGKILL)
            node.wrapper = None

    def slurmd_pid(self, name: str) -> int | None:
        """Root-namespace PID of the node's slurmd."""
        node = self.nodes[name]
        if node.wrapper is None:
            return None
        for init in _children(node.wrapper.pid):
            for child in _children(init):
                with contextlib.suppress(OSError), open(f"/proc/{child}/comm") as f:
                    if f.read().strip().startswith("slurmd"):
                        return child
        return None

    def daemon_pids(self) -> dict[str, list[int]]:
        """Root-namespace PIDs of the cluster's processes, by part: slurmctld, munged, slurmd and
        steps (each node's namespace init, which reaps the detached slurmstepds and so holds their
        and their jobs' CPU as its children's). For measuring CPU by process (bench/job_latency.py)."""
        out: dict[str, list[int]] = {"slurmctld": [], "munged": [], "slurmd": [], "steps": []}
        for part, proc in (("slurmctld", self._ctld), ("munged", self._munged)):
            if proc is not None:
                out[part].append(proc.pid)
        for name, node in self.nodes.items():
            if node.wrapper is not None:
                out["steps"].extend(_children(node.wrapper.pid))
            slurmd = self.slurmd_pid(name)
            if slurmd is not None:
                out["slurmd"].append(slurmd)
        return out

    def node_states(self) -> dict[str, str]:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True, text=True, timeout=15
        )
        return dict(line.split(None, 1) for line in r.stdout.splitlines() if line.strip())

    def wait_nodes_idle(self, names: list[str], timeout_s: float) -> None:
        def idle() -> bool:
            states = self.node_states()
            return all(states.get(n) == "idle" for n in names)

        self._wait(idle, timeout_s, f"nodes {names} idle", None)

    def _wait(self, check: object, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None) -> None:
        assert callable(check)
        deadline = time.monotonic() + timeout_s
        while not check():
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what}: process exited with {proc.returncode}; logs in {self.base}/log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout_s}s; logs in {self.base}/log")
            time.sleep(0.03)


if __name__ == "__main__":  # manual smoke: python tests/slurm/harness.py
    with SlurmCluster() as c:
        print(f"up in {c.started_in_s:.2f}s at {c.base}; nodes: {c.node_states()}")
