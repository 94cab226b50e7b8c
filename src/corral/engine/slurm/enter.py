"""Entering a running rank's sandbox on the Slurm engine (`SlurmEngine.exec_command`).

The server (root) drops to the job's own Unix account and runs
`srun --jobid=<job> --overlap --nodes=1 --ntasks=1 --nodelist=<node>`: a new step of the job
itself, so Slurm places it in the job's cgroup on the rank's node (its CPU, memory and device
limits), as the job's user, and kills it with the job. On the node, ENTER_SCRIPT finds the rank's
sandbox from the pid its rank script recorded (rank-R.pid in the job dir: bwrap, then bwrap's
pid 1, then the job's first process), takes the rank's environment (rank-R.env: the exports the
rank script made, CUDA_VISIBLE_DEVICES included) and joins the job's mount, pid and ipc
namespaces, root and working dir, then its own nested user namespace (JOIN_PY: the node needs a
python3). The rank script empties both files when the rank ends (an empty pid: no sandbox).
srun runs without --pty: a shell through it has no job control.
"""

from __future__ import annotations

import pwd
from collections.abc import Sequence
from pathlib import Path

from corral.engine.base import ExecCommand, ExecRefused
from corral.engine.slurm.state import AttemptRecord

NO_SANDBOX = 125  # exit code of ENTER_SCRIPT when the rank's sandbox is not there
# Joins the namespaces of pid argv[1] (host view) and execs argv[2:]. bwrap --disable-userns
# leaves the job in a user namespace nested in the one that owns its mount, pid and ipc
# namespaces: join the owner (the parent, NS_GET_PARENT) first, the namespaces, the root and cwd,
# then fork into the pid namespace and join the nested one, all in one process (an exec between
# would drop the capabilities the joins need).
JOIN_PY = r"""
import ctypes, fcntl, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def setns(fd, kind):
    if libc.setns(fd, kind) != 0:
        err = ctypes.get_errno()
        sys.exit(f"corral: cannot enter the job's sandbox: {os.strerror(err)}")
t, argv = sys.argv[1], sys.argv[2:]
os.environ.pop("JOIN_PY", None)
inner = os.open(f"/proc/{t}/ns/user", os.O_RDONLY)
owner = fcntl.ioctl(inner, 0xB702)  # NS_GET_PARENT
ns = {k: os.open(f"/proc/{t}/ns/{k}", os.O_RDONLY) for k in ("ipc", "mnt", "pid")}
root, cwd = os.open(f"/proc/{t}/root", os.O_RDONLY), os.open(f"/proc/{t}/cwd", os.O_RDONLY)
setns(owner, 0x10000000)
setns(ns["ipc"], 0x08000000); setns(ns["mnt"], 0x00020000); setns(ns["pid"], 0x20000000)
os.fchdir(root); os.chroot("."); os.fchdir(cwd)
pid = os.fork()
if pid == 0:
    setns(inner, 0x10000000)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"corral: {argv[0]}: {exc.strerror}\n"); os._exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
sys.exit(128 - code if code < 0 else code)
"""
ENTER_SCRIPT = r"""
J=$1; r=$2; shift 2
b=$(cat "$J/rank-$r.pid" 2>/dev/null)
init=$(cat /proc/"$b"/task/*/children 2>/dev/null | awk '{print $1; exit}')
t=$(cat /proc/"$init"/task/*/children 2>/dev/null | awk '{print $1; exit}')
if [ -z "$b" ] || [ -z "$t" ]; then
  echo "corral: rank $r of this job has no running sandbox on $(hostname)" >&2; exit 125
fi
py=$(command -v python3) || { echo "corral: python3 is missing on $(hostname)" >&2; exit 125; }
set -a; . "$J/rank-$r.env"; set +a
exec "$py" -I -S -c "$JOIN_PY" "$t" "$@"
"""


def rank_node(job_dir: Path, rank: int) -> str:
    """The node the rank was placed on, from its rank script's header line."""
    try:
        header = (job_dir / f"rank-{rank}.sh").read_text().splitlines()[1]
    except (OSError, IndexError):
        return ""
    return header.rsplit(" on ", 1)[-1].strip() if " on " in header else ""


def enter_argv(
    record: AttemptRecord, job_dir: Path, rank: int, argv: Sequence[str], srun: str, env: dict[str, str]
) -> ExecCommand:
    if not argv:
        raise ExecRefused("no command given: name the program to run inside the job")
    if not 0 <= rank < record.n_ranks:
        raise ExecRefused(f"attempt {record.attempt_id} has no rank {rank} (ranks 0..{record.n_ranks - 1})")
    node = rank_node(job_dir, rank)
    if not node or not record.slurm_job_id or record.uid is None:
        raise ExecRefused(f"attempt {record.attempt_id} rank {rank}: not placed on a node by Slurm (yet)")
    try:
        gid = pwd.getpwuid(record.uid).pw_gid
    except KeyError:
        raise ExecRefused(f"attempt {record.attempt_id}: its Unix account (uid {record.uid}) is gone")
    step = [srun, f"--jobid={record.slurm_job_id}", "--overlap", "--nodes=1", "--ntasks=1"]
    step += [f"--nodelist={node}", "--quiet", "--export=ALL", "--input=all"]
    drop = ["/usr/bin/setpriv", f"--reuid={record.uid}", f"--regid={gid}", "--clear-groups", "--"]
    inner = ["/bin/sh", "-c", ENTER_SCRIPT, "corral-enter", str(job_dir), str(rank), *argv]
    return ExecCommand(argv=(*drop, *step, *inner), env={**env, "JOIN_PY": JOIN_PY}, cwd="/")
