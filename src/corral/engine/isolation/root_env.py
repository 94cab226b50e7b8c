"""Keeping a job's environment away from the root programs that build its sandbox.

On the local engine the sandbox is set up by programs that run as root on the host: bwrap and
setpriv at every start, and `/bin/sh`, nsenter and setsid at every `corral exec` or SSH entry.
The job's environment is the user's to choose, and several variables make a root program load
or read what they name: `LD_PRELOAD`/`LD_LIBRARY_PATH`/`LD_AUDIT` (the dynamic loader runs the
user's library in the root process), `GCONV_PATH`, `LOCPATH` and a `LANG` that is a path
(glibc's locale and iconv loaders), `TZ` naming a file. A deny-list of such names would have to
know every one of them for every program on the way; instead none of the job's variables reach
those programs:

- they run with ROOT_ENV (a fixed PATH and nothing else of the user's), each of the job's
  variables riding along under STASH_PREFIX + its name (inert to every program: no loader or
  libc reads such a name);
- the first process that runs as the job's uid, after setpriv has dropped root (no capabilities,
  no_new_privs), puts them back under their own names (`restoring_argv`) and execs the job.

The values stay in the environment, never on a command line (host users can read every process's
command line; secrets are among the values). On Slurm the sandbox is built by the job's own
account (`setpriv=None`), no privilege, but its rank script stashes the job's variables too
(slurm/scripts.py): code a job's LD_PRELOAD ran in bwrap, outside the sandbox, could write the
bwrap status file there."""

from __future__ import annotations

# Imported by the supervisor, which starts for every job: no `re` (it imports enum) nor typing
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

STASH_PREFIX = "CORRAL_JOB_ENV_"
# Variables bash keeps as its own. The job's variables are put back by a shell as its first
# process (`restoring_argv`, /bin/sh: bash on RHEL-family nodes) and most jobs' commands run in
# one: bash will not set the read-only ones (in posix mode the restore exits 1 before the job's
# command) and drops or replaces the others with its own values (its counters HISTCMD, OPTIND and
# SRANDOM stop the restore too at a value not a number; bash 5.2, tests/engine/test_root_env.py;
# dash keeps them all). The job would never get the value it asked for, so a new spec may not
# name them (corral.spec); a job stored before that rule runs without them, on every node alike,
# its log saying which were not set and why (RESTORE_SCRIPT), rather than ending at its start:
# the user's command gets what bash would have left it, and a job they were told was accepted
# (queued, requeued after a preemption, a template's next run) is not failed for a name they
# cannot change in it.
SHELL_READONLY_ENV = frozenset({"UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASH_VERSINFO"})
SHELL_OWNED_ENV = SHELL_READONLY_ENV | frozenset(
    {"GROUPS", "FUNCNAME", "DIRSTACK", "RANDOM", "SRANDOM", "SECONDS", "LINENO", "BASHPID"}
    | {"EPOCHSECONDS", "EPOCHREALTIME", "HISTCMD", "OPTIND", "SHLVL", "_", "BASH_SUBSHELL"}
    | {"BASH_COMMAND", "BASH_ARGV", "BASH_ARGC", "BASH_LINENO", "BASH_SOURCE", "BASH_ALIASES"}
    | {"BASH_CMDS"}
)
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_ENV = {"PATH": ROOT_PATH}
RESTORE_ARGV0 = "corral-env"  # $0 of the restoring shell: what `ps` shows for it


def stash_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of the root programs on the way into a sandbox: ROOT_ENV, and each of the
    job's variables under STASH_PREFIX (put back by `restoring_argv`'s shell)."""
    return {**ROOT_ENV, **{STASH_PREFIX + name: value for name, value in env.items()}}


def restoring_argv(names: Iterable[str], argv: Sequence[str]) -> list[str]:
    """`argv` run by a shell that first moves each stashed variable of `names` back to its own
    name. Each name is an argument of its own (a job may have 64 KiB of names: one script
    holding them all could pass the kernel's 128 KiB limit on a single argument), then `--`, then
    `argv`. Shorter names go first: a job variable that is itself named STASH_PREFIX + N is put
    back after N, whose stash it would overwrite, and its own stash (a longer name) is still
    there. Only names go on the command line, never values; `eval` sees only names checked here."""
    ordered = sorted(set(names), key=lambda n: (len(n), n))
    for name in ordered:
        if not (name.isascii() and name.isidentifier()):  # the spec allows no other: shell code
            raise ValueError(f"environment variable name {name!r} is not a shell name")
    return ["/bin/sh", "-c", RESTORE_SCRIPT, RESTORE_ARGV0, *ordered, "--", *argv]


# For each name N up to `--`: eval runs `export N="${CORRAL_JOB_ENV_N}"; unset CORRAL_JOB_ENV_N`;
# but a shell's own N (SHELL_OWNED_ENV, named by a job stored before specs were refused them) is
# only unstashed, with a line to stderr (the job's log, or `corral exec`'s) saying it is not set
# and why. No variable of the script's own: any name may be one of the job's.
NOT_SET_NOTE = (
    "corral: $1 is not set from the job's spec: it is a shell's own variable, which bash keeps "
    "read-only or sets itself (it would stop before the job's command, or not give it the value); "
    "a job may no longer name it: rename it in the spec"
)


def without_shell_owned(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """`env` without the shell's own names (SHELL_OWNED_ENV), and for each the line RESTORE_SCRIPT
    writes of it, in its order: a job started or entered without a sandbox has no restoring shell,
    and its /bin/sh would get them as they are (bash honours a SHELLOPTS)."""
    owned = sorted((name for name in env if name in SHELL_OWNED_ENV), key=lambda n: (len(n), n))
    kept = {name: value for name, value in env.items() if name not in SHELL_OWNED_ENV}
    return kept, [NOT_SET_NOTE.replace("$1", name) for name in owned]


RESTORE_SCRIPT = (
    'while [ "$1" != -- ]; do case $1 in '
    + "|".join(sorted(SHELL_OWNED_ENV))
    + ") unset "
    + STASH_PREFIX
    + '$1; echo "'
    + NOT_SET_NOTE
    + '" >&2;; '
    + r'*) eval "export $1=\"\${'
    + STASH_PREFIX
    + r"$1}\"; unset "
    + STASH_PREFIX
    + r'$1";; esac; shift; '
    + 'done; shift; exec "$@"'
)
