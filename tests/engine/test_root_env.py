"""isolation/root_env.py: the job's variables ride past the root programs stashed and come back
whole, in any number the spec allows (review105: one script holding every name could pass the
kernel's 128 KiB limit on one argument), and a name the shell could misread is refused."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from corral.engine.isolation.root_env import ROOT_ENV, STASH_PREFIX, restoring_argv, stash_env
from corral.spec import MAX_ENV_BYTES, MAX_ENV_VARS, SHELL_OWNED_ENV, SHELL_READONLY_ENV, check_env


def _restored(env: dict[str, str]) -> dict[str, str]:
    argv = restoring_argv(env, ["/usr/bin/env", "-0"])
    out = subprocess.run(argv, env=stash_env(env), capture_output=True, check=True).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if item and not item.startswith("PWD="))


def test_values_come_back_exactly_and_a_name_like_a_stash_is_kept_apart() -> None:
    env = {
        "PATH": "/opt/x/bin:/usr/bin:/bin",
        "ODD": " a  b'c\"$HOME`id`\\\n*; exit 3",
        "EMPTY": "",
        "LD_PRELOAD": "/home/u/lib.so",
        f"{STASH_PREFIX}ODD": "its own",
    }
    assert stash_env(env)["PATH"] == ROOT_ENV["PATH"]
    assert not any(k in stash_env(env) for k in ("ODD", "LD_PRELOAD", "EMPTY"))
    assert _restored(env) == env


def test_as_many_long_names_as_the_spec_allows_fit_on_the_command_line() -> None:
    width = MAX_ENV_BYTES // MAX_ENV_VARS - 2  # names fill the spec's byte budget
    env = {f"V{i:03d}_" + "N" * (width - 5): "1" for i in range(MAX_ENV_VARS)}
    assert sum(len(k) + len(v) for k, v in env.items()) <= MAX_ENV_BYTES
    check_env(env)  # the spec takes it ...
    assert _restored({**env, "PATH": "/usr/bin:/bin"}) == {**env, "PATH": "/usr/bin:/bin"}  # ... so must this


@pytest.mark.parametrize("name", ["A\n", "A B", "1A", "A-B", "Ä"])
def test_a_name_the_shell_could_misread_is_refused_by_the_spec_and_here(name: str) -> None:
    with pytest.raises(ValueError, match="env name"):
        check_env({name: "x"})  # the spec's check of a job's (and a task's) env
    with pytest.raises(ValueError, match="not a shell name"):
        restoring_argv([name], ["true"])


def _restored_by(shell: list[str], names: list[str]) -> subprocess.CompletedProcess[bytes]:
    argv = restoring_argv(names, ["/usr/bin/env", "-0"])
    assert argv[0] == "/bin/sh"
    env = stash_env(dict.fromkeys(names, "job's value"))
    return subprocess.run([*shell, *argv[1:]], env=env, capture_output=True)


# What the restore did with each name before it left a shell's own out (rough14 #4)
EXPORTED_AS_IS = 'eval "export $1=\\"\\$V\\""; exec /usr/bin/env -0'


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_the_names_the_spec_refuses_as_a_shells_own_are_those_bash_keeps() -> None:
    """/bin/sh is bash in posix mode on RHEL-family nodes: why check_env refuses these names."""
    for name in sorted(SHELL_OWNED_ENV):
        done = subprocess.run(
            ["bash", "--posix", "-c", EXPORTED_AS_IS, "sh", name],
            env={"V": "job's value"},
            capture_output=True,
        )
        if name in SHELL_READONLY_ENV:  # the restore stopped before the job's command
            assert done.returncode == 1 and b"readonly" in done.stderr, name
        else:  # the job ran without its value, or (a counter's, not a number) never ran
            assert f"{name}=job's value".encode() not in done.stdout.split(b"\0"), name
            assert done.returncode == 0 or b"arithmetic" in done.stderr, (name, done.stderr)
        with pytest.raises(ValueError, match="a shell's own variable"):
            check_env({name: "x"})
    # A name bash leaves alone comes back, and a stored spec may still name one of bash's.
    assert b"TRIAL=job's value" in _restored_by(["bash", "--posix"], ["TRIAL"]).stdout.split(b"\0")
    assert check_env({"UID": "7"}, stored=True) == {"UID": "7"}


@pytest.mark.parametrize("shell", [["bash", "--posix"], ["dash"]])
def test_a_stored_jobs_shell_owned_names_are_left_out_saying_so_and_its_others_come_back(
    shell: list[str],
) -> None:
    """rough14 #4: a job stored before specs were refused a shell's own names still ran, and
    where /bin/sh is bash the restore stopped before its command (exit 1, `UID: readonly`). Now
    every shell runs it without them, each named in a line of its log, their stashes gone."""
    if shutil.which(shell[0]) is None:
        pytest.skip(f"no {shell[0]} here")
    names = [*sorted(SHELL_OWNED_ENV), "TRIAL", "skipped"]
    done = _restored_by(shell, names)
    assert done.returncode == 0, done.stderr
    seen = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if item)
    assert seen["TRIAL"] == seen["skipped"] == "job's value"
    assert [name for name in SHELL_OWNED_ENV if seen.get(name) == "job's value"] == []
    assert [name for name in seen if name.startswith(STASH_PREFIX)] == []
    lines = done.stderr.decode().splitlines()
    assert len(lines) == len(SHELL_OWNED_ENV)
    for name in SHELL_OWNED_ENV:
        said = f"corral: {name} is not set from the job's spec: it is a shell's own variable, which bash"
        assert [line for line in lines if line.startswith(said)], name
