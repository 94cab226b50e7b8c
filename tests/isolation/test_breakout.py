"""Jobs that try to break out of their sandbox; every attempt must fail. Real bubblewrap, real
cgroups (v1 on the CI machine), virtual GPUs backed by real character-device stand-ins."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.engine.base import AttemptLaunch, AttemptPhase, FailureReason, InstanceLaunch, MountSpec
from corral.engine.local import LocalEngine
from corral.engine.local.supervisor import proc_start
from corral.scheduler.types import GPU
from tests.engine.contract import new_attempt_id, wait_finished, wait_for, wait_log, writable_mounts
from tests.engine.local_support import local_engine_factory
from tests.support import dir_for_job_accounts, require, require_binary

pytestmark = pytest.mark.isolation
PIDS_MAX = 64


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def factory(home: Path) -> Iterator[Callable[[], LocalEngine]]:
    require_binary("bwrap")
    with local_engine_factory(home, pids_max=PIDS_MAX) as make:
        caps = make().capabilities()
        require(
            caps.sandbox and caps.cgroups and caps.devices_cgroup,
            "bwrap, cgroups and devices cgroup",
        )
        yield make


@pytest.fixture
def engine(factory: Callable[[], LocalEngine]) -> LocalEngine:
    return factory()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A dir any job account may write, for a release marker from the test."""
    with dir_for_job_accounts("corral-breakout-") as path:
        yield path


def attempt(
    command: str,
    gpus: tuple[GPU, ...] = (),
    memory_mib: int = 256,
    mounts: tuple[MountSpec, ...] = (),
    max_runtime_s: float | None = None,
    user: str = "alice",
) -> AttemptLaunch:
    aid = new_attempt_id()
    inst = InstanceLaunch("worker", 0, 0, "node-a", gpus, 1.0, memory_mib, command, {"RANK": "0"})
    return AttemptLaunch(
        aid, aid.split(".")[0], 1, user, "team", (inst,), max_runtime_s=max_runtime_s, mounts=mounts
    )


def run(engine: LocalEngine, launch: AttemptLaunch, timeout: float = 20) -> tuple[AttemptPhase, str]:
    engine.launch(launch)
    status = wait_finished(engine, launch.attempt_id, timeout)
    return status.phase, engine.logs(launch.attempt_id, 0).data.decode(errors="replace")


def job_processes(engine: LocalEngine, attempt_id: str) -> list[int]:
    """Host pids of the job's own processes (below bwrap and its init)."""
    state = json.loads((engine.attempts_dir / attempt_id / "state.json").read_text())
    found: list[int] = []
    todo = [int(state["pids"]["0"])]
    while todo:
        pid = todo.pop()
        for tid in os.listdir(f"/proc/{pid}/task"):
            kids = [int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            found += kids
            todo += kids
    return found[1:]  # the first child is bwrap's init


def test_runs_unprivileged_with_own_proc_and_tmp(engine: LocalEngine, tmp_path: Path) -> None:
    (tmp_path / "host-marker").write_text("x")
    phase, out = run(
        engine,
        attempt(
            "id -u; id -G; ls /proc | grep -c '^[0-9]'; echo \"[$(echo $(ls -A /tmp))]\"; ls /tmp/host-marker"
        ),
    )
    uid, groups, nprocs, tmp_entries = out.splitlines()[:4]
    assert phase is AttemptPhase.FAILED  # the last ls fails: the host's /tmp is not there
    assert int(uid) >= 1000 and groups == uid, out  # a per-job uid, no supplementary groups
    assert int(nprocs) <= 4, f"sees {nprocs} processes: not its own pid namespace"
    # A fresh /tmp: empty, but for the way down to the job's Python environment when that lives
    # under the host's /tmp (a checkout in /tmp, as CI may have), which is bound read-only.
    env_tops = {Path(p).parts[2] for p in engine.environments["default"] if Path(p).parts[1:2] == ("tmp",)}
    assert set(tmp_entries.strip("[]").split()) == env_tops, out
    assert "No such file" in out


def test_cannot_read_another_jobs_work_dir(engine: LocalEngine) -> None:
    victim = attempt("echo topsecret > $CORRAL_WORK_DIR/secret; echo ready; sleep 30")
    engine.launch(victim)
    wait_log(engine, victim.attempt_id, b"ready")
    victim_dir = engine.attempts_dir / victim.attempt_id / "work" / "0"
    thief = attempt(
        f"cat {victim_dir}/secret; cat {engine.attempts_dir}/*/work/*/secret; cat /job/../*/secret; true"
    )
    phase, out = run(engine, thief)
    assert phase is AttemptPhase.SUCCEEDED
    assert "topsecret" not in out
    # Even were the path visible, the file system says no: another uid, mode 0700.
    st = victim_dir.stat()
    thief_spec = engine.attempt_spec(thief.attempt_id)
    assert thief_spec is not None
    thief_uid = thief_spec["uid"]
    assert st.st_uid not in (0, thief_uid) and st.st_mode & 0o077 == 0
    engine.stop(victim.attempt_id, 0)


def test_cannot_read_shadow_or_the_server_database(engine: LocalEngine, home: Path) -> None:
    db = home / "corral.db"
    db.write_text("admin-token-hash")
    _, out = run(engine, attempt(f"cat /etc/shadow; cat {db}; ls /etc; cat /etc/passwd"))
    assert "admin-token-hash" not in out
    assert "root:$" not in out and "root:*" not in out  # no shadow entries
    etc = set(out.split())
    assert "shadow" not in etc and "gshadow" not in etc and "sudoers" not in etc
    assert "alice:x:" in out  # the generated passwd names the job's user
    # the whitelisted host files, bound read-only from the host
    _, hosts = run(engine, attempt("cat /etc/hosts; test -s /etc/ld.so.cache && echo ld-cache-ok"))
    assert Path("/etc/hosts").read_text() in hosts and "ld-cache-ok" in hosts


def test_users_and_groups_resolve_from_the_sandboxs_own_files(engine: LocalEngine) -> None:
    """The job's nsswitch.conf answers passwd and group from the generated files only (setpriv no
    longer loads the host's other NSS modules at every start); names still resolve."""
    phase, out = run(engine, attempt("grep -E '^(passwd|group|hosts):' /etc/nsswitch.conf; id -un; id -gn"))
    assert phase is AttemptPhase.SUCCEEDED, out
    lines = out.split("\n")
    assert "passwd: files" in lines and "group: files" in lines, out
    host_hosts = [
        line for line in Path("/etc/nsswitch.conf").read_text().splitlines() if line.startswith("hosts:")
    ]
    assert host_hosts and host_hosts[0] in lines  # the other databases are the host's
    assert lines[-3:-1] == ["alice", "alice"], out


def test_cannot_read_server_secrets(engine: LocalEngine, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's config (admin token), its database and a database password in its environment
    are out of a job's reach, even were the files world-readable (the sandbox does not hold them).
    The Slurm twin: tests/slurm/test_slurm_users.py."""
    (home / "config.yaml").write_text("url: http://127.0.0.1:8080\ntoken: crl_admintoken_7d1e\n")
    (home / "corral.db").write_text("SQLite format 3 token-hash-9a8b")
    for f in (home, home / "config.yaml", home / "corral.db"):
        f.chmod(0o755 if f.is_dir() else 0o644)
    monkeypatch.setenv("CORRAL_DATABASE_URL", "postgresql://corral:db-pass-3c4d@127.0.0.1/corral")
    monkeypatch.setenv("PGPASSWORD", "db-pass-3c4d")
    reader = f"cat {home}/config.yaml {home}/corral.db {home}/engine/attempts/*/spec.marshal; ls {home}; env"
    phase, out = run(engine, attempt(f"{reader}; echo finished"))
    assert phase is AttemptPhase.SUCCEEDED and "finished" in out and "RANK=0" in out, out
    for secret in ("crl_admintoken_7d1e", "token-hash-9a8b", "db-pass-3c4d"):
        assert secret not in out, (secret, out)


def test_cannot_signal_another_job(engine: LocalEngine) -> None:
    victim = attempt("echo ready; sleep 30")
    engine.launch(victim)
    wait_log(engine, victim.attempt_id, b"ready")
    victim_pids = job_processes(engine, victim.attempt_id)
    assert victim_pids
    kills = "; ".join(f"kill -9 {p}" for p in victim_pids)
    _, out = run(engine, attempt(f"{kills}; kill -9 -1; echo done"))
    time.sleep(0.2)
    assert engine.poll([victim.attempt_id])[victim.attempt_id].phase is AttemptPhase.RUNNING, out
    assert all(Path(f"/proc/{p}").exists() for p in victim_pids)
    engine.stop(victim.attempt_id, 0)
    assert wait_finished(engine, victim.attempt_id).reason is FailureReason.STOPPED


def test_sees_only_its_own_gpus(engine: LocalEngine) -> None:
    gpus = engine.inventory.gpus
    assert len(gpus) == 4
    mine = (gpus[1], gpus[3])
    neighbour = attempt("ls /dev | grep nvidia; echo CVD=$CUDA_VISIBLE_DEVICES; sleep 30", gpus=(gpus[0],))
    engine.launch(neighbour)
    phase, out = run(engine, attempt("ls /dev | grep nvidia; echo CVD=$CUDA_VISIBLE_DEVICES", gpus=mine))
    assert phase is AttemptPhase.SUCCEEDED
    listed = [line for line in out.splitlines() if line.startswith("nvidia")]
    assert sorted(listed) == ["nvidia-uvm", "nvidia1", "nvidia3", "nvidiactl"]
    assert f"CVD={gpus[1].uuid},{gpus[3].uuid}" in out
    n_out = wait_log(engine, neighbour.attempt_id, b"CVD=").decode()
    assert sorted(n for n in n_out.split() if n.startswith("nvidia")) == [
        "nvidia-uvm",
        "nvidia0",
        "nvidiactl",
    ]
    engine.stop(neighbour.attempt_id, 0)


def test_devices_cgroup_denies_unallocated_gpus(engine: LocalEngine, home: Path) -> None:
    """The second wall behind device binding: a process in a job's cgroup cannot open a GPU node
    it was not given even when the node is reachable (here: the host's stand-ins)."""
    from corral.engine.isolation import cgroupfs

    cg = cgroupfs.create_instance_cgroup(
        Path("/sys/fs/cgroup"), 1, engine.cgroup_parent, "devtest/0", 128, 1.0, 16, [(195, 1), (195, 255)]
    )
    probe = (
        "import os, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n        os.open(name, os.O_RDWR); print(name, 'opened')\n"
        "    except OSError as e:\n        print(name, e.strerror)\n"
    )
    dev = home / "dev"
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe, str(dev / "nvidia0"), str(dev / "nvidia1")],
            preexec_fn=lambda: cgroupfs.join(dict(cg), os.getpid()),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        cgroupfs.remove(dict(cg))
        cgroupfs.remove_attempt_dirs(dict(cg))
    assert f"{dev / 'nvidia0'} Operation not permitted" in out  # denied by the devices cgroup
    assert f"{dev / 'nvidia1'} No such device or address" in out  # allowed: only no driver behind it


def test_cannot_write_outside_allowed_mounts(engine: LocalEngine, tmp_path: Path) -> None:
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    os.chmod(rw, 0o777)
    mounts = (MountSpec(str(ro), "/data", True), MountSpec(str(rw), "/mnt/deep/out", False))
    targets = [
        "/usr/evil",
        "/etc/evil",
        "/evil",
        "/data/evil",
        "/proc/evil",
        f"{tmp_path}/evil",
        "/mnt/deep/out/ok",
        "/job/ok",
    ]
    script = "; ".join(f"(echo x > {t}) 2>/dev/null && echo wrote {t} || echo denied {t}" for t in targets)
    phase, out = run(engine, attempt(script, mounts=mounts))
    assert phase is AttemptPhase.SUCCEEDED
    for t in targets[:-2]:
        assert f"denied {t}" in out, out
    assert "wrote /mnt/deep/out/ok" in out and "wrote /job/ok" in out
    assert (rw / "ok").exists() and not (ro / "evil").exists() and not (tmp_path / "evil").exists()
    assert not Path("/usr/evil").exists() and not Path("/evil").exists()


def test_limits_come_from_the_request(engine: LocalEngine) -> None:
    aid = new_attempt_id()
    inst = InstanceLaunch("worker", 0, 0, "node-a", (), 0.5, 200, "echo ready; sleep 30", {})
    engine.launch(AttemptLaunch(aid, aid.split(".")[0], 1, "alice", "team", (inst,)))
    wait_log(engine, aid, b"ready")
    cg = Path("/sys/fs/cgroup")
    leaf = f"{engine.cgroup_parent}/{aid}/0"
    assert int((cg / "memory" / leaf / "memory.limit_in_bytes").read_text()) == 200 << 20
    # 0.5 CPU: half of each (1 s, fractional-CPU) period.
    assert int((cg / "cpu" / leaf / "cpu.cfs_quota_us").read_text()) == 500_000
    assert int((cg / "cpu" / leaf / "cpu.cfs_period_us").read_text()) == 1_000_000
    assert (cg / "pids" / leaf / "pids.max").read_text().strip() == str(PIDS_MAX)
    job_pids = set(job_processes(engine, aid))
    assert job_pids and job_pids <= {
        int(p) for p in (cg / "memory" / leaf / "cgroup.procs").read_text().split()
    }
    engine.stop(aid, 0)
    wait_finished(engine, aid)
    assert not (cg / "memory" / leaf).exists()


def test_fork_bomb_stops_at_the_pids_limit(engine: LocalEngine) -> None:
    # Every process forks for ever and shrugs off failures: only pids.max holds it.
    forever = "\n".join(
        [
            "import os, time",
            "while True:",
            "    try:",
            "        os.fork()",
            "    except OSError:",
            "        time.sleep(0.01)",
        ]
    )
    bomb = attempt(f"echo bombing; python3 -c '{forever}'", max_runtime_s=2.0)
    engine.launch(bomb)
    wait_log(engine, bomb.attempt_id, b"bombing")
    pids_dir = Path("/sys/fs/cgroup/pids") / engine.cgroup_parent / bomb.attempt_id / "0"

    def pids_and_limit_hits() -> tuple[int, int]:
        try:
            current = int((pids_dir / "pids.current").read_text())
            return current, int((pids_dir / "pids.events").read_text().split()[1])
        except FileNotFoundError:
            raise AssertionError("the bomb's cgroup went away before it ever hit the limit") from None

    # Until the bomb reaches the limit (how soon depends on the machine's load), not a fixed time;
    # it must get there before its 2 s runtime ends and takes its cgroup away.
    deadline = time.monotonic() + 30
    while (counts := pids_and_limit_hits())[1] == 0:
        assert time.monotonic() < deadline, "the limit was never hit"
        time.sleep(0.01)
    current = counts[0]
    assert 0 < current <= PIDS_MAX
    phase, out = run(engine, attempt("for i in 1 2 3 4 5; do sh -c 'echo forked'; done"))
    assert phase is AttemptPhase.SUCCEEDED and out.count("forked") == 5  # a neighbour still forks
    status = wait_finished(engine, bomb.attempt_id, timeout=20)
    assert status.reason is FailureReason.TIMEOUT
    assert not pids_dir.exists(), "cgroup left behind: processes survived"


def test_memory_overrun_is_oom_killed_and_spares_the_neighbour(engine: LocalEngine, shared_dir: Path) -> None:
    # The neighbour holds its memory until the test releases it (after the hog's OOM kill), not for
    # a fixed 2.5 s that a slow start of the hog could use up before the neighbour is checked.
    release = shared_dir / "release"
    keeper = (
        'python3 -c "import os, time, hashlib; b = bytes(range(256)) * (200 << 12);'
        " h = hashlib.sha1(b).hexdigest();"
        " print('holding', flush=True);"
        f" [time.sleep(0.05) for _ in iter(lambda: os.path.exists('{release}'), True)];"
        " print('intact' if hashlib.sha1(b).hexdigest() == h else 'corrupted', flush=True)\""
    )
    neighbour = attempt(keeper, memory_mib=512, mounts=writable_mounts(shared_dir))
    engine.launch(neighbour)
    wait_log(engine, neighbour.attempt_id, b"holding")
    hog = attempt("python3 -c \"b = bytearray(400 << 20); print('survived')\"", memory_mib=96)
    phase, out = run(engine, hog)
    status = engine.poll([hog.attempt_id])[hog.attempt_id]
    assert phase is AttemptPhase.FAILED and status.reason is FailureReason.OOM, (status, out)
    assert "survived" not in out
    assert engine.poll([neighbour.attempt_id])[neighbour.attempt_id].phase is AttemptPhase.RUNNING
    release.touch()
    n_status = wait_finished(engine, neighbour.attempt_id)
    assert n_status.phase is AttemptPhase.SUCCEEDED
    assert b"intact" in engine.logs(neighbour.attempt_id, 0).data


HOST_SCRIPT = """
import sys, time
from pathlib import Path
from corral.engine.local import LocalEngine
from tests.engine.contract import make_attempt
engine = LocalEngine(Path(sys.argv[1]), "node-a", virtual_gpus=4, cgroup_parent=sys.argv[2])
shared = Path(sys.argv[3])  # the jobs run until the test creates `release` in it
for n, aid in enumerate(sys.argv[4:]):
    # the first supervisor is started directly, the second by the launcher the first start began
    waits = f"echo ready; while [ ! -e {shared}/release ]; do sleep 0.05; done; exit {6 + n}"
    attempt = make_attempt(["node-a"], waits, attempt_id=aid, rw_mounts=[shared])
    print(engine.launch(attempt), flush=True)
    while engine._launcher_pid() is None:
        time.sleep(0.01)
time.sleep(60)
"""


def test_sigkill_of_the_engine_host_leaves_jobs_running(
    factory: Callable[[], LocalEngine], home: Path, shared_dir: Path
) -> None:
    probe = factory()
    ids = [new_attempt_id(), new_attempt_id()]
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, str(home), probe.cgroup_parent, str(shared_dir), *ids],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
    )
    try:
        assert host.stdout is not None
        refs = {aid: host.stdout.readline().decode().strip() for aid in ids}
        for aid in ids:
            wait_log(probe, aid, b"ready")
        launcher = probe._launcher_pid()
        assert launcher is not None
    finally:
        os.killpg(host.pid, signal.SIGKILL)  # the whole "server" process group, no warning
        host.wait()
    again = factory()
    again.adopt(refs)
    assert {s.phase for s in again.poll(ids).values()} == {AttemptPhase.RUNNING}
    (shared_dir / "release").touch()
    for n, aid in enumerate(ids):
        status = wait_for(again, aid, lambda s: s.phase.finished, 20)
        assert status.exit_code == 6 + n and status.engine_ref == refs[aid]
    deadline = time.monotonic() + 3
    while proc_start(launcher) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc_start(launcher) is None, "the launcher outlived the server that started it"
