"""A Slurm job's secrets (real Slurm, real test accounts, bubblewrap on the nodes): the job reads
its env and file secret (hashes compared), the file lies in its job dir on the shared storage,
0400 and its account's, which another account cannot read; the value is in no script, not in
`scontrol show job`, and the secrets are gone once the job ended."""

from __future__ import annotations

import hashlib
import pwd
import stat
import subprocess
import time
from dataclasses import replace

import pytest

from corral.engine.base import AttemptPhase, SecretGrant
from corral.engine.slurm import SlurmEngine
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, wait_for

pytestmark = pytest.mark.slurm

ENV_VALUE = b"tok 'q' $HOME\n"  # shell-special characters and a trailing newline: kept as they are
FILE_VALUE = b"-----BEGIN TEST KEY-----\nslurm-8f2e61\n-----END TEST KEY-----\n"
JOB = (
    'printf %s "$WANDB_API_KEY" | sha256sum; sha256sum < /run/secrets/id_rsa; '
    'echo "mode=$(stat -c %a /run/secrets/id_rsa) owner=$(stat -c %u /run/secrets/id_rsa) me=$(id -u)"; '
    "echo ready; while [ ! -e /job/go ]; do sleep 0.1; done"
)


def test_a_slurm_job_gets_its_secrets_readable_by_its_account_only(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    grants = (
        SecretGrant("wandb", ENV_VALUE, env="WANDB_API_KEY"),
        SecretGrant("ssh_key", FILE_VALUE, file="id_rsa"),
    )
    launch = replace(attempt("521.1", instance("node1", JOB)), secrets=grants)
    ref = engine.launch(launch)
    deadline = time.monotonic() + 30
    while "ready" not in (log := engine.logs("521.1").data.decode(errors="replace")):
        assert time.monotonic() < deadline, f"the job never got ready: {log!r}"
        assert engine.poll(["521.1"])["521.1"].phase not in FINISHED, log
        time.sleep(0.1)
    lines = log.splitlines()
    assert lines[0].split()[0] == hashlib.sha256(ENV_VALUE).hexdigest()
    assert lines[1].split()[0] == hashlib.sha256(FILE_VALUE).hexdigest()
    alice = pwd.getpwnam(TEST_ACCOUNTS["alice"]).pw_uid
    assert lines[2] == f"mode=400 owner={alice} me={alice}"

    # On the shared storage: in alice's 0700 job dir, 0400 and hers; bob's account cannot read it.
    job_dir = engine.store.job_dir("521.1")
    secret_file = job_dir / "secrets" / "files" / "id_rsa"
    st = secret_file.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice, 0o400)
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    bob = pwd.getpwnam(TEST_ACCOUNTS["bob"]).pw_uid
    as_bob = subprocess.run(
        ["setpriv", f"--reuid={bob}", f"--regid={bob}", "--clear-groups", "cat", str(secret_file)],
        capture_output=True,
        timeout=10,
    )
    assert (
        as_bob.returncode != 0 and b"Permission denied" in as_bob.stderr and FILE_VALUE not in as_bob.stdout
    )
    # Not in a script, nor in what Slurm shows of the job (no --export of values).
    scontrol = subprocess.run(
        ["scontrol", "show", "job", "--details", ref],
        env=slurm_cluster.env,
        capture_output=True,
        timeout=15,
    )
    assert scontrol.returncode == 0 and b"corral-521.1" in scontrol.stdout
    for text in [scontrol.stdout, *(p.read_bytes() for p in job_dir.glob("*.sh"))]:
        assert ENV_VALUE.strip() not in text and b"slurm-8f2e61" not in text

    (job_dir / "work" / "0" / "go").touch()
    assert wait_for(engine, "521.1", FINISHED, timeout_s=30).phase is AttemptPhase.SUCCEEDED
    assert not (job_dir / "secrets").exists()
