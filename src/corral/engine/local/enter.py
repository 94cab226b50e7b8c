"""Entering a running instance's sandbox on the local engine (`LocalEngine.exec_command`).

The command it builds, run on the host as root (the server), does in order:
1. `/bin/sh -c 'echo $$ > <cgroup>/cgroup.procs ...; exec "$@"'`: moves itself into every
   hierarchy of the instance's cgroup, so the new process counts against the job's memory, CPU
   and pids limits, is held to its device rules, and is killed with the attempt (the supervisor
   kills the whole cgroup at the end).
2. `nsenter --target <sandbox init> --mount --pid --ipc --net --root --wd`: joins the namespaces
   of the process bwrap made pid 1 of the sandbox, so it sees the sandbox's mounts (and only the
   job's GPU device nodes), its pids, and the job's own network namespace (127.0.0.1 is the
   job's loopback). `--pid` makes nsenter fork: the child is in the sandbox's pid namespace and
   dies with it; nsenter waits and passes the exit status on.
3. The job's own `setpriv` line (read back from the instance's argv): the job's uid and groups,
   no capabilities, no_new_privs.
4. A shell, now as the job's uid, that puts the job's environment back (below).
5. `env --chdir=<job cwd> -- argv`: the job's working dir, then the command itself.
The environment is the instance's own (CUDA_VISIBLE_DEVICES, PATH, HOME, CORRAL_*, its secrets),
stashed (isolation/root_env.py) while steps 1-3 run as root, so that none of it (LD_PRELOAD, a
LANG naming a file) reaches a root program.

Without a sandbox (isolation switched off) only steps 1 and 4 apply, as root like the job.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from corral.engine.base import ExecCommand, ExecRefused
from corral.engine.isolation import secret_files
from corral.engine.isolation.root_env import restoring_argv, stash_env, without_shell_owned
from corral.engine.local.files import RUNNING_STATE, AttemptSpec, InstanceSpec, read_file
from corral.engine.local.supervisor import children

NSENTER = "/usr/bin/nsenter"
ENV = "/usr/bin/env"


def enter_argv(adir: Path, spec: AttemptSpec, rank: int, argv: Sequence[str]) -> ExecCommand:
    """The ExecCommand for rank `rank` of the running attempt in `adir` (see the module doc)."""
    if not argv:
        raise ExecRefused("no command given: name the program to run inside the job")
    inst = next((i for i in spec["instances"] if i["rank"] == rank), None)
    if inst is None:
        ranks = len(spec["instances"])
        raise ExecRefused(f"attempt {spec['attempt_id']} has no rank {rank} (ranks 0..{ranks - 1})")
    env = dict(inst["env"])
    secret_env = inst.get("secret_env")
    if secret_env:
        env.update(secret_files.read_env_secrets(secret_env))
    inner = [ENV, f"--chdir={_job_cwd(inst)}", "--", *argv]
    said = ""
    if not inst["sandboxed"]:  # no restoring shell: the shell's own names left out as it does
        env, notes = without_shell_owned(env)
        said = "".join(f"echo {shlex.quote(note)} >&2; " for note in notes)
    else:
        init = _sandbox_init(adir, spec["attempt_id"], rank)
        nsenter = [NSENTER, f"--target={init}", "--mount", "--pid", "--ipc", "--net", "--root", "--wd"]
        # sh, nsenter, setpriv (and the gateway's setsid) run as root: the job's environment
        # rides along stashed and comes back once setpriv has dropped root (isolation/root_env.py)
        inner = [*nsenter, "--", *_setpriv_part(inst), *restoring_argv(env, inner)]
        env = stash_env(env)
    cgroup = inst["cgroup"]
    dirs = cgroup["dirs"] if cgroup else []
    joins = "".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))}; " for d in dirs)
    argv_out = ["/bin/sh", "-c", f'set -e; {said}{joins}exec "$@"', "corral-exec", *inner]
    return ExecCommand(argv=tuple(argv_out), env=env, cwd="/")


def _job_cwd(inst: InstanceSpec) -> str:
    """The job's working dir as its own processes see it: bwrap's --chdir in the sandbox, the
    host work dir without one."""
    argv = inst["argv"]
    if inst["sandboxed"] and "--chdir" in argv:
        return argv[argv.index("--chdir") + 1]
    return inst["cwd"] if not inst["sandboxed"] else "/"


def _setpriv_part(inst: InstanceSpec) -> list[str]:
    """The job's own privilege drop: from setpriv up to its `/bin/sh -c <command>` tail."""
    argv = inst["argv"]
    try:
        start = next(i for i, a in enumerate(argv) if os.path.basename(a) == "setpriv")
    except StopIteration:
        raise ExecRefused("this attempt's sandbox has no setpriv step: cannot enter it as the job's user")
    # the tail is the restoring shell (root_env.restoring_argv) and then /bin/sh -c <command>
    return argv[start : argv.index("/bin/sh", start)]


def _sandbox_init(adir: Path, attempt_id: str, rank: int) -> int:
    """pid (host) of the sandbox's pid 1: the child bwrap cloned into the new namespaces."""
    state = read_file(adir / "state.json", RUNNING_STATE)
    bwrap_pid = state["pids"].get(str(rank)) if state else None
    inits = children(bwrap_pid) if bwrap_pid else []
    if not inits:
        raise ExecRefused(f"attempt {attempt_id} rank {rank}: its sandbox is not up (starting or ending)")
    return inits[0]
