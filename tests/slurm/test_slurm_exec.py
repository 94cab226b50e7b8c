"""SlurmEngine.exec_command on a real Slurm cluster: the command runs in a step of the job on the
rank's node, as the job's account, inside the rank's sandbox (its /tmp, its pid namespace, its
GPUs); unknown and finished attempts are refused. A failing command's output and exit code come
back without srun's own "task 0: Exited with exit code N" line; srun's real errors still show."""

from __future__ import annotations

import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase, ExecRefused, MountSpec
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.enter import without_srun_exit_line
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, wait_for

pytestmark = pytest.mark.slurm

JOB = "echo inside > /tmp/mark; echo GPUS=$CUDA_VISIBLE_DEVICES; echo ready; exec sleep 60"


def _ready(engine: SlurmEngine, attempt_id: str) -> str:
    deadline = time.monotonic() + 30
    while "ready" not in (log := engine.logs(attempt_id).data.decode(errors="replace")):
        assert time.monotonic() < deadline, f"the job never got ready: {log!r}"
        assert engine.poll([attempt_id])[attempt_id].phase not in FINISHED, log
        time.sleep(0.1)
    return log


def test_exec_enters_the_ranks_sandbox_on_its_node(engine: SlurmEngine, slurm_cluster: SlurmCluster) -> None:
    with pytest.raises(ExecRefused, match="unknown"):
        engine.exec_command("931.1", 0, ["true"])
    engine.launch(attempt("931.1", instance("node2", JOB, gpus=(1, 2))))
    log = _ready(engine, "931.1")
    gpus = next(line for line in log.splitlines() if line.startswith("GPUS="))
    cmd = engine.exec_command(
        "931.1",
        0,
        ["/bin/sh", "-c", "id -u; hostname; cat /tmp/mark; echo GPUS=$CUDA_VISIBLE_DEVICES; echo $$"],
    )
    out = subprocess.run(cmd.argv, env=dict(cmd.env), cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    uid, host, mark, seen_gpus, pid = out.stdout.split()
    assert int(uid) == pwd.getpwnam(TEST_ACCOUNTS["alice"]).pw_uid
    assert (host, mark, seen_gpus) == ("node2", "inside", gpus)
    assert int(pid) < 100  # a small pid: inside the sandbox's own pid namespace
    with pytest.raises(ExecRefused, match="no rank 1"):
        engine.exec_command("931.1", 1, ["true"])
    engine.stop("931.1", 0)
    deadline = time.monotonic() + 30
    while engine.poll(["931.1"])["931.1"].phase is not AttemptPhase.FAILED:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(ExecRefused, match="not running"):
        engine.exec_command("931.1", 0, ["true"])


def test_a_failing_command_shows_its_output_and_exit_code_not_sruns_line(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    engine.launch(attempt("932.1", instance("node1", JOB)))
    _ready(engine, "932.1")
    # "no newline" ends without one: srun's line would follow it on the same line
    failing = ["/bin/sh", "-c", "echo out; echo err >&2; printf 'no newline' >&2; exit 3"]
    cmd = engine.exec_command("932.1", 0, failing)
    out = subprocess.run(cmd.argv, env=dict(cmd.env), cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (3, "out\n", "err\nno newline")
    engine.stop("932.1", 0)
    wait_for(engine, "932.1", FINISHED, timeout_s=30)


def test_sruns_real_errors_still_show(slurm_cluster: SlurmCluster) -> None:
    """A step in a job that does not exist: srun's refusal reaches the user, with its exit code."""
    argv = without_srun_exit_line(["srun", "--jobid=999999", "--overlap", "--quiet", "true"])
    out = subprocess.run(argv, env=slurm_cluster.env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "srun: error:" in out.stderr and "999999" in out.stderr, out.stderr


# A library that says, on stderr, in which program the loader ran it
PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void said(void) {
    char comm[64] = {0};
    int fd = open("/proc/self/comm", O_RDONLY);
    if (fd >= 0) { read(fd, comm, sizeof comm - 1); close(fd); }
    dprintf(2, "preloaded in %s", comm);
}
"""
PRELOADED = re.compile(r"^preloaded in (\S+)$", re.M)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the preloaded library")
def test_the_jobs_environment_reaches_only_its_sandbox_not_bwrap_nor_execs_helpers(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """review110 #2: the rank script exported the job's environment before it ran bwrap, so an
    LD_PRELOAD of the job's ran its code outside the sandbox, in bwrap (which could then forge
    the bwrap status file), and `corral exec` ran it in its python3. Now the library is loaded
    only in the job's own programs, inside the sandbox, and the job and an exec get their env."""
    lib_dir = slurm_cluster.new_state_dir() / "lib"
    lib_dir.mkdir()
    (lib_dir / "mark.c").write_text(PRELOAD_C)
    lib = lib_dir / "mark.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(lib_dir / "mark.c")], check=True)
    lib_dir.chmod(0o755)
    env = {"LD_PRELOAD": str(lib), "GREETING": "hello there"}
    job = "echo GREETING=$GREETING; echo STASHED=$(env | grep -c CORRAL_JOB_ENV_); echo ready; exec sleep 60"
    launch = attempt("933.1", instance("node1", job, env=env), mounts=[MountSpec(str(lib_dir), str(lib_dir))])
    engine.launch(launch)
    log = _ready(engine, "933.1")
    assert "GREETING=hello there" in log and "STASHED=0" in log, log
    # the job's shell, its `env` and `grep` and then its sleep: never bwrap, /usr/bin/env, cat...
    assert set(PRELOADED.findall(log)) == {"sh", "env", "grep", "sleep"}, log
    leftovers = "env | grep -c -e CORRAL_JOB_ENV_ -e ^CORRAL_ENV_NAMES= -e ^RESTORE= -e ^JOIN_PY= || :"
    probe = ["/bin/sh", "-c", f"echo GREETING=$GREETING; echo LD=$LD_PRELOAD; {leftovers}"]
    cmd = engine.exec_command("933.1", 0, probe)
    out = subprocess.run(cmd.argv, env=dict(cmd.env), cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["GREETING=hello there", f"LD={lib}", "0"], out.stdout
    assert set(PRELOADED.findall(out.stderr)) == {"sh", "env", "grep"}, out.stderr  # not python3, cat
    engine.stop("933.1", 0)
    wait_for(engine, "933.1", FINISHED, timeout_s=30)


def test_a_stored_jobs_shell_owned_variables_are_not_set_and_its_log_says_so(engine: SlurmEngine) -> None:
    """rough14 #4, on Slurm: the rank script's restore (root_env.RESTORE_SCRIPT inside the
    sandbox, and again at `corral exec`) leaves a shell's own names of a job stored before specs
    were refused them unset, its log naming each, where a bash /bin/sh stopped before the command."""
    job = 'echo "uid=${UID-unset} trial=$TRIAL"; echo ready; exec sleep 60'
    engine.launch(attempt("933.1", instance("node1", job, env={"UID": "7", "TRIAL": "t"})))
    log = _ready(engine, "933.1").splitlines()
    cmd = engine.exec_command("933.1", 0, ["/usr/bin/env"])
    out = subprocess.run(cmd.argv, env=dict(cmd.env), cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
    engine.stop("933.1", 0)
    wait_for(engine, "933.1", FINISHED, timeout_s=30)
    said = "corral: UID is not set from the job's spec: it is a shell's own variable, which bash keeps"
    assert log[0].startswith(said), log
    assert log[1] == "uid=unset trial=t" or (
        Path("/bin/sh").resolve().name == "bash" and log[1] != "uid=7 trial=t"
    )
    assert out.returncode == 0 and "TRIAL=t" in out.stdout.splitlines(), out.stderr
    assert "UID=7" not in out.stdout.splitlines() and said in out.stderr
