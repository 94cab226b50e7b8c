"""Slurm jobs run as their users' own Unix accounts, inside bubblewrap, on the GPUs Slurm chose.

Real Slurm (the session's harness cluster: task/cgroup with ConstrainDevices=yes), real test
accounts (made with useradd by the harness), real bubblewrap on the emulated nodes.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase, AttemptStatus, ExecRefused, FailureReason, MountSpec
from corral.engine.slurm import SlurmEngine, mapping
from corral.engine.slurm import engine as slurm_engine_module
from corral.engine.slurm.cli import CliResult
from corral.engine.slurm.engine import REJECTED_REF
from corral.engine.slurm.state import AttemptRecord
from corral.engine.slurm.users import UnmappedUser, UserMap
from tests.slurm.conftest import cleanup_cluster
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, server_env, slurm, slurm_engine, wait_for

pytestmark = pytest.mark.slurm


def uid_of(corral_user: str) -> int:
    return pwd.getpwnam(TEST_ACCOUNTS[corral_user]).pw_uid


def log_of(engine: SlurmEngine, attempt_id: str, rank: int = 0) -> str:
    return engine.logs(attempt_id, rank).data.decode(errors="replace")


def wait_log(engine: SlurmEngine, attempt_id: str, text: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in (out := log_of(engine, attempt_id)):
        assert time.monotonic() < deadline, f"{attempt_id} never printed {text!r}: {out!r}"
        time.sleep(0.1)
    return out


def test_two_users_run_as_their_own_uids_and_cannot_read_each_others_files(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    alice = attempt("501.1", instance("node1", "id -u; echo topsecret > /job/secret; echo ready; sleep 30"))
    engine.launch(alice)
    assert wait_log(engine, "501.1", "ready").split()[0] == str(uid_of("alice"))
    alice_work = engine.store.job_dir("501.1") / "work" / "0"
    assert (alice_work / "secret").read_text() == "topsecret\n"
    thief = (
        f"id -u; cat {alice_work}/secret; cat {engine.store.attempts}/*/job/work/*/secret; "
        f"ls {engine.store.root}; cat /job/../*/secret; echo done"
    )
    bob = attempt("502.1", instance("node1", thief), user="bob")
    engine.launch(bob)
    assert wait_for(engine, "502.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    out = log_of(engine, "502.1")
    assert out.split()[0] == str(uid_of("bob")) != str(uid_of("alice")), out
    assert "topsecret" not in out and "done" in out, out
    # Slurm itself ran the two jobs as the two accounts
    users = subprocess.run(
        ["squeue", "-h", "--states=all", "-n", "corral-501.1,corral-502.1", "-o", "%j %u"],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=15,
    ).stdout.split()
    assert sorted(zip(users[::2], users[1::2], strict=True)) == [
        ("corral-501.1", TEST_ACCOUNTS["alice"]),
        ("corral-502.1", TEST_ACCOUNTS["bob"]),
    ]
    # The file system says no as well, sandbox or not (shared storage seen from a login shell):
    # alice's job dir is hers, mode 0700, and bob's account cannot open her file.
    st = engine.store.job_dir("501.1").stat()
    assert st.st_uid == uid_of("alice") and st.st_mode & 0o077 == 0
    bob_uid = uid_of("bob")
    as_bob = subprocess.run(
        [
            "setpriv",
            f"--reuid={bob_uid}",
            f"--regid={bob_uid}",
            "--clear-groups",
            "cat",
            f"{alice_work}/secret",
        ],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert as_bob.returncode != 0 and "Permission denied" in as_bob.stderr
    engine.stop("501.1", 0)
    assert wait_for(engine, "501.1", FINISHED).reason is FailureReason.STOPPED


def test_a_job_cannot_read_server_secrets(
    engine: SlurmEngine, slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a careless home (world-readable files) is out of reach: the sandbox does not contain
    it, and the job's environment is not the server's."""
    home = slurm_cluster.base / "corral" / "careless-home"
    home.mkdir(mode=0o755)
    (home / "config.yaml").write_text("url: http://127.0.0.1:8080\ntoken: crl_admintoken_7d1e\n")
    (home / "corral.db").write_text("SQLite format 3 token-hash-9a8b")
    for f in home.iterdir():
        f.chmod(0o644)
    monkeypatch.setenv("CORRAL_DATABASE_URL", "postgresql://corral:db-pass-3c4d@127.0.0.1/corral")
    monkeypatch.setenv("PGPASSWORD", "db-pass-3c4d")
    reader = (
        f"cat {home}/config.yaml {home}/corral.db; ls {home}; "
        f"cat {engine.store.root}/attempts/*/attempt.json; env; echo finished"
    )
    engine.launch(attempt("503.1", instance("node2", reader)))
    assert wait_for(engine, "503.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    out = log_of(engine, "503.1")
    assert "finished" in out and "SLURM_JOB_ID=" in out, out  # it ran, and printed its env
    for secret in ("crl_admintoken_7d1e", "token-hash-9a8b", "db-pass-3c4d", "slurm_job_id"):
        assert secret not in out, (secret, out)


def test_unmapped_user_is_refused_and_nothing_runs(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    engine = slurm_engine(slurm_cluster)
    status = _refused(engine, "504.1", "mallory")
    assert "'mallory'" in status.message and "CORRAL_SLURM_USER_MAP" in status.message
    assert str(slurm_cluster.user_map) in status.message

    unset = slurm_engine(slurm_cluster, user_map=UserMap(None))
    assert "CORRAL_SLURM_USER_MAP is not set" in _refused(unset, "505.1", "alice").message

    root_map = tmp_path / "map.yaml"
    root_map.write_text("alice: root\nbob: no-such-account-xyz\n")
    to_root = slurm_engine(slurm_cluster, user_map=UserMap(str(root_map)))
    assert "uid 0" in _refused(to_root, "506.1", "alice").message  # never as root or a daemon
    assert "does not exist" in _refused(to_root, "507.1", "bob").message
    names = subprocess.run(
        ["squeue", "-h", "--states=all", "-o", "%j"], env=slurm_cluster.env, capture_output=True, text=True
    ).stdout.split()
    assert not {"corral-504.1", "corral-505.1", "corral-506.1", "corral-507.1"} & set(names)

    root_map.write_text("alice: [not, a, name]\n")
    with pytest.raises(UnmappedUser, match="corral_user: unix_account"):
        UserMap(str(root_map))


def _refused(engine: SlurmEngine, attempt_id: str, user: str) -> AttemptStatus:
    assert engine.launch(attempt(attempt_id, instance("node1", "echo ran"), user=user)) == REJECTED_REF
    status = engine.poll([attempt_id])[attempt_id]
    assert (status.phase, status.reason) == (AttemptPhase.FAILED, FailureReason.LAUNCH_FAILED), status
    assert not engine.store.job_dir(attempt_id).exists()  # nothing written for the job to run
    return status


def slurm_gpu_indices(cluster: SlurmCluster, job_id: str) -> dict[str, list[int]]:
    """{node: GPU indices} Slurm allocated to a running job (`scontrol show job -d`)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-d", job_id], env=cluster.env, capture_output=True, text=True, timeout=15
    ).stdout
    found: dict[str, list[int]] = {}
    for node, idx in re.findall(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=\S*\(IDX:([\d,-]+)\)", out):
        indices: list[int] = []
        for part in idx.split(","):
            lo, _, hi = part.partition("-")
            indices += range(int(lo), int(hi or lo) + 1)
        found[node] = indices
    return found


OPEN_PROBE = (
    "import os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n        os.open(p, os.O_RDWR); print(p, 'opened')\n"
    "    except OSError as e:\n        print(p, e.strerror)\n"
)
OPEN_GPUS = (
    'python3 -c "import os, glob\n'
    "for p in sorted(glob.glob('/dev/nvidia*') + glob.glob('/hostgpus/nvidia*')):\n"
    "    try:\n        os.open(p, os.O_RDWR); print(p, 'opened')\n"
    '    except OSError as e:\n        print(p, e.strerror)"; '
    'echo "cvd=$CUDA_VISIBLE_DEVICES slurm=$CORRAL_SLURM_GPUS"; echo checked; sleep 3'
)


def test_gpus_are_the_ones_slurm_allocated_and_only_those_open(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    # bob holds one of node3's GPUs, so Slurm cannot hand alice the indices Corral asked for
    engine.launch(attempt("508.1", instance("node3", "echo holding; sleep 30", gpus=[0]), user="bob"))
    wait_log(engine, "508.1", "holding")
    fake_gpus = str(slurm_cluster.base / "fakegpu")  # every GPU of the node, mounted read-only
    mounts = [MountSpec(fake_gpus, "/hostgpus")]
    ref = engine.launch(attempt("509.1", instance("node3", OPEN_GPUS, gpus=[0, 1]), mounts=mounts))
    out = wait_log(engine, "509.1", "checked")
    allocated = slurm_gpu_indices(slurm_cluster, ref)["node3"]
    held = slurm_gpu_indices(slurm_cluster, engine.poll(["508.1"])["508.1"].engine_ref)["node3"]
    assert len(allocated) == 2 and not set(allocated) & set(held), (allocated, held)
    assert f"cvd=0,1 slurm={','.join(map(str, allocated))}" in out, out
    opened = dict(re.findall(r"^(/\S+) (.+)$", out, re.M))
    # inside the sandbox only the allocated devices exist, and the devices cgroup lets the job
    # open them (a driver-less stand-in answers ENXIO where a denied one gives EPERM) ...
    in_dev = {p: v for p, v in opened.items() if p.startswith("/dev/")}
    assert in_dev == {f"/dev/nvidia{i}": "No such device or address" for i in allocated}, out
    # ... a mount cannot bring other device files in (mounts in the job's namespace are nodev) ...
    assert all(v == "Permission denied" for p, v in opened.items() if p.startswith("/hostgpus/")), out
    # ... and Slurm's devices cgroup (ConstrainDevices) lets a process of the job's step open
    # exactly these GPUs: a probe joined to it from outside sees EPERM for the others
    step = Path(f"/sys/fs/cgroup/devices/slurm_node3/uid_{uid_of('alice')}/job_{ref}/step_batch")
    probe = subprocess.run(
        ["python3", "-c", OPEN_PROBE, *(f"{fake_gpus}/nvidia{i}" for i in range(4))],
        preexec_fn=lambda: (step / "cgroup.procs").write_text(str(os.getpid())),
        capture_output=True,
        text=True,
        timeout=15,
    ).stdout
    verdicts = dict(re.findall(r"nvidia(\d) (.+)$", probe, re.M))
    assert verdicts == {
        str(i): "No such device or address" if i in allocated else "Operation not permitted" for i in range(4)
    }, probe
    engine.stop("508.1", 0)
    assert wait_for(engine, "509.1", FINISHED).phase is AttemptPhase.SUCCEEDED


def test_server_never_follows_what_the_user_puts_in_its_job_dir(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """A user with a login on the cluster owns their job dirs on the shared storage. Swapping a log
    for a symlink to a root-only file, or an exit file for a FIFO, must neither hand that file to
    `corral logs` nor block the server's poll."""
    engine.launch(attempt("510.1", instance("node1", "echo hello")))
    assert wait_for(engine, "510.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    assert engine.logs("510.1").data == b"hello\n"
    secret = slurm_cluster.base / "corral" / "root-only-secret"
    secret.write_text("crl_admintoken_0f0f\n")
    secret.chmod(0o600)
    job_dir = engine.store.job_dir("510.1")
    alice = uid_of("alice")
    as_alice = ["setpriv", f"--reuid={alice}", f"--regid={alice}", "--clear-groups", "sh", "-c"]
    swap = f"cd {job_dir} && rm rank-0.log rank-0.exit && ln -s {secret} rank-0.log && mkfifo rank-0.exit"
    subprocess.run([*as_alice, swap], check=True, timeout=10)
    assert engine.logs("510.1").data == b""
    assert engine.store.rank_exits("510.1", 1, alice) == {}  # the FIFO is skipped, not waited on
    assert engine.store.first_failure_time("510.1", 1, alice) is None


def test_exec_never_follows_nor_waits_on_the_rank_script_the_user_swaps(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """`corral exec` finds a rank's node in its rank script, in the user's job dir. Swapped for a
    FIFO, the root server's read blocked a worker thread (holding a database connection) for
    good, and a few dozen such calls stalled the API; swapped for a symlink to a root-only file,
    root read it and its text became srun's --nodelist (review104, finding 5). Both are refused
    at once now, and nothing of the file is shown."""
    engine.launch(attempt("512.1", instance("node1", "echo ready; exec sleep 60")))
    wait_log(engine, "512.1", "ready")
    cmd = engine.exec_command("512.1", 0, ["true"])  # the control: the script is the server's
    assert "--nodelist=node1" in cmd.argv, cmd.argv
    secret = slurm_cluster.base / "corral" / "root-only-rank"
    secret.write_text("first\nroot-only-data on LEAKED-VALUE\n")
    secret.chmod(0o600)
    script = engine.store.job_dir("512.1") / "rank-0.sh"
    alice = uid_of("alice")
    as_alice = ["setpriv", f"--reuid={alice}", f"--regid={alice}", "--clear-groups", "sh", "-c"]
    for swap in (f"rm {script} && mkfifo {script}", f"rm {script} && ln -s {secret} {script}"):
        subprocess.run([*as_alice, swap], check=True, timeout=10)
        answer: list[BaseException | object] = []

        def enter(into: list[BaseException | object]) -> None:
            try:
                into.append(engine.exec_command("512.1", 0, ["true"]))
            except BaseException as exc:  # the answer, whatever it is, for the assertions below
                into.append(exc)

        started = time.monotonic()
        thread = threading.Thread(target=enter, args=(answer,), daemon=True)
        thread.start()
        thread.join(10)
        try:
            assert not thread.is_alive(), f"exec_command blocked on the swapped script ({swap})"
        finally:
            if script.is_fifo() and thread.is_alive():  # let a blocked read go: no thread stays
                os.close(os.open(script, os.O_WRONLY | os.O_NONBLOCK))
        assert time.monotonic() - started < 5
        assert len(answer) == 1 and isinstance(answer[0], ExecRefused), answer
        assert "rank 0: its script in the job dir is not a plain file of the job's" in str(answer[0])
        assert "LEAKED" not in str(answer[0]) and "root-only" not in str(answer[0])
    engine.stop("512.1", 0)
    wait_for(engine, "512.1", FINISHED)


def test_relaunch_does_not_write_through_links_the_user_planted(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """A launch whose sbatch answer was lost is submitted again into the same attempt dir. The
    old job dir is the user's: an `etc` symlinked to a root-owned dir must not make root write
    a passwd there."""
    from corral.engine.slurm.state import AttemptRecord

    victim = slurm_cluster.base / "corral" / "victim-etc"
    victim.mkdir()
    job_dir = engine.store.job_dir("511.1")
    job_dir.mkdir(parents=True)
    (job_dir / "etc").symlink_to(victim)
    os.lchown(job_dir / "etc", uid_of("alice"), uid_of("alice"))
    os.chown(job_dir, uid_of("alice"), uid_of("alice"))
    engine.store.save(AttemptRecord("511.1", submitted_at=time.time()))  # submitted, answer lost
    engine.launch(attempt("511.1", instance("node1", "echo relaunched")))
    assert wait_for(engine, "511.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    assert engine.logs("511.1").data == b"relaunched\n"
    assert list(victim.iterdir()) == []
    assert not (job_dir / "etc").is_symlink() and (job_dir / "etc" / "passwd").is_file()


def test_an_attempt_whose_status_cannot_be_read_does_not_stop_the_poll_of_the_others(
    engine: SlurmEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What is read for a status comes from job dirs their accounts write: one attempt's error is
    logged and that attempt left out (it keeps its state, polled again next tick), the others are
    answered (before, the exception ended the whole poll, so no job's start or end was recorded).
    Its traceback is logged once, not at every tick, and `corral exec` into it is refused."""
    engine.launch(attempt("511.1", instance("node1", "sleep 30")))
    engine.launch(attempt("512.1", instance("node1", "sleep 30")))
    for aid in ("511.1", "512.1"):
        wait_for(engine, aid, {AttemptPhase.RUNNING})
    read = engine._status

    def failing(record: object, jobs: object) -> AttemptStatus:
        if getattr(record, "attempt_id", None) == "511.1":
            raise IndexError("list index out of range")
        return read(record, jobs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_status", failing)
    statuses = engine.poll(["511.1", "512.1"])
    assert "511.1" not in statuses
    assert statuses["512.1"].phase is AttemptPhase.RUNNING
    assert "511.1" not in engine.poll(["511.1", "512.1"])
    logged = [r for r in caplog.records if "511.1: its status could not be read" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None, logged
    with pytest.raises(ExecRefused, match="status cannot be read"):
        engine.exec_command("511.1", 0, ["true"])
    monkeypatch.undo()
    for aid in ("511.1", "512.1"):
        engine.stop(aid, 0)
        assert wait_for(engine, aid, FINISHED).phase is not AttemptPhase.RUNNING


UNREADABLE_GRACE_S = 2.0


def slurm_state_of(cluster: SlurmCluster, slurm_id: str) -> str:
    """The Slurm job's state as squeue tells it ("" once Slurm no longer lists it)."""
    return slurm(cluster, "squeue", "-h", "--states=all", f"--jobs={slurm_id}", "-o", "%T").strip()


def test_an_attempt_whose_status_stays_unreadable_fails_and_its_slurm_job_is_cancelled(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """review: an attempt whose status could not be read (Corral's own fault: the job dir's reads
    skip what the job's account can spoil; here the state dir out of space) kept its state until
    it could be or its job was cancelled: it held its GPUs and its Slurm job for ever. With
    CORRAL_SLURM_UNREADABLE_GRACE_S (here 2 s) it fails once unreadable that long while Slurm says
    its job ended (522: exited at once), or twice that while Slurm still runs it (521: `sleep`,
    then cancelled in Slurm; its secrets dir not removable either), as status_unreadable with the
    error; a readable attempt beside them (523) runs on, untouched. 521's end is first not
    recorded (the state dir again) after its kill: the record says Corral stopped it, as
    status_unreadable, the next poll sends no scancel again, and that failure is logged on its
    own, not held back by the read error's log."""
    from corral.config import Settings
    from corral.engine.factory import make_engine

    for name, value in server_env(slurm_cluster, slurm_cluster.new_state_dir()).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CORRAL_SLURM_UNREADABLE_GRACE_S", str(UNREADABLE_GRACE_S))
    engine = make_engine(Settings(engine="slurm", home=tmp_path / "home"))
    assert isinstance(engine, SlurmEngine)
    read = engine._status

    def unreadable(record: object, jobs: object) -> AttemptStatus:
        if getattr(record, "attempt_id", None) in ("521.1", "522.1"):
            raise OSError(28, "No space left on device", "attempt.json")
        return read(record, jobs)  # type: ignore[arg-type]

    record_end = engine._record_end
    not_recorded: list[str] = []

    def unrecorded_once(record: AttemptRecord, status: AttemptStatus) -> AttemptStatus:
        if record.attempt_id == "521.1" and not not_recorded:  # after its kill
            not_recorded.append(record.attempt_id)
            assert record.stop is not None and (record.stop.kind, record.stop.killed) == (
                "status_unreadable",
                True,
            ), record.stop
            raise OSError(28, "No space left on device", "attempt.json")
        return record_end(record, status)

    run = engine.cli.run
    scancels: list[tuple[str, ...]] = []

    def counted(tool: str, *args: str, env: Mapping[str, str] | None = None) -> CliResult:
        if tool == "scancel":
            scancels.append(args)
        return run(tool, *args, env=env)

    remove_secrets = slurm_engine_module.remove_secrets

    def unremovable(root: str) -> None:  # 521's job dir is no more readable to its secrets' removal
        if "/521.1/" in root:
            raise PermissionError(13, "Permission denied", root)
        remove_secrets(root)

    try:
        monkeypatch.setattr(engine, "_status", unreadable)
        monkeypatch.setattr(engine, "_record_end", unrecorded_once)
        monkeypatch.setattr(engine.cli, "run", counted)
        monkeypatch.setattr(slurm_engine_module, "remove_secrets", unremovable)
        for aid, command in (("521.1", "sleep 60"), ("522.1", "true"), ("523.1", "sleep 60")):
            engine.launch(attempt(aid, instance("node1", command)))
        assert wait_for(engine, "523.1", {AttemptPhase.RUNNING}).phase is AttemptPhase.RUNNING
        slurm_ids = {aid: engine.store.load(aid).slurm_job_id for aid in ("521.1", "522.1")}  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        live = mapping.PENDING_STATES | mapping.RUNNING_STATES
        while (
            slurm_state_of(slurm_cluster, slurm_ids["521.1"]) != "RUNNING"
            or slurm_state_of(slurm_cluster, slurm_ids["522.1"]) in live
        ):
            assert time.monotonic() < deadline, "521 never ran or 522 never ended in Slurm"
            time.sleep(0.1)

        first = time.monotonic()  # the engine's clock for both starts at or after this poll
        ended: dict[str, AttemptStatus] = {}
        while len(ended) < 2:
            out = engine.poll(["521.1", "522.1", "523.1"])
            polled = time.monotonic() - first  # at least how long the engine has seen them unreadable
            assert out["523.1"].phase is AttemptPhase.RUNNING, out
            if "522.1" in out:
                assert polled >= UNREADABLE_GRACE_S, (polled, out)
            if "521.1" in out:  # Slurm runs it: twice the grace
                assert polled >= 2 * UNREADABLE_GRACE_S, (polled, out)
            ended.update({aid: out[aid] for aid in ("521.1", "522.1") if aid in out})
            assert polled < 30, f"not failed after 30 s: {out}"
            time.sleep(0.2)

        for aid, still in (("521.1", "still ran: cancelled"), ("522.1", "no longer runs")):
            status = ended[aid]
            assert status.phase is AttemptPhase.FAILED, status
            assert status.reason is FailureReason.STATUS_UNREADABLE, status
            assert status.message.startswith("Corral could not read how its instances ended for "), (
                status.message
            )
            assert f"Slurm job {slurm_ids[aid]} {still}" in status.message, status.message
            assert "OSError: [Errno 28] No space left on device: 'attempt.json'" in status.message
            assert status.message.endswith("(the traceback is in the server's log)"), status.message
            assert engine.poll([aid])[aid] == status  # its end is kept: not read again
        deadline = time.monotonic() + 20
        while slurm_state_of(slurm_cluster, slurm_ids["521.1"]) not in ("", "CANCELLED"):
            assert time.monotonic() < deadline, slurm_state_of(slurm_cluster, slurm_ids["521.1"])
            time.sleep(0.2)
        logged = [r for r in caplog.records if "its status could not be read" in r.getMessage()]
        assert sorted(r.getMessage().split(":")[0] for r in logged) == [
            "Slurm attempt 521.1",
            "Slurm attempt 522.1",
        ], logged  # once each, not at every poll
        assert not_recorded == ["521.1"]
        unrecorded = [r for r in caplog.records if "could not be recorded" in r.getMessage()]
        assert [r.getMessage().split(":")[0] for r in unrecorded] == ["Slurm attempt 521.1"], unrecorded
        assert engine.store.load("521.1").stop.kind == "status_unreadable"  # type: ignore[union-attr]
        job_521 = slurm_ids["521.1"]
        assert [a for a in scancels if job_521 in a] == [("--signal=KILL", "--full", job_521), (job_521,)]
        assert engine.poll(["523.1"])["523.1"].phase is AttemptPhase.RUNNING
        engine.stop("523.1", 0)
        assert wait_for(engine, "523.1", FINISHED).phase is not AttemptPhase.RUNNING
    finally:
        engine.close()
        cleanup_cluster(slurm_cluster)
