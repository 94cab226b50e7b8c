"""LocalEngine.exec_command: a process started through it runs inside the instance's sandbox
(uid, cgroup, GPUs, network namespace, mounts), and unknown or finished attempts are refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral.engine.base import AttemptLaunch, ExecRefused, InstanceLaunch
from corral.engine.local import LocalEngine
from tests.engine.contract import new_attempt_id, wait_finished, wait_log
from tests.engine.local_support import local_engine_factory
from tests.support import require


def _running(engine: LocalEngine, command: str, gpus: int = 2) -> AttemptLaunch:
    aid = new_attempt_id()
    inst = InstanceLaunch("w", 0, 0, engine.node_name, engine.inventory.gpus[:gpus], 1.0, 256, command, {})
    attempt = AttemptLaunch(aid, aid.split(".")[0], 1, "bob", "team", (inst,))
    engine.launch(attempt)
    wait_log(engine, aid, b"ready")
    return attempt


def _run(engine: LocalEngine, attempt_id: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = engine.exec_command(attempt_id, 0, argv)
    return subprocess.run(
        cmd.argv, env=dict(cmd.env), cwd=cmd.cwd, capture_output=True, text=True, timeout=20
    )


def test_exec_runs_inside_the_sandbox(tmp_path: Path) -> None:
    with local_engine_factory(tmp_path) as factory:
        engine = factory()
        require(engine.capabilities().sandbox and engine.capabilities().cgroups, "sandbox and cgroups")
        # The job listens on its own loopback: only a process in its network namespace reaches it.
        job = "echo marker > /tmp/mine; echo ready; exec sleep 60"
        attempt = _running(engine, job)
        spec = engine.attempt_spec(attempt.attempt_id)
        assert spec is not None
        job_cgroup = spec["instances"][0]["cgroup"]
        assert job_cgroup is not None
        script = 'id -u; cat /proc/self/cgroup; echo "gpus=$CUDA_VISIBLE_DEVICES"; cat /tmp/mine; ls /dev'
        out = _run(engine, attempt.attempt_id, ["/bin/sh", "-c", script])
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == str(spec["uid"]) and spec["uid"] != 0
        leaf = job_cgroup["procs_dir"].split("/sys/fs/cgroup/", 1)[1].split("/", 1)[1]
        assert any(line.endswith("/" + leaf) for line in lines if ":memory:" in line), out.stdout
        uuids = ",".join(g.uuid for g in engine.inventory.gpus[:2])
        assert f"gpus={uuids}" in lines
        assert "marker" in lines  # the sandbox's own /tmp (a tmpfs no host process sees)
        # The job's own network namespace: a different one from the server's.
        host_net = Path("/proc/self/ns/net").readlink()
        inside = _run(engine, attempt.attempt_id, ["/usr/bin/readlink", "/proc/self/ns/net"])
        assert inside.returncode == 0, inside.stderr
        if engine.capabilities().network == "isolated":
            assert inside.stdout.strip() != str(host_net)
        code = _run(engine, attempt.attempt_id, ["/bin/sh", "-c", "exit 7"])
        assert code.returncode == 7
        # A process started inside ends with the attempt (it is in the job's cgroup and pid namespace).
        cmd = engine.exec_command(attempt.attempt_id, 0, ["sleep", "300"])
        lingering = subprocess.Popen(cmd.argv, env=dict(cmd.env), cwd=cmd.cwd)
        engine.stop(attempt.attempt_id, 0)
        wait_finished(engine, attempt.attempt_id)
        assert lingering.wait(timeout=20) != 0
        with pytest.raises(ExecRefused, match="not running"):
            engine.exec_command(attempt.attempt_id, 0, ["true"])


def test_exec_refuses_unknown_attempt_and_rank(tmp_path: Path) -> None:
    with local_engine_factory(tmp_path) as factory:
        engine = factory()
        with pytest.raises(ExecRefused, match="not running"):
            engine.exec_command("999.1", 0, ["true"])
        require(engine.capabilities().sandbox, "sandbox")
        attempt = _running(engine, "echo ready; exec sleep 60", gpus=0)
        with pytest.raises(ExecRefused, match="no rank 3"):
            engine.exec_command(attempt.attempt_id, 3, ["true"])
        with pytest.raises(ExecRefused, match="no command"):
            engine.exec_command(attempt.attempt_id, 0, [])
        engine.stop(attempt.attempt_id, 0)


def test_the_jobs_environment_reaches_no_root_program_on_the_way_into_its_sandbox(tmp_path: Path) -> None:
    """bwrap and setpriv at the start, sh/nsenter/setpriv at `corral exec`, run as root on the
    host. The dynamic loader honours LD_DEBUG_OUTPUT (like LD_PRELOAD) in any program that is not
    setuid: had the job's environment reached one of them, it would have written its debug log
    into `leak_dir` on the host, as root. Inside the sandbox that dir does not exist, so the job's
    own processes (which must see every variable, values intact) write nothing there."""
    leak_dir = tmp_path / "leak"
    leak_dir.mkdir()
    env = {
        "LD_DEBUG": "files",
        "LD_DEBUG_OUTPUT": str(leak_dir / "ld"),
        "LANG": str(leak_dir / "locale"),
        "ODD": "a b'c\"$HOME`x`\\\n ok",
        "CORRAL_JOB_ENV_ODD": "its own",  # named like a stashed variable: kept apart
    }
    with local_engine_factory(tmp_path) as factory:
        engine = factory()
        require(engine.capabilities().sandbox, "sandbox")
        aid = new_attempt_id()
        job = "/usr/bin/env -0 > /job/env.start; echo ready; exec sleep 60"
        inst = InstanceLaunch("w", 0, 0, engine.node_name, (), 1.0, 256, job, env)
        engine.launch(AttemptLaunch(aid, aid.split(".")[0], 1, "bob", "team", (inst,)))
        wait_log(engine, aid, b"ready")
        entered = _run(engine, aid, ["/bin/sh", "-c", "/usr/bin/env -0 > /job/env.exec"])
        assert entered.returncode == 0, entered.stderr
        spec = engine.attempt_spec(aid)
        assert spec is not None
        work_dir = Path(spec["instances"][0]["work_dir"])
        for dump in ("env.start", "env.exec"):
            items = (work_dir / dump).read_text().split("\0")
            seen = dict(item.split("=", 1) for item in items if item)
            assert {k: seen.get(k) for k in env} == env, dump
            assert [k for k in seen if k.startswith("CORRAL_JOB_ENV_")] == ["CORRAL_JOB_ENV_ODD"], dump
        assert sorted(p.name for p in leak_dir.iterdir()) == [], "a root program read the job's env"
        engine.stop(aid, 0)
        wait_finished(engine, aid)


def _log_and_env_entered(
    engine: LocalEngine, job: str, env: dict[str, str]
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """Run `job` (which says "ready") with `env` until ready: its log's lines so far and what
    `corral exec env` into it printed; then stop it."""
    aid = new_attempt_id()
    inst = InstanceLaunch("w", 0, 0, engine.node_name, (), 1.0, 256, job, env)
    engine.launch(AttemptLaunch(aid, aid.split(".")[0], 1, "bob", "team", (inst,)))
    wait_log(engine, aid, b"ready")
    log = engine.logs(aid).data.decode().splitlines()
    entered = _run(engine, aid, ["/usr/bin/env"])
    engine.stop(aid, 0)
    wait_finished(engine, aid)
    return log, entered


def test_a_stored_jobs_shell_owned_variables_are_not_set_and_its_log_says_so(tmp_path: Path) -> None:
    """rough14 #4: a job stored before specs were refused a shell's own names (UID, SECONDS, ...)
    ran with them where /bin/sh is dash and stopped before its command where it is bash. It runs
    without them on any node now (root_env.RESTORE_SCRIPT), its log naming each, at its start
    and at `corral exec`; its other variables as they were."""
    env = {"UID": "7", "SECONDS": "5", "TRIAL": "t"}
    with local_engine_factory(tmp_path) as factory:
        engine = factory()
        require(engine.capabilities().sandbox, "sandbox")
        job = 'echo "uid=${UID-unset} seconds=${SECONDS-unset} trial=$TRIAL"; echo ready; exec sleep 60'
        log, entered = _log_and_env_entered(engine, job, env)
    notes = [line for line in log if line.startswith("corral: ")]
    assert [line.split(" is not set from the job's spec: ")[0] for line in notes] == [
        "corral: UID",
        "corral: SECONDS",
    ]
    assert all("it is a shell's own variable, which bash keeps" in line for line in notes), notes
    (job_line,) = [line for line in log if "trial=" in line]
    assert job_line == "uid=unset seconds=unset trial=t" or (  # dash sets neither; bash its own
        Path("/bin/sh").resolve().name == "bash" and "uid=7 " not in job_line and job_line.endswith("trial=t")
    )
    assert entered.returncode == 0 and "TRIAL=t" in entered.stdout.splitlines(), entered.stderr
    assert "UID=7" not in entered.stdout.splitlines() and "corral: UID is not set" in entered.stderr


def test_without_a_sandbox_a_stored_jobs_shell_owned_variables_are_not_set_and_its_log_says_so(
    tmp_path: Path,
) -> None:
    """review112 #10: the restore that leaves a shell's own names unset, with a line in the log,
    ran only in a sandbox; with isolation off (or no bubblewrap) the job's /bin/sh got UID,
    SHELLOPTS, ... as they were (bash runs a SHELLOPTS=xtrace job traced), at its start and at
    `corral exec`, and no line said so."""
    env = {"UID": "7", "SHELLOPTS": "xtrace", "TRIAL": "t"}
    with local_engine_factory(tmp_path, isolation=False) as factory:
        job = 'echo "uid=${UID-unset} trial=$TRIAL"; echo ready; exec sleep 60'
        log, entered = _log_and_env_entered(factory(), job, env)
    notes = [line for line in log if line.startswith("corral: ")]
    assert [line.split(" is not set from the job's spec: ")[0] for line in notes] == [
        "corral: UID",
        "corral: SHELLOPTS",
    ], log
    assert all("it is a shell's own variable, which bash keeps" in line for line in notes), notes
    (job_line,) = [line for line in log if "trial=" in line and not line.startswith("+")]
    assert job_line.endswith("trial=t") and "uid=7 " not in job_line, log
    assert entered.returncode == 0 and "TRIAL=t" in entered.stdout.splitlines(), entered.stderr
    shown = entered.stdout.splitlines()
    assert "UID=7" not in shown and "SHELLOPTS=xtrace" not in shown, shown
    assert entered.stderr.startswith("corral: UID is not set from the job's spec: "), entered.stderr
    assert "corral: SHELLOPTS is not set" in entered.stderr
