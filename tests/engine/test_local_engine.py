"""Local-engine behaviour beyond the shared contract: start-up checks, refusals, env handling,
a dead supervisor."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.config import Settings
from corral.engine.base import AttemptLaunch, AttemptPhase, FailureReason, InstanceLaunch
from corral.engine.factory import make_engine
from corral.engine.local import LocalEngine
from corral.engine.local.engine import SUPERVISOR_BOOT
from corral.engine.local.process_files import spawn_detached
from corral.engine.local.supervisor import ORPHANED_EXIT, descendants, proc_start, to_json
from corral.scheduler.types import NodeState
from tests.engine.contract import make_attempt, new_attempt_id, wait_finished, wait_log
from tests.engine.local_support import local_engine_factory
from tests.support import require, require_binary


def one(engine: LocalEngine, command: str, env: dict[str, str] | None = None, gpus: int = 0) -> AttemptLaunch:
    aid = new_attempt_id()
    inst = InstanceLaunch(
        "w", 0, 0, engine.node_name, engine.inventory.gpus[:gpus], 1.0, 128, command, env or {"RANK": "0"}
    )
    return AttemptLaunch(aid, aid.split(".")[0], 1, "bob", "team", (inst,))


def started_in_sandbox(engine: LocalEngine, command: str) -> tuple[AttemptLaunch, int, Path]:
    """`command` (which echoes `ready`) launched with cgroups and running: the attempt, its
    supervisor's pid and its cgroup's procs dir."""
    require(engine.capabilities().cgroups, "cgroups")
    attempt = one(engine, command)
    engine.launch(attempt)
    wait_log(engine, attempt.attempt_id, b"ready")
    sup = json.loads((engine.attempts_dir / attempt.attempt_id / "supervisor.json").read_text())
    spec = engine.attempt_spec(attempt.attempt_id)
    cgroup = spec["instances"][0]["cgroup"] if spec is not None else None
    assert cgroup is not None
    cgroup_dir = Path(cgroup["procs_dir"])
    return attempt, int(sup["pid"]), cgroup_dir


def test_factory_builds_a_local_engine_from_settings(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, node_name="box", virtual_gpus=2, gpu_model="T4")
    engine = make_engine(settings)
    assert isinstance(engine, LocalEngine)
    (node,) = engine.nodes()
    assert node.name == "box" and node.cpus >= 1 and node.memory_mib > 100
    assert [g.model for g in node.gpus] == ["T4", "T4"]


def test_refuses_without_isolation_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "no-cgroups").mkdir()
    engine = LocalEngine(tmp_path / "home", "n", virtual_gpus=0, cgroup_root=tmp_path / "no-cgroups")
    caps = engine.capabilities()
    assert caps.refusing and not caps.cgroups
    assert any("cgroup" in p for p in caps.problems)
    (node,) = engine.nodes()
    assert node.state is NodeState.DOWN and "isolation unavailable" in node.message
    attempt = one(engine, "echo should-not-run")
    assert engine.launch(attempt) == "refused"
    status = engine.poll([attempt.attempt_id])[attempt.attempt_id]
    assert status.phase is AttemptPhase.FAILED and status.reason is FailureReason.LAUNCH_FAILED
    assert "allow_unisolated" in status.message
    assert engine.logs(attempt.attempt_id).data == b""


def test_allow_unisolated_runs_with_what_there_is(tmp_path: Path) -> None:
    require_binary("bwrap")
    (tmp_path / "no-cgroups").mkdir()
    engine = LocalEngine(
        tmp_path / "home", "n", virtual_gpus=0, cgroup_root=tmp_path / "no-cgroups", allow_unisolated=True
    )
    assert not engine.capabilities().refusing and engine.nodes()[0].state is NodeState.READY
    attempt = one(engine, "id -u")
    engine.launch(attempt)
    assert wait_finished(engine, attempt.attempt_id).phase is AttemptPhase.SUCCEEDED
    assert int(engine.logs(attempt.attempt_id).data) >= 1000  # still sandboxed as another uid
    engine.close()


def test_bad_attempt_id_is_named(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path, "n", virtual_gpus=0, isolation=False)
    bad = AttemptLaunch("../etc", "1", 1, "u", "g", ())
    with pytest.raises(ValueError, match=re.escape("invalid attempt_id '../etc'")):
        engine.launch(bad)


def test_wrong_node_and_unknown_environment_fail_the_launch(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path, "here", virtual_gpus=0, isolation=False)
    elsewhere = make_attempt(["there"], "true")
    engine.launch(elsewhere)
    status = engine.poll([elsewhere.attempt_id])[elsewhere.attempt_id]
    assert status.reason is FailureReason.LAUNCH_FAILED and "'there'" in status.message
    conda = one(engine, "true")
    conda = AttemptLaunch(conda.attempt_id, "1", 1, "u", "g", conda.instances, environment="conda-x")
    engine.launch(conda)
    assert "unknown environment 'conda-x'" in engine.poll([conda.attempt_id])[conda.attempt_id].message


def test_callers_env_is_kept_and_gpus_default_to_uuids(tmp_path: Path) -> None:
    with local_engine_factory(tmp_path / "home", isolation=False) as factory:
        engine = factory()
        given = one(
            engine,
            "echo $CUDA_VISIBLE_DEVICES $MASTER_ADDR",
            {"CUDA_VISIBLE_DEVICES": "X", "MASTER_ADDR": "h"},
        )
        default = one(engine, "echo $CUDA_VISIBLE_DEVICES", gpus=2)
        for a in (given, default):
            engine.launch(a)
            wait_finished(engine, a.attempt_id)
        assert engine.logs(given.attempt_id).data == b"X h\n"
        uuids = ",".join(g.uuid for g in engine.inventory.gpus[:2])
        assert engine.logs(default.attempt_id).data.decode().strip() == uuids


def test_server_environment_does_not_leak_into_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TOKEN", "server-secret")
    engine = LocalEngine(tmp_path, "n", virtual_gpus=0, isolation=False)
    attempt = one(engine, "env")
    engine.launch(attempt)
    wait_finished(engine, attempt.attempt_id)
    out = engine.logs(attempt.attempt_id).data
    assert b"RANK=0" in out and b"server-secret" not in out
    engine.close()


def test_dead_supervisor_means_lost_and_nothing_survives(tmp_path: Path) -> None:
    require_binary("bwrap")
    with local_engine_factory(tmp_path / "home") as factory:
        engine = factory()
        attempt, supervisor, cgroup_dir = started_in_sandbox(engine, "echo ready; sleep 60")
        os.kill(supervisor, signal.SIGKILL)
        time.sleep(0.2)
        status = engine.poll([attempt.attempt_id])[attempt.attempt_id]
        assert status.phase is AttemptPhase.LOST and status.reason is FailureReason.NODE_LOST
        assert not cgroup_dir.exists()


# An instance's child, forked by a supervisor that then dies before the child is in its cgroup:
# the engine empties the (still empty) cgroup and declares the attempt lost. The chaos soak
# killed the first supervisor it saw exactly there, and the child went on to run the whole job
# beside the retry. Here the child is told its supervisor was a process that has already ended,
# as a reparented orphan sees it, and must run nothing; told its real parent, it runs the command.
ORPHAN_CHILD = """
import os, sys, _signal
from corral.engine.local.supervisor import Instance
out = sys.argv[1]
spec = {"rank": 0, "cgroup": None, "sandboxed": False, "log": out + "/rank-0.log", "cwd": out,
        "env": {"PATH": "/usr/bin:/bin"}, "argv": ["/bin/sh", "-c", "echo ran; : > ran"]}
gone = os.fork()
if gone == 0:
    os._exit(0)
os.waitpid(gone, 0)
supervisor = gone if sys.argv[2] == "dead" else os.getpid()
mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, set())
child = os.fork()
if child == 0:
    Instance(spec)._exec_child(mask, supervisor, {})
print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


@pytest.mark.parametrize("supervisor", ["dead", "alive"])
def test_a_child_whose_supervisor_died_before_it_began_runs_nothing(tmp_path: Path, supervisor: str) -> None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", ORPHAN_CHILD, str(tmp_path), supervisor],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert done.returncode == 0, done.stderr
    if supervisor == "dead":
        assert int(done.stdout) == ORPHANED_EXIT
        assert not (tmp_path / "ran").exists() and not (tmp_path / "rank-0.log").exists()
    else:
        assert int(done.stdout) == 0
        assert (tmp_path / "ran").exists() and (tmp_path / "rank-0.log").read_text() == "ran\n"


# A supervisor whose clean-up after the job takes a while (cgroups, network, secrets): the engine
# reports the attempt running until status.json is written, so the reconcile loop may send a stop
# meanwhile. The attempt's end time must be when its processes ended, before that clean-up.
SLOW_CLEANUP = """
import marshal, os, sys, time
from corral.engine.local import supervisor
adir = sys.argv[1]
inst = {"rank": 0, "argv": ["/bin/sh", "-c", "exit 0"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": adir,
        "log": adir + "/rank-0.log", "work_dir": "", "cgroup": None, "sandboxed": False, "memory_mib": 128}
spec = {"attempt_id": "1.1", "max_runtime_s": None, "gang_grace_s": 1.0, "uid_lock": None, "uid": 0,
        "instances": [inst], "network": None}
with open(adir + "/spec.marshal", "wb") as f:
    f.write(marshal.dumps(spec))
remove_secrets = supervisor.secret_files.remove_secrets
def slow_cleanup(path):
    with open(adir + "/cleanup_began", "w") as f:
        f.write(repr(time.time()))
    time.sleep(0.3)
    remove_secrets(path)
supervisor.secret_files.remove_secrets = slow_cleanup
supervisor.Supervisor(adir).run()
"""


def test_an_attempts_end_time_is_when_its_processes_ended_not_after_the_clean_up(tmp_path: Path) -> None:
    """An exit 0 before Corral's stop settles the job SUCCEEDED (services.lifecycle, rule 1),
    judged by the engine's end time against the stop's time. The supervisor stamped the end when
    it wrote status.json, after its clean-up: a stop sent during the clean-up (the attempt still
    reported running) then read as answered by the exit, and a job that had finished was
    requeued by its preemption (run twice) or cancelled."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", SLOW_CLEANUP, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert done.returncode == 0, done.stderr
    status = json.loads((tmp_path / "status.json").read_text())
    cleanup_began = float((tmp_path / "cleanup_began").read_text())
    assert status["phase"] == "succeeded"
    assert status["started_at"] <= status["finished_at"] <= cleanup_began


def test_a_launcher_answer_lost_after_its_fork_still_runs_the_attempt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher forks the supervisor, then its answer is lost (the launcher killed before it
    answered, or slower than the engine's 2 s wait): the engine starts a supervisor directly, as
    for a launcher that is not there. Both ran the attempt, side by side, into one log; now the
    first to write supervisor.json runs it and the other does nothing, and the engine, whose own
    child ended at once, follows the one that runs: not LOST (with its cgroups killed) when asked
    before a poll has reaped that child (exec_command, stop)."""
    engine = LocalEngine(tmp_path / "home", "n", virtual_gpus=0, isolation=False, use_launcher=False)
    forked: list[int] = []

    def forked_but_never_answered(adir: Path) -> None:
        argv = [sys.executable, "-I", "-S", "-c", SUPERVISOR_BOOT, str(adir)]
        forked.append(spawn_detached(argv, adir / "supervisor.err"))
        deadline = time.monotonic() + 20
        while not (adir / "supervisor.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # the forked one has started: the engine's own start comes second
        return None

    monkeypatch.setattr(engine, "_via_launcher", forked_but_never_answered)
    ran = tmp_path / "ran"
    attempt = one(engine, f"echo once >> {ran}; sleep 1")
    direct = int(engine.launch(attempt))
    deadline = time.monotonic() + 20
    while (proc_start(direct) is not None or not ran.exists()) and time.monotonic() < deadline:
        time.sleep(0.01)  # the engine's own start found the attempt taken and ended (not reaped yet)
    engine.exec_command(attempt.attempt_id, 0, ["true"])  # running: not declared lost
    status = wait_finished(engine, attempt.attempt_id)
    os.waitpid(forked[0], 0)
    assert status.phase is AttemptPhase.SUCCEEDED, status
    assert ran.read_text() == "once\n"


def test_state_files_are_valid_json() -> None:
    text = to_json({"message": 'say "hi"\n\tback\\slash é', "n": [1, 2.5, None, True]})
    assert json.loads(text) == {"message": 'say "hi"\n\tback\\slash é', "n": [1, 2.5, None, True]}


def test_launcher_starts_supervisors_and_goes_away_with_close(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path, "n", virtual_gpus=0, isolation=False)
    first = one(engine, "echo direct")
    engine.launch(first)  # no launcher yet: a fresh interpreter, and the launcher is started
    deadline = time.monotonic() + 10
    while engine._launcher_pid() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    launcher = engine._launcher_pid()
    assert launcher is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(engine.launcher_sock))
        conn.sendall(str(tmp_path).encode())  # not an attempt dir of this engine
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(4096).startswith(b"error:")
    second = one(engine, "echo forked")
    ref = engine.launch(second)
    assert wait_finished(engine, second.attempt_id).phase is AttemptPhase.SUCCEEDED
    assert engine.logs(second.attempt_id).data == b"forked\n"
    assert int(ref) != launcher and int(ref) not in engine._children.values()  # forked by the launcher
    engine.close()
    assert proc_start(launcher) is None  # gone (close() waited for it)
    assert wait_finished(engine, first.attempt_id).phase is AttemptPhase.SUCCEEDED


def test_sigterm_to_a_supervisor_stops_its_job_and_cleans_up(tmp_path: Path) -> None:
    require_binary("bwrap")
    with local_engine_factory(tmp_path / "home") as factory:
        engine = factory()
        attempt, supervisor, cgroup_dir = started_in_sandbox(engine, "trap '' TERM; echo ready; sleep 60")
        started = time.monotonic()
        os.kill(supervisor, signal.SIGTERM)
        status = wait_finished(engine, attempt.attempt_id, timeout=10)
        assert time.monotonic() - started < 5, "a bare SIGTERM must not wait a full stop grace"
        assert status.reason is FailureReason.STOPPED
        assert not cgroup_dir.exists()


def test_isolation_can_be_switched_off_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_ISOLATION", "false")
    engine = LocalEngine.from_settings(Settings(home=tmp_path, node_name="n", virtual_gpus=0))
    assert not engine.capabilities().isolation_requested
    monkeypatch.setenv("CORRAL_ISOLATION", "maybe")
    with pytest.raises(ValueError, match=r"(?i)isolation"):  # ours, or pydantic once Settings has it
        LocalEngine.from_settings(Settings(home=tmp_path, node_name="n", virtual_gpus=0))


# A supervisor killed (SIGKILL, the OOM killer) at a chosen point: "cleanup" as its clean-up
# begins, every instance reaped; "running" as soon as it has reaped one instance while another
# still runs.
KILLED_SUPERVISOR = """
import os, signal, sys
from corral.engine.local import supervisor
Supervisor = supervisor.Supervisor
def killed(*args):
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[2] == "cleanup":
    Supervisor.finish = killed
else:
    reap = Supervisor.reap
    def reap_then_die(self):
        reap(self)
        if any(i.exit_code is not None for i in self.instances) and any(i.running for i in self.instances):
            killed()
    Supervisor.reap = reap_then_die
Supervisor(sys.argv[1]).run()
"""


@pytest.mark.parametrize(
    ("commands", "killed_in", "phase", "exit_code"),
    [
        (("exit 0",), "cleanup", AttemptPhase.SUCCEEDED, 0),
        (("exit 0", "exit 3"), "cleanup", AttemptPhase.FAILED, 3),
        (("exit 0", "sleep 30"), "running", AttemptPhase.LOST, None),
    ],
)
def test_a_supervisor_killed_in_its_clean_up_leaves_the_attempts_real_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    commands: tuple[str, ...],
    killed_in: str,
    phase: AttemptPhase,
    exit_code: int | None,
) -> None:
    """Every instance had ended (exit 0, or a failure) and the supervisor was killed while it
    cleaned up, before status.json: the engine declared the attempt LOST and the server requeued
    the job, so finished work ran again. The supervisor now records the end (ended.json) before
    its clean-up, and the engine publishes it; an attempt whose instances' ends are not all known
    stays LOST."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    engine = LocalEngine(tmp_path / "home", "n", virtual_gpus=0, isolation=False, use_launcher=False)
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn_killed_supervisor(attempt_id: str, adir: Path) -> int:
        argv = [sys.executable, "-c", KILLED_SUPERVISOR, str(adir), killed_in]
        spawned.append(subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": src}, cwd=adir))
        return spawned[-1].pid

    monkeypatch.setattr(engine, "_spawn_supervisor", spawn_killed_supervisor)
    attempt = make_attempt(["n"], *commands)
    engine.launch(attempt)
    assert spawned[0].wait(timeout=20) == -signal.SIGKILL  # killed where the test said
    try:
        status = engine.poll([attempt.attempt_id])[attempt.attempt_id]
    finally:  # an instance still running (no cgroup to kill it by): its process group
        state = json.loads((engine.attempts_dir / attempt.attempt_id / "state.json").read_text())
        for pid in state["pids"].values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert (status.phase, status.exit_code) == (phase, exit_code), status
    if phase is AttemptPhase.LOST:
        assert status.reason is FailureReason.NODE_LOST
    else:
        assert status.finished_at is not None and status.started_at is not None
        assert status.started_at <= status.finished_at <= time.time()
    again = LocalEngine(tmp_path / "home", "n", virtual_gpus=0, isolation=False, use_launcher=False)
    assert again.poll([attempt.attempt_id])[attempt.attempt_id].phase is phase  # the verdict stays


def test_a_sigkilled_supervisor_of_a_plain_job_leaves_none_of_its_processes(tmp_path: Path) -> None:
    """No sandbox and no cgroups (isolation off): the engine found the supervisor dead and
    declared the attempt lost, but killed only what cgroups held, so the job's shell and its
    children ran on, beside the retry. The engine now kills each instance's process group (it
    did setsid(): group id = its pid, checked against the pid's start time in state.json)."""
    engine = LocalEngine(tmp_path / "home", "n", virtual_gpus=0, isolation=False, use_launcher=False)
    attempt = one(engine, "sleep 60 & echo ready; wait")
    engine.launch(attempt)
    wait_log(engine, attempt.attempt_id, b"ready")
    adir = engine.attempts_dir / attempt.attempt_id
    shell = json.loads((adir / "state.json").read_text())["pids"]["0"]
    job = [shell, *descendants(shell)]
    assert len(job) == 2, job  # the shell and its sleep
    os.kill(json.loads((adir / "supervisor.json").read_text())["pid"], signal.SIGKILL)
    try:
        assert wait_finished(engine, attempt.attempt_id, timeout=10).phase is AttemptPhase.LOST
        deadline = time.monotonic() + 3
        while any(proc_start(p) is not None for p in job) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [p for p in job if proc_start(p) is not None] == [], "the job's processes outlived it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell, signal.SIGKILL)
