"""Entering a running rank's sandbox on the Slurm engine (`SlurmEngine.exec_command`).

The server (root) drops to the job's own Unix account and runs
`srun --jobid=<job> --overlap --nodes=1 --ntasks=1 --nodelist=<node>`: a new step of the job
itself, so Slurm places it in the job's cgroup on the rank's node (its CPU, memory and device
limits), as the job's user, and kills it with the job. On the node, ENTER_SCRIPT finds the rank's
sandbox from the pid its rank script recorded (rank-R.pid in the job dir: bwrap, then bwrap's
pid 1, then the job's first process), takes the rank's environment (rank-R.env: the exports the
rank script made, CUDA_VISIBLE_DEVICES included, each stashed under root_env.STASH_PREFIX, and
the list of their names) and joins the job's mount, pid and ipc namespaces, root and working
dir, then its own nested user namespace (JOIN_PY: the node needs a python3), where a shell puts
the job's variables back under their own names (root_env.RESTORE_SCRIPT) and execs the command:
the programs on the way, outside the sandbox, never see them (an LD_PRELOAD of the job's). The
rank script empties both files when the rank ends (an empty pid: no sandbox).
srun runs without --pty: a shell through it has no job control. srun's stderr goes through
SRUN_FILTER on the server, which drops the one line srun adds when the command fails.
"""

from __future__ import annotations

import pwd
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from corral.engine.base import ExecCommand, ExecRefused
from corral.engine.isolation.root_env import RESTORE_SCRIPT
from corral.engine.slurm.state import AttemptRecord, read_job_file

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
n=$CORRAL_ENV_NAMES; rs=$RESTORE; unset CORRAL_ENV_NAMES RESTORE
exec "$py" -I -S -c "$JOIN_PY" "$t" /bin/sh -c "$rs" corral-env $n -- "$@"
"""
# srun reports a task's non-zero exit on its own stderr even under --quiet ("srun: error: node2:
# task 0: Exited with exit code 3"): chatter to the user, whose exec already ends with that code.
# SRUN_FILTER runs argv[4:] with its stderr on a pipe and passes on everything but that line
# (the pattern argv[1]); srun's real errors (a node down, a step refused) pass. The line may
# follow command output that had no newline, so it is cut out wherever it starts, and a full
# pipe may split it across reads anywhere, even inside "srun: error: ": the end of a read that
# could still grow into the line (argv[2], at most SRUN_HOLD_BYTES) waits for the next read.
# srun writes the line in one write, so its rest is already on its way: what is held is passed
# on after argv[3] seconds with nothing more read, so a prompt that happens to end like the
# line's start ("...s") or a "\r" progress bar after an "srun: error: " is shown, not stalled.
# SIGINT and SIGQUIT from a terminal are srun's (it has its own handlers); a Python handler here,
# unlike an ignore, does not pass on through exec. It exits as srun did, 128+N for a signal.
SRUN_EXIT_LINE_PARTS: tuple[tuple[bool, bytes], ...] = (  # (literal?, text); the line, in order
    (True, b"srun: error: "),
    (False, rb"[^\n:]+"),
    (True, b": task"),
    (False, rb"s?"),
    (True, b" "),
    (False, rb"[0-9,-]+"),
    (True, b": Exited with exit code "),
    (False, rb"[0-9]+"),
)
SRUN_EXIT_LINE = b"".join(re.escape(text) if lit else text for lit, text in SRUN_EXIT_LINE_PARTS) + rb"\n"
SRUN_HOLD_BYTES = 512  # longer than any exit line a node name and task list give
SRUN_HOLD_SECONDS = 1.0


def _unfinished_line_pattern(parts: Sequence[tuple[bool, bytes]]) -> bytes:
    """A pattern that matches, at the end of the data, any non-empty start of the line `parts`
    make (without its newline): each part whole and the rest optional, or a literal cut short."""
    rest = b""
    for literal, text in reversed(parts):
        tail = b"(?:" + rest + b")?" if rest else b""
        if literal:
            cut = b"|".join(re.escape(text[:n]) for n in range(len(text) - 1, 0, -1))
            rest = b"(?:" + re.escape(text) + tail + (b"|" + cut if cut else b"") + b")"
        else:
            rest = text + tail
    return rest + rb"\Z"


SRUN_UNFINISHED_LINE = _unfinished_line_pattern(SRUN_EXIT_LINE_PARTS)
SRUN_FILTER = r"""
import os, re, select, signal, subprocess, sys
exit_line, unfinished = re.compile(sys.argv[1].encode()), re.compile(sys.argv[2].encode())
hold_bytes, hold_seconds = (float(n) for n in sys.argv[3].split(","))
for sig in (signal.SIGINT, signal.SIGQUIT):
    signal.signal(sig, lambda *_: None)
proc = subprocess.Popen(sys.argv[4:], stderr=subprocess.PIPE)
fd = proc.stderr.fileno()
broken, held = False, b""
def put(data):
    global broken
    while data and not broken:
        try:
            data = data[os.write(2, data):]
        except OSError:
            broken = True  # nobody reads our stderr: keep draining srun's until it ends
while True:
    if held and not select.select([fd], [], [], hold_seconds)[0]:
        put(held)  # its rest never came: not srun's line after all
        held = b""
        continue
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        break
    data = exit_line.sub(b"", held + chunk)
    # a line that may be srun's, cut by a full pipe: held back until its end is read
    window = max(0, len(data) - int(hold_bytes))
    start = unfinished.search(data, window)
    cut = start.start() if start else len(data)
    held = data[cut:]
    put(data[:cut])
put(held)
code = proc.wait()
sys.exit(128 - code if code < 0 else code)
"""


def without_srun_exit_line(argv: Sequence[str], hold_seconds: float = SRUN_HOLD_SECONDS) -> tuple[str, ...]:
    """`argv` (an srun, maybe behind setpriv) under SRUN_FILTER, run by the server's own Python."""
    patterns = (SRUN_EXIT_LINE.decode(), SRUN_UNFINISHED_LINE.decode())
    hold = f"{SRUN_HOLD_BYTES},{hold_seconds}"
    return (sys.executable, "-I", "-S", "-c", SRUN_FILTER, *patterns, hold, *argv)


RANK_HEADER_BYTES = 4096  # the rank script's first two lines (shebang, header) are within it
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")  # a Slurm node's hostname


def rank_node(job_dir: Path, rank: int, owner: int) -> str:
    """The node the rank was placed on, from its rank script's header line ("" when it names
    none). The job dir is the job account's, which may swap the script for a symlink or a FIFO:
    it is read as read_job_file reads (no symlink followed, no FIFO waited on, only a plain file
    of `owner`'s, a few KiB), ExecRefused otherwise; what it names must look like a node."""
    path = job_dir / f"rank-{rank}.sh"
    try:
        data, _, _ = read_job_file(path, owner, limit=RANK_HEADER_BYTES)
    except FileNotFoundError:
        return ""
    except OSError:  # UnsafeJobFile (a FIFO, a device, another uid's file) or ELOOP (a symlink)
        raise ExecRefused(f"rank {rank}: its script in the job dir is not a plain file of the job's")
    lines = data.decode("utf-8", errors="replace").splitlines()
    header = lines[1] if len(lines) > 1 else ""
    node = header.rsplit(" on ", 1)[-1].strip() if " on " in header else ""
    return node if NODE_NAME.match(node) else ""


def enter_argv(
    record: AttemptRecord, job_dir: Path, rank: int, argv: Sequence[str], srun: str, env: dict[str, str]
) -> ExecCommand:
    if not argv:
        raise ExecRefused("no command given: name the program to run inside the job")
    if not 0 <= rank < record.n_ranks:
        raise ExecRefused(f"attempt {record.attempt_id} has no rank {rank} (ranks 0..{record.n_ranks - 1})")
    if not record.slurm_job_id or record.uid is None:
        raise ExecRefused(f"attempt {record.attempt_id} rank {rank}: not placed on a node by Slurm (yet)")
    node = rank_node(job_dir, rank, record.uid)
    if not node:
        raise ExecRefused(f"attempt {record.attempt_id} rank {rank}: not placed on a node by Slurm (yet)")
    try:
        gid = pwd.getpwuid(record.uid).pw_gid
    except KeyError:
        raise ExecRefused(f"attempt {record.attempt_id}: its Unix account (uid {record.uid}) is gone")
    step = [srun, f"--jobid={record.slurm_job_id}", "--overlap", "--nodes=1", "--ntasks=1"]
    step += [f"--nodelist={node}", "--quiet", "--export=ALL", "--input=all"]
    drop = ["/usr/bin/setpriv", f"--reuid={record.uid}", f"--regid={gid}", "--clear-groups", "--"]
    inner = ["/bin/sh", "-c", ENTER_SCRIPT, "corral-enter", str(job_dir), str(rank), *argv]
    argv_out = without_srun_exit_line((*drop, *step, *inner))
    return ExecCommand(argv=argv_out, env={**env, "JOIN_PY": JOIN_PY, "RESTORE": RESTORE_SCRIPT}, cwd="/")
