"""The bwrap command line, uid allocation and the generated /etc, without starting anything."""

from __future__ import annotations

from pathlib import Path

from corral.engine.gpus import DeviceNode
from corral.engine.isolation.root_env import restoring_argv
from corral.engine.isolation.sandbox import (
    SANDBOX_WORK_DIR,
    UID_BASE,
    SandboxSpec,
    allocate_uid,
    bwrap_argv,
    bwrap_argv_parts,
    write_etc,
    write_nsswitch,
)


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_argv_binds_only_what_the_job_gets(tmp_path: Path) -> None:
    etc = write_etc(tmp_path / "etc", "alice", 200123)
    spec = SandboxSpec(
        command="python train.py",
        work_dir=str(tmp_path / "work"),
        uid=200123,
        etc_files=etc,
        env_paths=[str(tmp_path)],
        mounts=[("/data/in", "/in", True), ("/data/out", "/out", False)],
        devices=[DeviceNode("/x/dev/nvidia2", "/dev/nvidia2", 195, 2)],
    )
    argv = bwrap_argv("/usr/bin/bwrap", "/usr/bin/setpriv", spec)
    assert argv[0] == "/usr/bin/bwrap"
    for flag in ("--unshare-pid", "--unshare-ipc", "--new-session", "--die-with-parent"):
        assert flag in argv
    assert "--unshare-user" not in argv  # see docs/isolation.md: it would leave the job host root
    assert ("/data/in", "/in") in pairs(argv, "--ro-bind")
    assert pairs(argv, "--bind") == [(str(tmp_path / "work"), SANDBOX_WORK_DIR), ("/data/out", "/out")]
    assert pairs(argv, "--dev-bind") == [("/x/dev/nvidia2", "/dev/nvidia2")]
    ro_sources = {s for s, _ in pairs(argv, "--ro-bind")}
    assert not {"/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc", "/"} & ro_sources
    assert (etc["/etc/passwd"], "/etc/passwd") in pairs(argv, "--ro-bind")
    tail = argv[argv.index("--") + 1 :]
    assert tail[0] == "/usr/bin/setpriv" and "--reuid=200123" in tail and "--no-new-privs" in tail
    assert tail[-3:] == ["/bin/sh", "-c", "python train.py"]


def test_parents_of_bound_paths_are_made_walkable(tmp_path: Path) -> None:
    env = tmp_path / "pyenv" / "versions" / "3.11"
    env.mkdir(parents=True)
    spec = SandboxSpec("true", str(tmp_path / "w"), 200001, {}, env_paths=[str(env)])
    argv = bwrap_argv("bwrap", "setpriv", spec)
    made = [argv[i + 3] for i, a in enumerate(argv) if a == "--perms" and argv[i + 2] == "--dir"]
    assert str(env.parent) in made and str(tmp_path) in made
    assert "/usr" not in made  # bound itself, never created


def test_uids_are_unique_while_held(tmp_path: Path) -> None:
    uids = {allocate_uid(tmp_path, f"{i}.1") for i in range(50)}
    assert len(uids) == 50 and min(uids) >= UID_BASE
    same = allocate_uid(tmp_path, "0.1")  # same attempt id, earlier uid still held
    assert same not in uids


def test_generated_passwd_names_the_user_and_is_safe(tmp_path: Path) -> None:
    files = write_etc(tmp_path, "alice", 200007)
    passwd = Path(files["/etc/passwd"]).read_text()
    assert "alice:x:200007:200007:" in passwd and ":x:0:0:" in passwd
    odd = write_etc(tmp_path / "odd", "Robert'); DROP", 200008)
    assert "job:x:200008" in Path(odd["/etc/passwd"]).read_text()  # unsafe names are replaced


def test_user_namespace_mode_for_jobs_already_running_as_their_user(tmp_path: Path) -> None:
    """setpriv=None (the Slurm engine): no uid switch inside, a user namespace that cannot nest,
    the same binds, and room between the two parts for devices known only on the node."""
    etc = write_etc(tmp_path / "etc", "alice", 1001, gid=2002)
    assert "alice:x:1001:2002:" in Path(etc["/etc/passwd"]).read_text()
    spec = SandboxSpec("echo hi", str(tmp_path / "w"), 1001, etc, mounts=[("/data", "/data", True)])
    head, tail = bwrap_argv_parts("/usr/bin/bwrap", None, spec)
    assert "--unshare-user" in head and "--disable-userns" in head
    assert pairs(head, "--bind") == [(str(tmp_path / "w"), SANDBOX_WORK_DIR)]
    assert ("/data", "/data") in pairs(head, "--ro-bind")
    assert tail[: tail.index("--") + 1] == ["--chdir", SANDBOX_WORK_DIR, "--"]
    assert tail[tail.index("--") + 1 :] == [
        "/usr/bin/env",
        "--default-signal=TERM,INT",
        "/bin/sh",
        "-c",
        "echo hi",
    ]
    assert not any("setpriv" in a for a in head + tail)
    # the job's variables, stashed by the rank script, are put back inside (review110 #2)
    named = SandboxSpec("echo hi", str(tmp_path / "w"), 1001, etc, env_names=["PATH", "LD_PRELOAD"])
    _, tail = bwrap_argv_parts("/usr/bin/bwrap", None, named)
    assert tail[tail.index("--") + 1 :] == [
        "/usr/bin/env",
        "--default-signal=TERM,INT",
        *restoring_argv(["LD_PRELOAD", "PATH"], ["/bin/sh", "-c", "echo hi"]),
    ]
    # the local engine's command line is the two parts of the setpriv mode, joined
    local = SandboxSpec("echo hi", str(tmp_path / "w"), 200001, etc)
    head, tail = bwrap_argv_parts("bwrap", "setpriv", local)
    assert bwrap_argv("bwrap", "setpriv", local) == [*head, *tail]


def test_the_jobs_nsswitch_answers_users_and_groups_from_files_and_replaces_the_hosts_bind(
    tmp_path: Path,
) -> None:
    """setpriv looks the job's uid up as a user name at every start: through the host's `passwd:
    files systemd` that loaded libnss_systemd for nothing (the sandbox's passwd is generated)."""
    host = tmp_path / "host-nsswitch.conf"
    host.write_text("# host\npasswd:  files systemd\ngroup: files sss\nshadow: files\nhosts: files dns\n")
    shared = tmp_path / "shared"
    etc = write_etc(tmp_path / "etc", "alice", 200123)
    etc.update(write_nsswitch(shared, str(host)))
    made = Path(etc["/etc/nsswitch.conf"])
    lines = made.read_text().splitlines()
    assert "hosts: files dns" in lines and "# host" in lines  # the rest is the host's
    for db in ("passwd", "group", "shadow", "gshadow"):
        assert [line for line in lines if line.split(":")[0].strip() == db] == [f"{db}: files"]
    assert made.stat().st_mode & 0o777 == 0o644
    argv = bwrap_argv("bwrap", "setpriv", SandboxSpec("true", str(tmp_path / "w"), 200123, etc))
    targets = [t for _, t in pairs(argv, "--ro-bind")]
    assert targets.count("/etc/nsswitch.conf") == 1  # the job's own, not the host's and then the job's
    assert (str(made), "/etc/nsswitch.conf") in pairs(argv, "--ro-bind")
    assert len(targets) == len(set(targets))
    # Made once per content: the next start reuses it; a changed host file gets a new one and
    # leaves the old (a running job binds it) as it was.
    assert write_nsswitch(shared, str(host)) == {"/etc/nsswitch.conf": str(made)}
    host.write_text("passwd: files ldap\nhosts: files\n")
    changed = Path(write_nsswitch(shared, str(host))["/etc/nsswitch.conf"])
    assert changed != made and "hosts: files dns" in made.read_text()
    assert changed.read_text().splitlines()[0] == "hosts: files"
    assert sorted(p.name for p in shared.iterdir()) == sorted([made.name, changed.name])  # no temp left
    missing = Path(write_nsswitch(shared, str(tmp_path / "missing"))["/etc/nsswitch.conf"])
    assert missing.read_text().splitlines()[0] == "passwd: files"


def test_the_jobs_nsswitch_takes_a_host_file_that_is_not_utf8_and_mends_a_damaged_copy(
    tmp_path: Path,
) -> None:
    """A host nsswitch.conf with a Latin-1 comment (glibc reads bytes) made every sandboxed launch
    fail when it was read as text; a kept copy that does not hold what it should (cut short by a
    power cut) is replaced, not bound as it is."""
    host = tmp_path / "host-nsswitch.conf"
    host.write_bytes(b"# g\xe9r\xe9 par l'admin\npasswd: files systemd\nhosts: files dns\n")
    shared = tmp_path / "shared"
    made = Path(write_nsswitch(shared, str(host))["/etc/nsswitch.conf"])
    assert made.read_bytes().splitlines()[:2] == [b"# g\xe9r\xe9 par l'admin", b"hosts: files dns"]
    made.write_bytes(b"")  # as a crash between the write and its flush could leave it
    assert write_nsswitch(shared, str(host)) == {"/etc/nsswitch.conf": str(made)}
    assert b"passwd: files\n" in made.read_bytes()
    assert [p.name for p in shared.iterdir()] == [made.name]  # no temp file left
