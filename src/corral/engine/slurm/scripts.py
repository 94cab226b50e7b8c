"""Turns one AttemptLaunch into one Slurm batch job: sbatch options plus three kinds of scripts
written into the attempt's job dir (on a filesystem the compute nodes share, owned by the Unix
account the job runs as; see state.py for the layout).

    batch.sh    the job script; on several nodes it runs `srun` with one task per node
    node.sh     per node: starts every instance Corral placed on this node ($SLURMD_NODENAME)
    rank-R.sh   per instance: its own environment; its command inside a bubblewrap sandbox with
                only its share of the GPUs Slurm allocated; writes rank-R.log and rank-R.exit,
                and bwrap's --json-status-fd lines to ../bwrap-R.status (in the attempt dir:
                whether the job's command ever ran, see BWRAP_STATUS_FILE)
    secrets/    the values of the secrets the job names (isolation/secret_files.py), 0400 for
                the job's account; removed by batch.sh at the end and by the engine

One Slurm job for the whole attempt keeps the gang in Slurm's hands (all nodes allocated at once,
released together). Slurm requests are per node, so a node gets the sum of what Corral placed on
it; when nodes carry different loads every node is asked for the largest sum (see docs/slurm.md).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.engine.base import AttemptLaunch, InstanceLaunch, SecretGrant
from corral.engine.isolation.bwrap_status import with_status_fd
from corral.engine.isolation.root_env import STASH_PREFIX
from corral.engine.isolation.sandbox import SANDBOX_WORK_DIR, SandboxSpec, bwrap_argv_parts, write_etc
from corral.engine.isolation.secret_files import SANDBOX_SECRETS_DIR, SECRETS_DIR_ENV, write_secrets
from corral.engine.slurm.users import UnixAccount

# The batch step's output file in the job dir (sbatch --output; %j is Slurm's job id): slurmstepd
# makes it as the job starts on its node, which the engine's poll reads as "started".
BATCH_OUTPUT = "slurm-{job_id}.out"

ATTEMPT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOB_NAME_PREFIX = "corral-"
DEFAULT_GPU_DEVICE = "/dev/nvidia{index}"  # CORRAL_SLURM_GPU_DEVICE: a GPU's device file on a node
# The attempt dir's markers, which the engine writes and the node scripts read (as the job's account:
# the dir is 0711). STOP_MARKER: start nothing. KILL_MARKER: Corral gave the attempt up (its final
# kill, or LOST); node.sh looks for it every KILL_CHECK_S while its ranks run and kills them itself,
# as Slurm cannot where it lost the node (a hung or cut-off slurmd: the job's NODE_FAIL while the
# ranks run on, beside the retry Corral starts elsewhere).
STOP_MARKER = "stop"
KILL_MARKER = "kill"
KILL_CHECK_S = 1
# The attempt dir's token of its current submission (state.StateStore.new_submission, written before
# each sbatch, which hands the same token to batch.sh as its argument and in --comment). An sbatch
# whose answer timed out may reach a busy slurmctld after the attempt was submitted again: that
# job's token is no longer the current one, so its scripts run nothing (and a superseded job that
# started first has its ranks killed by node.sh's watch, as with KILL_MARKER).
SUBMISSION_FILE = "submission"
GPU_SIDE_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# Where a rank's bwrap writes its --json-status-fd lines (isolation/bwrap_status.py): whether it
# exec'd the job's command, so that a sandbox bwrap refused to set up ends as launch_failed and not
# as the job's exit 1 (state.StateStore.sandbox_refusal). In the attempt dir, which is root's: the
# engine makes the file at launch holding BWRAP_NOT_STARTED, owned by the job's account (whose rank
# script opens it, truncating, right before it execs bwrap), and the account can neither replace
# it nor make another there. Not reachable from the sandbox: the attempt dir is not bound into it,
# and bwrap closes the fd in the sandbox's child.
BWRAP_STATUS_FILE = "bwrap-{rank}.status"
BWRAP_NOT_STARTED = b"corral: bwrap not started\n"
# What the rank script writes there instead when its node's bubblewrap lacks --json-status-fd
# (the server's has it): bwrap then runs without it, and the rank's exit stays its own, as where
# no node's bubblewrap has it (review110 #6: not every rank refused as "Unknown option")
BWRAP_NO_STATUS = b"corral: this node's bwrap has no --json-status-fd\n"
BWRAP_STATUS_FD = 3


@dataclass(frozen=True, slots=True)
class NodeSandbox:
    """How the rank scripts sandbox a job on the compute nodes."""

    bwrap: str = "/usr/bin/bwrap"  # the same path on every node
    gpu_device: str = DEFAULT_GPU_DEVICE  # with {index}: Slurm's GPU index (gres.conf File= order)
    # bwrap reports through --json-status-fd whether it exec'd the job's command (probed on the
    # server's host at the engine's start, the same bubblewrap as on the nodes): the rank scripts
    # then give it BWRAP_STATUS_FILE. Without it a refused sandbox reads as the job's exit 1.
    json_status: bool = False


def job_name(attempt_id: str) -> str:
    return f"{JOB_NAME_PREFIX}{attempt_id}"


def validate(attempt: AttemptLaunch) -> list[InstanceLaunch]:
    """The attempt's instances sorted by rank; ValueError naming what is wrong."""
    if not ATTEMPT_ID_RE.match(attempt.attempt_id):
        raise ValueError(
            f"attempt_id {attempt.attempt_id!r} must be 1-128 characters of letters, digits, '.', '_' or '-'"
        )
    if not attempt.instances:
        raise ValueError(f"attempt {attempt.attempt_id} has no instances")
    ranks = sorted(attempt.instances, key=lambda i: i.rank)
    if [i.rank for i in ranks] != list(range(len(ranks))):
        raise ValueError(f"attempt {attempt.attempt_id}: ranks must be 0..{len(ranks) - 1}, got {ranks}")
    for inst in ranks:
        if not inst.node:
            raise ValueError(f"attempt {attempt.attempt_id} rank {inst.rank}: no node placed")
        if not inst.command.strip():
            raise ValueError(f"attempt {attempt.attempt_id} rank {inst.rank}: empty command")
        bad = [k for k in inst.env if not _ENV_NAME_RE.fullmatch(k)]
        if bad:
            raise ValueError(f"attempt {attempt.attempt_id} rank {inst.rank}: invalid env names {bad}")
    if attempt.max_runtime_s is not None and attempt.max_runtime_s <= 0:
        raise ValueError(f"attempt {attempt.attempt_id}: max_runtime_s must be > 0")
    return ranks


@dataclass(frozen=True, slots=True)
class NodeShare:
    """What Corral placed on one node: its instances (ranks) and their summed requests."""

    node: str
    ranks: tuple[int, ...]
    gpus: int
    cpus: float
    memory_mib: int


def node_shares(instances: list[InstanceLaunch]) -> list[NodeShare]:
    order = list(dict.fromkeys(i.node for i in instances))
    shares = []
    for node in order:
        mine = [i for i in instances if i.node == node]
        shares.append(
            NodeShare(
                node=node,
                ranks=tuple(i.rank for i in mine),
                gpus=sum(len(i.gpus) for i in mine),
                cpus=sum(i.cpus for i in mine),
                memory_mib=sum(i.memory_mib for i in mine),
            )
        )
    return shares


def sbatch_args(
    attempt: AttemptLaunch,
    instances: list[InstanceLaunch],
    job_dir: Path,
    partition: str | None,
    account: UnixAccount,
    token: str,
) -> list[str]:
    """`token`: this submission's (SUBMISSION_FILE), passed to batch.sh and kept in the comment,
    where the engine finds which of an attempt's jobs is the current submission."""
    shares = node_shares(instances)
    n = len(shares)
    args = [
        "--parsable",
        f"--job-name={job_name(attempt.attempt_id)}",
        # the job runs as its user's own account, never as the server's (sbatch runs as root)
        f"--uid={account.uid}",
        f"--gid={account.gid}",
        # A requeued job would run a second time behind Corral's back (a node that "crashed" may
        # still be running it): with --no-requeue a node failure ends the job as NODE_FAIL.
        "--no-requeue",
        "--export=ALL",  # of the clean environment sbatch runs with (SlurmCli.submit_env)
        f"--chdir={job_dir}",
        f"--output={job_dir}/{BATCH_OUTPUT.format(job_id='%j')}",
        f"--nodes={n}",
        f"--nodelist={','.join(s.node for s in shares)}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={max(1, math.ceil(max(s.cpus for s in shares)))}",
        f"--mem={max(1, max(s.memory_mib for s in shares))}M",
        f"--comment=corral job={attempt.job_id} attempt={attempt.attempt} user={attempt.user} "
        f"group={attempt.group} submission={token}",
    ]
    gpus = max(s.gpus for s in shares)
    if gpus:
        args.append(f"--gres=gpu:{gpus}")
    if attempt.max_runtime_s is not None:
        # Slurm counts whole minutes (and checks them about every 30 s); the engine also enforces
        # the exact limit itself when polling.
        args.append(f"--time={max(1, math.ceil(attempt.max_runtime_s / 60))}")
    if partition:
        args.append(f"--partition={partition}")
    args += [str(job_dir / "batch.sh"), token]
    return args


# Shell (batch.sh, node.sh) for "this job is the attempt's current submission": its token ($T, the
# scripts' argument) is the one in the attempt dir ($D). `read` is a builtin: node.sh's watch runs it
# every second.
_CURRENT = f"""T="${{1:-}}"
current() {{ t=""; read -r t 2>/dev/null <"$D/{SUBMISSION_FILE}"; [ "$t" = "$T" ]; }}
"""


def batch_script(
    attempt_id: str, attempt_dir: Path, job_dir: Path, n_nodes: int, secrets: bool = False
) -> str:
    d = shlex.quote(str(job_dir))
    if n_nodes == 1:
        run = f'/bin/sh {d}/node.sh "$T"'
    else:
        # --export=ALL: should the job have been submitted with --export=NONE, srun would inherit
        # SLURM_EXPORT_ENV=NONE and start the tasks with an empty environment (no PATH).
        run = (
            f"srun --export=ALL --nodes={n_nodes} --ntasks={n_nodes} --ntasks-per-node=1 "
            f'--kill-on-bad-exit=1 /bin/sh {d}/node.sh "$T"'
        )
    if secrets:
        # The job's secrets go when every instance has ended (the engine also removes them
        # once it sees the job end: a KILL leaves this script no time). A TERM is caught, so
        # the script waits for its child, which gets the TERM itself (scancel --full).
        s = shlex.quote(str(job_dir / "secrets"))
        # (not a superseded submission's: they are the current one's)
        rm = f"if current; then chmod -R u+w {s} 2>/dev/null; rm -rf {s}; fi"
        run = f"trap : TERM INT\n{run}\nrc=$?\n{rm}\nexit $rc"
    else:
        run = f"exec {run}"
    header = f"#!/bin/sh\n# Corral attempt {attempt_id} (generated)\n"
    superseded = (
        'if ! current; then echo "corral: this submission ($T) was superseded by a later one'
        ' of the attempt ($t): running nothing" >&2; exit 0; fi\n'
    )
    return (
        f"{header}PATH=${{PATH:-{DEFAULT_PATH}}}\nexport PATH\nD={shlex.quote(str(attempt_dir))}\n"
        f"{_CURRENT}{superseded}{run}\n"
    )


def node_script(attempt_dir: Path, job_dir: Path, shares: list[NodeShare], sandbox: NodeSandbox) -> str:
    """Starts the ranks placed on this node, forwards SIGTERM to them, exits with the first
    non-zero rank exit code. With `sandbox.json_status` it first asks the node's bubblewrap
    whether it has the option, for all its ranks (node_status_fd_probe)."""
    probe = node_status_fd_probe(shlex.quote(sandbox.bwrap)) if sandbox.json_status else ""
    d = shlex.quote(str(attempt_dir))
    j = shlex.quote(str(job_dir))
    cases = "".join(f"  {shlex.quote(s.node)}) ranks='{' '.join(map(str, s.ranks))}' ;;\n" for s in shares)
    return f"""#!/bin/sh
D={d}
J={j}
node="${{SLURMD_NODENAME:-$(hostname)}}"
case "$node" in
{cases}  *) echo "corral: no instance of this attempt is placed on node $node" >&2; exit 90 ;;
esac
{_CURRENT}# a stop Corral sent before this script existed (Slurm says RUNNING a little before it starts it)
if [ -e "$D/{STOP_MARKER}" ]; then exit 143; fi
# superseded by a later submission of the attempt (batch.sh checked it too, a moment before)
if ! current; then exit 0; fi
{NO_STATUS_FD_VAR}=""
{probe}pids=""
for r in $ranks; do
  /bin/sh "$J/rank-$r.sh" "${NO_STATUS_FD_VAR}" >"$J/rank-$r.log" 2>&1 </dev/null &
  pids="$pids $!"
done
trap 'kill -TERM $pids 2>/dev/null' TERM INT
# Corral gave the attempt up and Slurm may not reach this node to kill it (its slurmd hung or cut
# off: NODE_FAIL while these ranks run on), or a later submission of the attempt superseded this
# one: they end here, every process of theirs at once (a sandbox whose rank-R.sh died first would
# be orphaned, out of Slurm's reach). Deaf to TERM, so that a graceful stop does not end the watch.
tree() {{
  local c
  for c in $(command -p cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; tree "$c"; done
}}
(trap '' TERM INT
 while sleep {KILL_CHECK_S}; do
  if [ -e "$D/{KILL_MARKER}" ] || ! current; then
   kill -KILL $pids $(for p in $pids; do tree "$p"; done); exit
  fi
 done
) >/dev/null 2>&1 </dev/null &
watch=$!
rc=0
for p in $pids; do
  wait "$p"; c=$?
  # wait returns early (status > 128) when a trapped signal arrives: wait again until it is gone
  while kill -0 "$p" 2>/dev/null; do wait "$p"; c=$?; done
  if [ "$c" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$c; fi
done
kill -KILL "$watch" 2>/dev/null
exit $rc
"""


def _gpu_binds(inst: InstanceLaunch, offset: int, sandbox: NodeSandbox) -> str:
    """Shell that picks this instance's GPUs out of what Slurm allocated on the node (real
    indices: SLURM_STEP_GPUS in an srun step, SLURM_JOB_GPUS in the batch step), from position
    `offset` on, and sets the positional parameters to their bwrap --dev-bind arguments."""
    count = len(inst.gpus)
    if count == 0:
        return 'set --\nmine=""; cvd=""\n'
    before, _, after = sandbox.gpu_device.partition("{index}")
    device = f'{shlex.quote(before)}"$g"{shlex.quote(after)}' if after else f'{shlex.quote(before)}"$g"'
    side = " ".join(GPU_SIDE_DEVICES)
    return f"""all="${{SLURM_STEP_GPUS:-${{SLURM_JOB_GPUS:-}}}}"
set --
mine=""; cvd=""; n=0; pos=0
IFS=,
for g in $all; do
  if [ "$pos" -ge {offset} ] && [ "$n" -lt {count} ]; then
    set -- "$@" --dev-bind {device} "/dev/nvidia$g"
    mine="$mine${{mine:+,}}$g"; cvd="$cvd${{cvd:+,}}$n"; n=$((n + 1))
  fi
  pos=$((pos + 1))
done
unset IFS
if [ "$n" -lt {count} ]; then
  echo "corral: Slurm allocated GPUs [$all] on $(hostname);" \\
    "rank {inst.rank} needs {count} from position {offset}" >&2
  echo 90 >"$J/rank-{inst.rank}.exit"; exit 90
fi
for x in {side}; do if [ -e "$x" ]; then set -- "$@" --dev-bind "$x" "$x"; fi; done
"""


def _dir_checks(checks: Sequence[tuple[str, str]]) -> str:
    """Each line ends with what the rank saw on its node, as the job's account: the dir's owner,
    gid and mode and the job's own gids, so a dir closed for another reason than its groups
    (storage that shows ownership otherwise, e.g. NFS root_squash or idmap) shows as such."""
    out = []
    for path, line in checks:
        quoted = shlex.quote(path)
        seen = (
            f"; seen on $(hostname): owner:gid mode $(stat -c '%u:%g %a' {quoted}), the job's gids $(id -G)"
        )
        out.append(f'[ -x {quoted} ] || [ ! -d {quoted} ] || echo {shlex.quote(line)}"{seen}" >&2\n')
    return "".join(out)


def _secret_env(secrets: tuple[SecretGrant, ...], rank: int) -> str:
    """Shell that sets each env secret, stashed (_rank_exports), from its file (0400, the job's
    own): the values are never in this script, in sbatch's environment, in `scontrol show job` or
    on a command line. The `printf x` keeps trailing newlines, which $(...) would strip."""
    lines = []
    for grant in secrets:
        if grant.env is None:
            continue
        var, stash = grant.env, STASH_PREFIX + grant.env
        lines.append(
            f'if [ ! -r "$J/secrets/env/{var}" ]; then echo "corral: the value of secret '
            f'{shlex.quote(grant.name)} (env {var}) is missing" >&2; echo 90 >"$J/rank-{rank}.exit"; '
            f"exit 90; fi\n"
            f'{stash}=$(cat "$J/secrets/env/{var}"; printf x); {stash}=${{{stash}%x}}; export {stash}\n'
        )
    return "".join(lines)


# Set by the rank script itself, after the job's own variables (which they override)
RANK_SCRIPT_VARS = ("CUDA_VISIBLE_DEVICES", "CORRAL_SLURM_GPUS")
# rank-R.env's list of the stashed names, for `corral exec` (enter.py): not exported
ENV_NAMES_VAR = "CORRAL_ENV_NAMES"


def _rank_exports(
    inst: InstanceLaunch, account: UnixAccount, home: str | None, env_bin: str, has_files: bool
) -> tuple[list[str], str]:
    """The names of the instance's environment and its `export` lines: its own variables, then
    the defaults a login would give (PATH, HOME, USER, LOGNAME) where it set none. Each under
    STASH_PREFIX + its name (isolation/root_env.py), as the secrets and RANK_SCRIPT_VARS are:
    the rank script's own programs (cat, stat) and bwrap, which run as the job's account outside
    the sandbox, never see them (an LD_PRELOAD, LD_AUDIT or LD_LIBRARY_PATH of the job's would
    run its code there, where it could write the bwrap status file: review110 #2); the first
    process inside the sandbox puts them back (root_env.restoring_argv). Values are never on a
    command line (secrets are among them), only names."""
    env = dict(inst.env)
    if env_bin:
        env.setdefault("PATH", f"{env_bin}:{DEFAULT_PATH}")
    if has_files:
        env[SECRETS_DIR_ENV] = SANDBOX_SECRETS_DIR
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's allocation decides (set by the rank script)
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", home or SANDBOX_WORK_DIR)
    env.setdefault("CORRAL_WORK_DIR", SANDBOX_WORK_DIR)
    env.setdefault("USER", account.name)
    env.setdefault("LOGNAME", account.name)
    lines = "".join(f"export {STASH_PREFIX}{k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    return list(env), lines


# node.sh's shell variable, passed to each rank script it starts as $1: bwrap's words when this
# node's bubblewrap lacks --json-status-fd, else empty
NO_STATUS_FD_VAR = "no_status_fd"


def node_status_fd_probe(bwrap: str) -> str:
    """node.sh's lines that ask the node's bubblewrap, once for all the ranks it starts there
    (not once per rank), whether it has --json-status-fd: `bwrap --json-status-fd 1 --version`,
    which an older bwrap refuses with "Unknown option" before it reads --version (it parses its
    options in order). Only those words mean the option is missing (NO_STATUS_FD_VAR holds them):
    a probe that failed for another reason (no fork under the job's pids limit, no memory) leaves
    it empty, so the ranks run with the fd as usual and a refusal there is still read as one
    (review111 #2). The words are read by a second run only when the probe failed, so a node
    whose bwrap has the option pays one exec per job. No bubblewrap at all: no probe (each rank
    script says so itself). `bwrap` is a shell word."""
    probe = f"{bwrap} --json-status-fd 1 --version"
    return (
        f"if [ -x {bwrap} ] && ! {probe} >/dev/null 2>&1; then why=$({probe} 2>&1 >/dev/null); "
        f'case "$why" in *"Unknown option"*) {NO_STATUS_FD_VAR}="$why";; esac; fi\n'
    )


def status_fd_launch(status: str, with_fd: str, without_fd: str) -> str:
    """The rank's shell line that execs bwrap with BWRAP_STATUS_FD on `status` (`with_fd`), or,
    where node.sh's probe (node_status_fd_probe, its words in NO_STATUS_FD_VAR) found the node's
    bubblewrap lacks --json-status-fd, without it (`without_fd`), saying so in `status` and the
    rank's log. `status` is a shell word; the commands start after `exec`. The fd is opened by
    the subshell that execs bwrap, so no other process of the rank holds it."""
    no_status = shlex.quote(BWRAP_NO_STATUS.decode().rstrip("\n"))
    return (
        f'if [ -n "${NO_STATUS_FD_VAR}" ]; then '
        f"echo \"corral: $(hostname)'s bubblewrap has no --json-status-fd (${NO_STATUS_FD_VAR}): a "
        f"sandbox it refuses reads as the job's own failure\" >&2; "
        f"echo {no_status} >{status}; exec {without_fd}; fi; "
        f"exec {BWRAP_STATUS_FD}>{status}; exec {with_fd}"
    )


def rank_script(
    attempt_dir: Path,
    job_dir: Path,
    inst: InstanceLaunch,
    gpu_offset: int,
    account: UnixAccount,
    mounts: list[tuple[str, str, bool]],
    sandbox: NodeSandbox,
    cwd: str | None = None,
    home: str | None = None,
    secrets: tuple[SecretGrant, ...] = (),
    env_bin: str = "",
    env_paths: tuple[str, ...] = (),
    dir_checks: Sequence[tuple[str, str]] = (),
) -> str:
    """One instance: its environment, its command under bubblewrap, its exit code to a file.
    `env_bin`/`env_paths`: a catalogue environment's bin dir (first on PATH; the environment
    itself is one of `mounts`) and its interpreter's dirs, bound read-only at their paths.
    `dir_checks`: (dir, line): the line goes to the rank's log when the dir is there but closed
    to the job's account on this node (a builtin test each, as the account)."""
    has_files = any(g.file is not None for g in secrets)
    names, exports = _rank_exports(inst, account, home, env_bin, has_files)
    names += [g.env for g in secrets if g.env is not None] + list(RANK_SCRIPT_VARS)
    names = sorted(set(names))
    spec = SandboxSpec(
        command=inst.command,
        work_dir=str(job_dir / "work" / str(inst.rank)),
        uid=account.uid,
        etc_files={
            "/etc/passwd": str(job_dir / "etc" / "passwd"),
            "/etc/group": str(job_dir / "etc" / "group"),
        },
        mounts=mounts,
        env_paths=env_paths,
        cwd=cwd or SANDBOX_WORK_DIR,
        secrets_dir=str(job_dir / "secrets" / "files") if has_files else None,
        env_names=names,
    )
    head, tail = bwrap_argv_parts(sandbox.bwrap, None, spec)
    d, j, r = shlex.quote(str(attempt_dir)), shlex.quote(str(job_dir)), inst.rank
    bwrap = shlex.quote(sandbox.bwrap)
    sandboxed = " ".join(map(shlex.quote, head)) + ' "$@" ' + " ".join(map(shlex.quote, tail))
    launch = f"exec {sandboxed}"
    if sandbox.json_status:
        with_fd = " ".join(map(shlex.quote, with_status_fd(head, str(BWRAP_STATUS_FD))))
        with_fd += ' "$@" ' + " ".join(map(shlex.quote, tail))
        status = f'"$D/{BWRAP_STATUS_FILE.format(rank=r)}"'
        launch = status_fd_launch(status, with_fd, sandboxed)
    secret_env = _secret_env(secrets, inst.rank)
    cuda, gpus = (STASH_PREFIX + v for v in RANK_SCRIPT_VARS)
    return f"""#!/bin/sh
# rank {r}: role {inst.role} index {inst.index} on {inst.node}
# the script's own programs: the system's, not the job's (whose variables are all stashed)
PATH={DEFAULT_PATH}
export PATH
D={d}
J={j}
# node.sh's probe of this node's bubblewrap (node_status_fd_probe): its words if it lacks the option
{NO_STATUS_FD_VAR}="${{1:-}}"
cd "$J"
if [ ! -x {bwrap} ]; then
  echo "corral: bubblewrap is not installed at {sandbox.bwrap} on $(hostname):" \\
    "the job cannot be sandboxed" >&2
  echo 127 >"$J/rank-{r}.exit"; exit 127
fi
{_dir_checks(dir_checks)}{_gpu_binds(inst, gpu_offset, sandbox)}{exports}{secret_env}\
export {cuda}="$cvd" {gpus}="$mine"
descendants() {{
  local c
  # `command -p`: cat from the system's PATH, not the job's (which need not have it)
  for c in $(command -p cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; descendants "$c"; done
}}
child=""
term=""
# bwrap ignores TERM (a TERM that kills bwrap SIGKILLs the job): pass it to the job's own processes
forward() {{ for p in $(descendants "$child"); do kill -TERM "$p" 2>/dev/null; done; }}
trap 'term=1; if [ -n "$child" ]; then forward; fi' TERM INT
if [ -e "$D/{STOP_MARKER}" ]; then echo 143 >"$J/rank-{r}.exit"; exit 143; fi
# For `corral exec` (slurm/enter.py): the rank's environment (stashed, with the names to put
# back) and its bwrap's pid, while it runs
(umask 077; export -p; echo "{ENV_NAMES_VAR}='{" ".join(names)}'") >"$J/rank-{r}.env"
(trap '' TERM INT; umask 007; {launch}) &
child=$!
echo "$child" >"$J/rank-{r}.pid"
if [ -n "$term" ]; then kill -KILL "$child" 2>/dev/null; fi
wait "$child"; rc=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
# emptied, not removed: no `rm` to start (a process per job, and the job's own PATH need not have
# it); enter.py reads an empty pid file as "no running sandbox"
: >"$J/rank-{r}.pid"; : >"$J/rank-{r}.env"
echo "$rc" >"$J/rank-{r}.exit"
# a failed instance fails the gang: node.sh passes the TERM on to the instances on this node,
# and srun --kill-on-bad-exit to the other nodes
if [ "$rc" -ne 0 ]; then kill -TERM "$PPID" 2>/dev/null; fi
exit "$rc"
"""


def write_scripts(
    attempt_dir: Path,
    job_dir: Path,
    attempt: AttemptLaunch,
    instances: list[InstanceLaunch],
    account: UnixAccount,
    sandbox: NodeSandbox,
    dir_checks: Sequence[tuple[str, str]] = (),
) -> None:
    """The job dir with its scripts, /etc files and work dirs, all owned by the job's account
    and closed to everyone else (0700): other users' jobs cannot read a job's command or logs.
    `dir_checks`: (dir, line) that each rank prints to its log when the dir is closed to it."""
    shares = node_shares(instances)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(attempt_dir, 0o711)
    if job_dir.exists():
        # A relaunch (the first submission's answer was lost and Slurm has no such job): the old
        # dir is the job account's, which may have planted symlinks (etc -> /etc) for root to
        # write through. Start from a fresh root-owned dir, handed over only when complete.
        shutil.rmtree(job_dir)
    job_dir.mkdir(mode=0o700)
    write_etc(job_dir / "etc", account.name, account.uid, account.gid)
    mounts = [(m.source, m.target, m.read_only) for m in attempt.mounts]
    offsets: dict[int, int] = {}
    for share in shares:
        used = 0
        for rank in share.ranks:
            offsets[rank] = used
            used += len(instances[rank].gpus)
    if attempt.secrets:  # owned by the job's account like the rest; dirs 0500, files 0400
        owner = (account.uid, account.gid)
        write_secrets(str(job_dir / "secrets"), attempt.secrets, owner, owner)
    files = {
        "batch.sh": batch_script(
            attempt.attempt_id, attempt_dir, job_dir, len(shares), bool(attempt.secrets)
        ),
        "node.sh": node_script(attempt_dir, job_dir, shares, sandbox),
        **{
            f"rank-{i.rank}.sh": rank_script(
                attempt_dir,
                job_dir,
                i,
                offsets[i.rank],
                account,
                mounts,
                sandbox,
                cwd=attempt.cwd,
                home=attempt.home,
                secrets=attempt.secrets,
                env_bin=attempt.environment_bin,
                env_paths=attempt.environment_paths,
                dir_checks=dir_checks,
            )
            for i in instances
        },
    }
    for name, text in files.items():
        path = job_dir / name
        path.write_text(text)
        path.chmod(0o755)
    for i in instances:
        (job_dir / "work" / str(i.rank)).mkdir(parents=True, exist_ok=True)
        if sandbox.json_status:
            _new_bwrap_status(attempt_dir / BWRAP_STATUS_FILE.format(rank=i.rank), account)
    for dirpath, dirs, names in os.walk(job_dir):
        for name in [*dirs, *names]:
            os.lchown(os.path.join(dirpath, name), account.uid, account.gid)
    os.chown(job_dir, account.uid, account.gid)
    os.chmod(job_dir, 0o700)


def _new_bwrap_status(path: Path, account: UnixAccount) -> None:
    """A rank's BWRAP_STATUS_FILE as it stands before its bwrap starts: made afresh (a relaunch's
    old one goes), the job's account's, 0600."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, BWRAP_NOT_STARTED)
        os.fchown(fd, account.uid, account.gid)
    finally:
        os.close(fd)
