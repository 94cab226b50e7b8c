"""Turns one AttemptLaunch into one Slurm batch job: sbatch options plus three kinds of scripts
written into the attempt's directory (which must be on a filesystem the compute nodes share).

    batch.sh    the job script; on several nodes it runs `srun` with one task per node
    node.sh     per node: starts every instance Corral placed on this node ($SLURMD_NODENAME)
    rank-R.sh   per instance: its own environment and command; writes rank-R.log and rank-R.exit

One Slurm job for the whole attempt keeps the gang in Slurm's hands (all nodes allocated at once,
released together). Slurm requests are per node, so a node gets the sum of what Corral placed on
it; when nodes carry different loads every node is asked for the largest sum (see docs/slurm.md).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from corral.engine.base import AttemptLaunch, InstanceLaunch
from corral.engine.slurm.mapping import visible_devices

ATTEMPT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOB_NAME_PREFIX = "corral-"


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
        bad = [k for k in inst.env if not _ENV_NAME_RE.match(k)]
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
    attempt: AttemptLaunch, instances: list[InstanceLaunch], attempt_dir: Path, partition: str | None
) -> list[str]:
    shares = node_shares(instances)
    n = len(shares)
    args = [
        "--parsable",
        f"--job-name={job_name(attempt.attempt_id)}",
        # A requeued job would run a second time behind Corral's back (a node that "crashed" may
        # still be running it): with --no-requeue a node failure ends the job as NODE_FAIL.
        "--no-requeue",
        "--export=ALL",  # of the clean environment sbatch runs with (SlurmCli.submit_env)
        f"--chdir={attempt_dir}",
        f"--output={attempt_dir}/slurm-%j.out",
        f"--nodes={n}",
        f"--nodelist={','.join(s.node for s in shares)}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={max(1, math.ceil(max(s.cpus for s in shares)))}",
        f"--mem={max(1, max(s.memory_mib for s in shares))}M",
        f"--comment=corral job={attempt.job_id} attempt={attempt.attempt} user={attempt.user} "
        f"group={attempt.group}",
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
    args.append(str(attempt_dir / "batch.sh"))
    return args


def batch_script(attempt_id: str, attempt_dir: Path, n_nodes: int) -> str:
    d = shlex.quote(str(attempt_dir))
    if n_nodes == 1:
        run = f"exec /bin/sh {d}/node.sh"
    else:
        # --export=ALL: should the job have been submitted with --export=NONE, srun would inherit
        # SLURM_EXPORT_ENV=NONE and start the tasks with an empty environment (no PATH).
        run = (
            f"exec srun --export=ALL --nodes={n_nodes} --ntasks={n_nodes} --ntasks-per-node=1 "
            f"--kill-on-bad-exit=1 /bin/sh {d}/node.sh"
        )
    header = f"#!/bin/sh\n# Corral attempt {attempt_id} (generated)\n"
    return f"{header}PATH=${{PATH:-{DEFAULT_PATH}}}\nexport PATH\n{run}\n"


def node_script(attempt_dir: Path, shares: list[NodeShare]) -> str:
    """Starts the ranks placed on this node, forwards SIGTERM to them, exits with the first
    non-zero rank exit code."""
    d = shlex.quote(str(attempt_dir))
    cases = "".join(f"  {shlex.quote(s.node)}) ranks='{' '.join(map(str, s.ranks))}' ;;\n" for s in shares)
    return f"""#!/bin/sh
D={d}
node="${{SLURMD_NODENAME:-$(hostname)}}"
case "$node" in
{cases}  *) echo "corral: no instance of this attempt is placed on node $node" >&2; exit 90 ;;
esac
# a stop Corral sent before this script existed (Slurm says RUNNING a little before it starts it)
if [ -e "$D/stop" ]; then exit 143; fi
pids=""
for r in $ranks; do
  /bin/sh "$D/rank-$r.sh" >"$D/rank-$r.log" 2>&1 </dev/null &
  pids="$pids $!"
done
trap 'kill -TERM $pids 2>/dev/null' TERM INT
rc=0
for p in $pids; do
  wait "$p"; c=$?
  # wait returns early (status > 128) when a trapped signal arrives: wait again until it is gone
  while kill -0 "$p" 2>/dev/null; do wait "$p"; c=$?; done
  if [ "$c" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$c; fi
done
exit $rc
"""


def rank_script(attempt_dir: Path, inst: InstanceLaunch) -> str:
    """One instance: its environment, its command under /bin/sh -c, its exit code to a file."""
    env = dict(inst.env)
    env.setdefault("PATH", DEFAULT_PATH)
    if "CUDA_VISIBLE_DEVICES" in env:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(env["CUDA_VISIBLE_DEVICES"])
    else:
        # Corral placed these GPUs; co-located instances must not see each other's devices
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in inst.gpus)
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    d = shlex.quote(str(attempt_dir))
    return f"""#!/bin/sh
# rank {inst.rank}: role {inst.role} index {inst.index} on {inst.node}
# Slurm's own view of the GPUs it allocated on this node, kept for diagnosis
export CORRAL_SLURM_CUDA_VISIBLE_DEVICES="${{CUDA_VISIBLE_DEVICES:-}}"
{exports}cd {d}
child=""
term=""
trap 'term=1; if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi' TERM INT
if [ -e {d}/stop ]; then echo 143 >{d}/rank-{inst.rank}.exit; exit 143; fi
/bin/sh -c {shlex.quote(inst.command)} &
child=$!
if [ -n "$term" ]; then kill -TERM "$child" 2>/dev/null; fi
wait "$child"; rc=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
echo "$rc" >{d}/rank-{inst.rank}.exit
# a failed instance fails the gang: node.sh passes the TERM on to the instances on this node,
# and srun --kill-on-bad-exit to the other nodes
if [ "$rc" -ne 0 ]; then kill -TERM "$PPID" 2>/dev/null; fi
exit "$rc"
"""


def write_scripts(attempt_dir: Path, attempt_id: str, instances: list[InstanceLaunch]) -> None:
    shares = node_shares(instances)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "batch.sh": batch_script(attempt_id, attempt_dir, len(shares)),
        "node.sh": node_script(attempt_dir, shares),
        **{f"rank-{i.rank}.sh": rank_script(attempt_dir, i) for i in instances},
    }
    for name, text in files.items():
        path = attempt_dir / name
        path.write_text(text)
        path.chmod(0o755)
