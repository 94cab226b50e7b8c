"""A catalogue environment on the Slurm engine: the store's read-only copy on the shared storage
root, bound at /env/<name> by the node's bubblewrap with its bin/ first on PATH, exactly as the
local engine does. The copy is made the way a build job makes it (corral.environments.buildstep,
offline from a wheel the test builds) and moved into the store like the env-builds loop does."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from corral.engine.base import AttemptPhase, MountSpec
from corral.environments import store
from corral.environments.buildstep import LOCK_FILE, VENV_DIR, cache_key
from corral.storage.layout import ensure_layout
from tests.environments.wheels import make_wheel
from tests.slurm.harness import SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, slurm_engine, wait_for

# The job accounts must read the interpreter the environment is built for: the system one here
# (the server's may live under /root, which they cannot enter).
PYTHON = "/usr/bin/python3"


def build_copy(root: Path, work: Path) -> Path:
    make_wheel(work / "wheels", "corraltestpkg", "1.0", "VALUE = 42\n")
    (work / "out").mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(work),
        "CORRAL_WORK_DIR": str(work),
        "CORRAL_OUTPUTS": str(work / "out"),
        "CORRAL_ENV_SOURCE_KIND": "requirements",
        "CORRAL_ENV_SOURCE": "corraltestpkg==1.0\n",
        "CORRAL_ENV_PYTHON": PYTHON,
        "CORRAL_ENV_FIND_LINKS": str(work / "wheels"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "corral.environments.buildstep"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    version = subprocess.run(
        [PYTHON, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    key = cache_key(version, (work / "out" / LOCK_FILE).read_text())
    assert store.ingest(root, key, work / "out" / VENV_DIR)
    return store.copy_dir(root, key)


def test_job_runs_in_its_environment_on_slurm(slurm_cluster: SlurmCluster) -> None:
    state = slurm_cluster.new_state_dir()
    root = state / "storage"
    ensure_layout(root)
    os.chmod(state, 0o755)
    copy = build_copy(root, state / "build")
    engine = slurm_engine(slurm_cluster, storage_root=root)
    command = (
        "python -c 'import corraltestpkg; print(\"VALUE\", corraltestpkg.VALUE)'; "
        "python -c 'import yaml' 2>/dev/null; echo yaml=$?; command -v python; "
        "touch /env/tpkg/x 2>/dev/null; echo touch=$?"
    )
    base = attempt("801.1", instance("node1", command), user="alice")
    launch = replace(
        base,
        mounts=(MountSpec(str(copy), "/env/tpkg", True),),
        environment="tpkg@1",
        environment_bin="/env/tpkg/bin",
    )
    engine.launch(launch)
    status = wait_for(engine, "801.1", FINISHED, timeout_s=30)
    out = engine.logs("801.1", 0).data.decode(errors="replace")
    assert status.phase is AttemptPhase.SUCCEEDED, out
    assert "VALUE 42" in out and "yaml=1" in out, out  # its package; not the server's pyyaml
    assert "/env/tpkg/bin/python" in out and "touch=0" not in out, out
