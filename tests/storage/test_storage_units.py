"""The storage layer's parts without a server: the mount registry, names and targets, the code
store (chunks, resume, hash check, snapshots), ignore rules, stable ids that are never reused,
old spec mount forms and the sandbox's uid/groups/cwd arguments."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

from corral.db.models import Group, Membership, User
from corral.db.session import init_db, make_engine, make_session_factory
from corral.engine.isolation.sandbox import SandboxSpec, bwrap_argv
from corral.engine.log_links import link_rank_logs, prepare_log_dirs
from corral.engine.slurm.users import unix_group_fix
from corral.spec import JobSpecV1
from corral.storage import code
from corral.storage.identities import GroupGid, IdRange, ensure_ids, groups_with_gids
from corral.storage.ignore import CodeDirError, scan
from corral.storage.layout import (
    MARKER,
    StorageDir,
    StorageError,
    ensure_layout,
    layout_problems,
    prepare_dirs,
)
from corral.storage.mounts import (
    Bind,
    MountContext,
    MountRefused,
    MountRequest,
    default_binds,
    plain_path,
    register_source,
    resolve,
    seen_through,
)
from tests.support import dir_for_job_accounts, require_binary


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ensure_layout(tmp_path / "storage", "local")
    return tmp_path / "storage"


def ctx(root: Path, user: str = "alice", groups: tuple[str, ...] = ("vision",)) -> MountContext:
    return MountContext(user, frozenset(groups), root)


def test_layout_modes_marker_and_doctor_problems(root: Path) -> None:
    assert layout_problems(root, "local") == []
    assert (root / MARKER).read_text().strip() and oct((root / "home").stat().st_mode & 0o7777) == "0o711"
    os.chmod(root / "group", 0o777)
    assert layout_problems(root, "local") == [f"{root / 'group'} has mode 777, expected 711"]
    os.chmod(root / "group", 0o711)
    assert layout_problems(root, "slurm") == [f"{root} has mode 700, expected 755"]
    with pytest.raises(StorageError, match="engine 'k8s' is not one of: local, slurm"):
        ensure_layout(root, "k8s")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as another account")
def test_a_local_engines_catalogue_versions_are_closed_to_host_accounts_wherever_the_root_lies() -> None:
    """A dataset version is 0555/0444 (every job that may mount it binds it): on Slurm the job
    accounts bind as themselves, so every host account that can pass the root reads it; on the
    local engine only root reaches into the root (supervisors, bwrap), which is 0700 even outside
    $CORRAL_HOME. It was 0755 there too, and any host account read every private dataset."""
    setpriv = require_binary("setpriv")
    with dir_for_job_accounts("corral-root-", 0o755) as top:
        readable = {}
        for engine in ("local", "slurm"):
            root = top / engine
            ensure_layout(root, engine)
            version = root / "data" / "secret-ds" / "v1"
            version.mkdir(parents=True)
            (version / "rows.csv").write_text("private,rows\n")
            os.chmod(version / "rows.csv", 0o444)
            for d in (version, version.parent):
                os.chmod(d, 0o555)
            host_account = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
            got = subprocess.run([*host_account, "cat", str(version / "rows.csv")], capture_output=True)
            readable[engine] = got.returncode == 0 and got.stdout == b"private,rows\n"
        assert readable == {"local": False, "slurm": True}


def test_registry_serves_a_new_prefix_through_the_same_resolve(root: Path) -> None:
    def data(c: MountContext, req: MountRequest) -> Bind:
        name, _, version = req.ref.partition("@")
        return Bind(
            str(c.root / "data" / name), req.target or f"/data/{name}", True, f"data/{name}@{version or '3'}"
        )

    register_source("testdata", data)
    bind = resolve(ctx(root), "testdata/cifar")
    assert (bind.host_path, bind.target, bind.readonly, bind.source) == (
        str(root / "data" / "cifar"), "/data/cifar", True, "data/cifar@3",
    )  # fmt: skip


def test_group_rights_names_and_targets(root: Path) -> None:
    (root / "group/vision/a/b").mkdir(parents=True)
    assert resolve(ctx(root), "group/vision/a/b", "/mnt/x", False).host_path == str(root / "group/vision/a/b")
    with pytest.raises(MountRefused) as refused:
        resolve(ctx(root, "carol", ("nlp",)), "group/vision")
    assert refused.value.forbidden and "not a member of group 'vision'" in str(refused.value)
    for source in ("group/vision/../nlp", "group/vision//x", "group/a\x00b", "group/", "home/x", "nope"):
        with pytest.raises(MountRefused) as bad:
            resolve(ctx(root), source)
        assert not bad.value.forbidden and "mount source" in str(bad.value)
    for target in ("/proc/x", "/", "/a/../etc", "rel", "/code", "/tmp/x"):
        with pytest.raises(MountRefused, match="target"):
            resolve(ctx(root), "home", target)


def test_a_target_the_kernel_reads_otherwise_than_written_is_refused(root: Path) -> None:
    """'//usr/bin' is /usr/bin to the kernel, but posixpath.normpath keeps the '//' and no
    reserved prefix matched it: the user's home went over /usr/bin, and root ran their setpriv
    (review106 #1). Every such form is refused, so every later prefix test sees what bwrap binds."""
    (root / "group/vision/ck").mkdir(parents=True)
    for target in ("//usr/bin", "//etc", "/usr//bin", "//outputs/x", "//home/bob", "/mnt/./x", "//"):
        with pytest.raises(MountRefused, match="must be a plain absolute path"):
            resolve(ctx(root), "home", target, False)
    with pytest.raises(MountRefused, match="must be a plain absolute path"):
        resolve(ctx(root), "group/vision/ck", "//group/vision/ck")  # read-only, inside /group/vision
    forms = ("/mnt/x/", "/mnt/x//", "//mnt/x", "/mnt//x")
    assert [plain_path(t) for t in forms] == ["/mnt/x", "/mnt/x", "", ""]
    assert resolve(ctx(root), "home", "/mnt/x/", False).target == "/mnt/x"


def test_a_group_subdir_is_never_a_mount_point_inside_the_groups_own_bind(root: Path) -> None:
    """bwrap (root) would make that mount point through the group's dir, which any member may
    change meanwhile (a part of the path swapped for a symlink puts the bind anywhere in the
    sandbox): read-only there is refused, read-write is left to the group's bind."""
    (root / "group/vision/ck").mkdir(parents=True)
    with pytest.raises(MountRefused) as refused:
        resolve(ctx(root), "group/vision/ck")  # read-only at its default target, /group/vision/ck
    assert str(refused.value) == (
        "mount source 'group/vision/ck': read-only at '/group/vision/ck' it would lie inside "
        "/group/vision, which your jobs get read-write; give it a target of its own "
        "(e.g. target: /mnt/ck) or use mode rw"
    )
    ro = resolve(ctx(root), "group/vision/ck", "/mnt/ck")
    rw = resolve(ctx(root), "group/vision/ck", "", False)
    assert (ro.target, ro.readonly, rw.target, rw.readonly) == ("/mnt/ck", True, "/group/vision/ck", False)
    groups = default_binds(ctx(root), {"vision": 400001})
    assert seen_through(rw, groups) and not seen_through(ro, groups)
    assert not seen_through(rw, [])  # a build job gets no group binds: it is bound on its own


def test_code_chunks_resume_and_hash_check(root: Path) -> None:
    blob = os.urandom(300_000)
    sha = hashlib.sha256(blob).hexdigest()
    assert code.missing(root, [sha]) == [sha]
    assert code.receive_chunk(root, sha, 0, blob[:100_000], False, 10**9) == 100_000
    with pytest.raises(code.ChunkOutOfOrder) as gap:  # a client that lost its place is told where to resume
        code.receive_chunk(root, sha, 200_000, blob[200_000:], True, 10**9)
    assert gap.value.have == 100_000
    assert code.receive_chunk(root, sha, 100_000, blob[100_000:], True, 10**9) == 300_000
    assert code.missing(root, [sha]) == [] and code.blob_path(root, sha).read_bytes() == blob
    wrong = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(code.CodeError, match="hash to"):
        code.receive_chunk(root, wrong, 0, b"not other", True, 10**9)
    assert code.missing(root, [wrong]) == [wrong] and not list((root / "code" / "incoming").iterdir())
    with pytest.raises(code.CodeError, match="sha256"):
        code.missing(root, ["../../etc/passwd"])
    code.receive_chunk(root, wrong, 0, b"half", False, 10**9)  # an upload abandoned mid-way
    part = root / "code" / "incoming" / f"{wrong}.part"
    assert code.sweep_incoming(root, time.time()) == 0 and part.exists()
    os.utime(part, (time.time() - code.INCOMING_TTL_S - 1,) * 2)
    code.missing(root, [wrong])
    assert not part.exists()  # no space leaks from interrupted uploads


def test_snapshot_is_content_addressed_and_refuses_bad_paths(root: Path) -> None:
    sha = hashlib.sha256(b"print(1)\n").hexdigest()
    code.receive_chunk(root, sha, 0, b"print(1)\n", True, 10**9)
    manifest: dict[str, dict[str, object]] = {"a/train.py": {"sha256": sha, "executable": True}}
    first = code.make_snapshot(root, manifest, 10**9, 10)
    assert code.make_snapshot(root, dict(manifest), 10**9, 10) == first
    f = code.snapshot_dir(root, first) / "a" / "train.py"
    assert f.read_text() == "print(1)\n" and os.stat(f).st_mode & 0o777 == 0o555
    for bad in ("../x", "/etc/x", "a/./b", "a\x00b", "a/\x1bb", ""):
        with pytest.raises(code.CodeError, match="code path"):
            code.make_snapshot(root, {bad: {"sha256": sha, "executable": False}}, 10**9, 10)
    with pytest.raises(code.CodeError, match="not uploaded"):
        code.make_snapshot(root, {"b.py": {"sha256": "0" * 64, "executable": False}}, 10**9, 10)
    with pytest.raises(code.CodeError, match="9 bytes; at most 3"):
        code.make_snapshot(root, {"c.py": {"sha256": sha, "executable": False}}, 3, 10)


def test_ignore_rules(tmp_path: Path) -> None:
    (tmp_path / "src" / "build").mkdir(parents=True)
    for name in ("a.py", "a.pyc", "src/b.py", "src/build/out.o", "keep.log", "x.log", "src/.corralignore"):
        (tmp_path / name).write_text("b.py\n" if name.endswith("corralignore") else "x")
    (tmp_path / ".gitignore").write_text("*.pyc\n*.log\n!keep.log\nbuild/\n")
    assert [f.path for f in scan(tmp_path)] == [".gitignore", "a.py", "keep.log", "src/.corralignore"]
    (tmp_path / "link").symlink_to("/etc/passwd")
    with pytest.raises(CodeDirError, match="symlink"):
        scan(tmp_path)


def test_ids_are_stable_and_never_reused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    init_db(url)
    engine = make_engine(url)
    rng_u, rng_g = IdRange.parse("U", "300000-300002"), IdRange.parse("G", "400000-400009")
    with make_session_factory(engine)() as s:
        now = time.time()
        group = Group(name="vision", created_at=now)
        users = [User(name=n, created_at=now) for n in ("alice", "bob")]
        s.add_all([group, *users])
        s.flush()
        uids, gids = ensure_ids(s, users, [group], rng_u, rng_g)
        assert sorted(uids.values()) == [300000, 300001] and gids == {group.id: 400000}
        assert ensure_ids(s, users, [group], rng_u, rng_g) == (uids, gids)  # stable
        bob_id = users[1].id
        s.execute(delete(User).where(User.id == bob_id))
        again = User(id=bob_id, name="bob", created_at=now + 1)  # same name, even the same row id
        s.add(again)
        s.flush()
        new_uids, _ = ensure_ids(s, [again], [], rng_u, rng_g)
        assert new_uids[bob_id] == 300002  # a new uid: the old one stays the old bob's
        s.add(late := User(name="dave", created_at=now))
        s.flush()
        with pytest.raises(RuntimeError, match="no user id left"):
            ensure_ids(s, [late], [], rng_u, rng_g)
    engine.dispose()
    with pytest.raises(ValueError, match="LOW-HIGH"):
        IdRange.parse("CORRAL_UID_RANGE", "300000")


def test_groups_with_gids_are_those_given_one_with_their_active_members(tmp_path: Path) -> None:
    """What `corral doctor` checks on Slurm: each group that has a gid (not one without), by
    gid, with its active members (not a disabled one)."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    init_db(url)
    engine = make_engine(url)
    rng_u, rng_g = IdRange.parse("U", "300000-300009"), IdRange.parse("G", "400000-400009")
    with make_session_factory(engine)() as s:
        now = time.time()
        groups = [Group(name=n, created_at=now) for n in ("vision", "nlp", "no-gid-yet", "empty")]
        users = [User(name=n, created_at=now, active=n != "dave") for n in ("bob", "alice", "dave")]
        s.add_all([*groups, *users])
        s.flush()
        vision, nlp, later, empty = groups
        s.add_all(Membership(user_id=u.id, group_id=vision.id) for u in users)
        s.add_all(Membership(user_id=u.id, group_id=g.id) for u in users[:1] for g in (nlp, later))
        _, gids = ensure_ids(s, [], [nlp, vision, empty], rng_u, rng_g)
        assert groups_with_gids(s) == [
            GroupGid("nlp", gids[nlp.id], ("bob",)),
            GroupGid("vision", gids[vision.id], ("alice", "bob")),
            GroupGid("empty", gids[empty.id], ()),
        ]
    engine.dispose()


def test_the_fix_for_a_missing_unix_group_names_the_commands() -> None:
    """`corral doctor`'s and the job log's fix, from this host's group database (gid 0 is root's
    everywhere; 4,199,999 no host has): a name a Unix group of another gid holds gets corral-.
    (A Unix group named for its Corral group that lacks members: tests/slurm/test_slurm_storage.)"""
    free = 4_199_999
    assert unix_group_fix("vision", free, ["corralt-alice", "corralt-bob"]) == (
        f"no Unix group has gid {free}",
        f"groupadd -g {free} vision; usermod -aG vision corralt-alice; usermod -aG vision corralt-bob",
    )
    assert unix_group_fix("root", free, []) == (
        f"no Unix group has gid {free}",
        f"groupadd -g {free} corral-root",
    )


def test_a_gid_that_is_the_hosts_own_group_gets_no_command() -> None:
    """CORRAL_GID_RANGE overlapping the host's groups: Corral group vision's gid is Unix group
    root's (gid 0). Adding vision's members to root would give them root's files: no usermod,
    the overlap is named instead."""
    missing, fix = unix_group_fix("vision", 0, ["corralt-alice"])
    assert fix is None
    assert missing == (
        "gid 0 is Unix group root, not Corral group vision's (named vision, corral-vision or corral-g0): "
        "CORRAL_GID_RANGE overlaps this host's groups, and the group's dir is open to root's members"
    )


def test_the_group_a_fix_makes_has_a_name_groupadd_takes() -> None:
    """A Corral group's name may start with a digit, hold a "." or be 64 characters long, which
    groupadd refuses (its default NAME_REGEX, 32 characters): the fix then names the Unix group
    corral-<name>, or corral-g<gid> when that is no Unix name either."""
    free = 4_199_999
    assert unix_group_fix("9lab", free, ["corralt-alice"]) == (
        f"no Unix group has gid {free}",
        f"groupadd -g {free} corral-9lab; usermod -aG corral-9lab corralt-alice",
    )
    for name in ("ml.team", "x" * 33):  # corral-ml.team has a ".", corral-xxx... 40 characters
        assert unix_group_fix(name, free, []) == (
            f"no Unix group has gid {free}",
            f"groupadd -g {free} corral-g{free}",
        )
    assert unix_group_fix("z" * 32, free, []) == (
        f"no Unix group has gid {free}",
        f"groupadd -g {free} {'z' * 32}",
    )


def test_logs_source_is_the_users_own_logs_dir_and_read_only(root: Path) -> None:
    bind = resolve(ctx(root), "logs")
    assert (bind.host_path, bind.target, bind.readonly) == (str(root / "logs" / "alice"), "/logs", True)
    assert [(d.owner, d.gid, d.mode) for d in bind.prepare] == [("root", None, 0o750)]
    with pytest.raises(MountRefused, match="you have no job 42 with logs"):
        resolve(ctx(root, "bob"), "logs/42")
    (root / "logs" / "bob" / "42").mkdir(parents=True)
    one = resolve(ctx(root, "bob"), "logs/42")
    assert (one.host_path, one.target) == (str(root / "logs" / "bob" / "42"), "/logs/42")
    with pytest.raises(MountRefused, match="read-only"):
        resolve(ctx(root), "logs", "", False)
    for source in ("logs/x", "logs/../bob"):
        with pytest.raises(MountRefused, match="by its number"):
            resolve(ctx(root), source)


def test_rank_logs_are_hard_linked_for_the_owner_to_read(tmp_path: Path) -> None:
    adir, job_logs = tmp_path / "attempts", tmp_path / "logs" / "alice" / "7"
    adir.mkdir()
    (tmp_path / "logs").mkdir()
    for attempt in (1, 2):
        (adir / str(attempt)).mkdir()
        attempt_dir = prepare_log_dirs(job_logs, attempt, 300009, 300009)  # the private gid
        link_rank_logs(attempt_dir, job_logs, [0, 1], 300009, adir / str(attempt))
    for attempt in (1, 2):
        for rank in (0, 1):
            linked = job_logs / f"attempt-{attempt}" / f"rank-{rank}.log"
            assert linked.samefile(adir / str(attempt) / f"rank-{rank}.log")
            st = linked.stat()
            assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 300009, 0o640)
    assert (job_logs / "rank-1.log").samefile(adir / "2" / "rank-1.log")  # the latest attempt's
    (adir / "2" / "rank-0.log").open("a").write("step 1 loss 0.5\n")  # what the supervisor appends
    assert (job_logs / "rank-0.log").read_text() == "step 1 loss 0.5\n"
    st = job_logs.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 300009, 0o750)
    names = sorted(p.name for p in job_logs.iterdir())
    assert names == ["attempt-1", "attempt-2", "rank-0.log", "rank-1.log"]


def test_prepare_dirs_moves_a_dir_of_an_old_owner_aside(tmp_path: Path) -> None:
    home = tmp_path / "alice"
    home.mkdir()
    os.chown(home, 300007, 300007)
    prepare_dirs([StorageDir(str(home), "user", None, 0o700)], 300009, 300009)
    st = home.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (300009, 0o700)
    assert (tmp_path / ".retired-alice-300007").is_dir()
    grp = tmp_path / "g"
    prepare_dirs([StorageDir(str(grp), "root", 400001, 0o2770)], 300009, 300009)
    assert (grp.stat().st_gid, grp.stat().st_mode & 0o7777) == (400001, 0o2770)
    prepare_dirs([StorageDir(str(grp), "root", 400005, 0o2770)], 300009, 300009)  # group made anew
    assert grp.stat().st_gid == 400005 and (tmp_path / ".retired-g-400001").is_dir()


def test_old_spec_mount_forms_are_read_as_the_new() -> None:
    spec = JobSpecV1.model_validate(
        {
            "name": "j",
            "command": "true",
            "mounts": [{"dataset": "cifar"}, {"group_storage": "vision", "read_only": False}],
        }
    )
    assert [(m.source, m.mode) for m in spec.mounts] == [("data/cifar", "ro"), ("group/vision", "rw")]
    with pytest.raises(ValueError, match="source"):
        JobSpecV1.model_validate({"name": "j", "command": "true", "mounts": [{"target": "/x"}]})


def test_sandbox_runs_the_user_uid_with_group_gids_in_cwd() -> None:
    spec = SandboxSpec("true", "/w", 300001, {}, gids=(400000, 400003), cwd="/code")
    argv = bwrap_argv("bwrap", "setpriv", spec)
    assert "--groups=400000,400003" in argv and "--clear-groups" not in argv
    assert argv[argv.index("--chdir") + 1] == "/code"
    assert "--clear-groups" in bwrap_argv("bwrap", "setpriv", SandboxSpec("true", "/w", 200001, {}))


def test_doctor_checks_the_storage_root_and_id_ranges(tmp_path: Path) -> None:
    from corral.config import Settings
    from corral.ops.doctor import check_storage

    settings = Settings(home=tmp_path, storage_root=tmp_path / "st")
    assert check_storage(settings).status == "warn"  # not made yet: the server makes it
    ensure_layout(tmp_path / "st", "local")
    assert check_storage(settings).status == "ok"
    os.chmod(tmp_path / "st" / "outputs", 0o755)
    bad = check_storage(settings)
    assert bad.status == "fail" and "outputs has mode 755, expected 711" in bad.detail
    overlap = Settings(home=tmp_path, storage_root=tmp_path / "st", uid_range="300000-400000")
    assert check_storage(overlap).status == "fail" and "overlap" in check_storage(overlap).detail


def test_code_with_a_file_name_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    # Python holds such a name as lone surrogates: the scan took it, and `upload_code` then died
    # with a bare UnicodeEncodeError encoding the manifest, naming no file.
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "ok.py").write_text("print(1)")
    with open(bytes(tmp_path / "proj") + b"/bad-\xff.py", "wb") as f:
        f.write(b"x")
    with pytest.raises(CodeDirError, match=r"bad-\\udcff\.py.*not UTF-8"):
        scan(tmp_path / "proj")


def test_prepare_dirs_never_changes_a_host_path_a_symlink_put_in_its_place_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's subdir of a group's storage lies in a dir every member may rename in: another
    member's job can swap it for a symlink after prepare_dirs looked at it. The mode it then sets
    (as root) must not land on the path the symlink names (a host file, or `/`)."""
    victim = tmp_path / "victim"
    victim.write_text("the server's")
    os.chmod(victim, 0o600)
    sub = tmp_path / "vision" / "alice"
    sub.mkdir(parents=True)
    os.chmod(sub, 0o700)
    real_lstat = os.lstat

    def lstat_then_swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        st = real_lstat(path, *args, **kwargs)
        if str(path) == str(sub) and sub.is_dir() and not sub.is_symlink():
            sub.rename(sub.with_name("moved"))  # the other member's job, right after the look
            sub.symlink_to(victim)
        return st

    monkeypatch.setattr(os, "lstat", lstat_then_swap)
    with pytest.raises(StorageError, match="not a directory"):
        prepare_dirs([StorageDir(str(sub), "user", None, 0o2770)], os.geteuid(), os.getegid())
    monkeypatch.undo()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
