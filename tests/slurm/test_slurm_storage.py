"""Group storage on the Slurm engine: the same binds the dispatch builds (corral.storage.mounts),
bound by the node's bubblewrap from the shared storage root; two members of a group share its dir,
each job runs as its user's own Unix account, a dataset, a `--code` snapshot and the outputs dir
are bound as on the local engine, and the engine checks that its nodes see the root. A group dir
closed to a job's account is said in the job's log and the server log, and `corral doctor` names
each Unix group missing and the commands that make it (which, run, put it right)."""

from __future__ import annotations

import grp
import hashlib
import logging
import os
import pwd
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from corral.config import Settings
from corral.datasets.store import Store, make_read_only
from corral.db.models import Group, Membership, User
from corral.db.session import init_db, make_engine, make_session_factory
from corral.db.storage_models import StorageIdentity
from corral.engine.base import AttemptPhase, MountSpec
from corral.engine.slurm import SlurmEngine
from corral.ops.doctor import check_slurm_groups
from corral.storage import code
from corral.storage.layout import StorageDir, ensure_layout, outputs_dir
from corral.storage.mounts import SANDBOX_CODE, SANDBOX_OUTPUTS, Bind, MountContext, default_binds
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, slurm_engine, wait_for

VISION = "corralt-vision"  # the site's Unix group for Corral group vision (docs/storage.md, "Slurm")


def gids_as_id_lists(account: str) -> str:
    """The account's gids as `id -G` in the job lists them: the primary first, then the others in
    the kernel's order (sorted), not /etc/group's, which depends on the order the groups were made."""
    primary = pwd.getpwnam(account).pw_gid
    return " ".join(str(g) for g in [primary, *sorted(set(os.getgrouplist(account, primary)) - {primary})])


def unix_group(members: list[str]) -> int:
    try:
        gid = grp.getgrnam(VISION).gr_gid
    except KeyError:
        subprocess.run(["groupadd", VISION], check=True, capture_output=True)
        gid = grp.getgrnam(VISION).gr_gid
    for account in members:
        subprocess.run(["gpasswd", "-a", account, VISION], check=True, capture_output=True)
    return gid


def test_members_share_the_group_dir_on_slurm(slurm_cluster: SlurmCluster) -> None:
    root = slurm_cluster.new_state_dir() / "storage"
    ensure_layout(root, "slurm")
    os.chmod(root.parent, 0o755)
    gid = unix_group([TEST_ACCOUNTS["alice"], TEST_ACCOUNTS["bob"]])
    engine: SlurmEngine = slurm_engine(slurm_cluster, storage_root=root)
    try:
        assert engine.check_storage() == []  # every node reads the root's marker

        def launch(aid: str, user: str, command: str) -> str:
            binds = default_binds(MountContext(user, frozenset({"vision"}), root), {"vision": gid})
            base = attempt(aid, instance("node1", command), user=user)
            mounts = tuple(MountSpec(b.host_path, b.target, b.readonly) for b in binds)
            dirs = tuple(d for b in binds for d in b.prepare)
            engine.launch(replace(base, mounts=mounts, storage_dirs=dirs, home=f"/home/{user}"))
            assert wait_for(engine, aid, FINISHED, timeout_s=30).phase is AttemptPhase.SUCCEEDED
            return engine.logs(aid, 0).data.decode(errors="replace")

        assert "corral:" not in launch(
            "701.1", "alice", "echo from-alice > /group/vision/x && echo home > $HOME/h"
        )
        assert (root / "group" / "vision" / "x").stat().st_gid == gid  # setgid dir: the group's file
        out = launch(
            "702.1", "bob", 'cat /group/vision/x; echo "ls=$(ls /home)"; cat /home/alice/h; echo rc=$?'
        )
        assert "from-alice" in out and "ls=bob\n" in out and "rc=1" in out, out  # alice's home: not there
        home = (root / "home" / "alice").stat()
        assert (home.st_uid, home.st_mode & 0o777) == (os.stat(root / "group" / "vision" / "x").st_uid, 0o700)
        # A dataset version as the data/ source binds it (corral.datasets.mounts): the version's
        # directory on the shared root, read-only at /data/<name>, readable by the job's account.
        store = Store(root)
        store.ensure()
        version = store.version_dir(1, 1)
        version.mkdir(parents=True)
        (version / "labels.txt").write_text("v1\n")
        make_read_only(version)
        os.chmod(version.parent, 0o755)
        # In the same job: a `--code` snapshot read-only at /code (the working dir) and the job's
        # outputs dir at /outputs, as corral.storage.plan binds them on either engine.
        script = b"cat /data/digits/labels.txt; echo ck > /outputs/model.ckpt; pwd\n"
        sha = hashlib.sha256(script).hexdigest()
        code.receive_chunk(root, sha, 0, script, True, 10**6)
        snapshot = code.make_snapshot(root, {"run.sh": {"sha256": sha, "executable": True}}, 10**6, 10)
        outputs = outputs_dir(root, 704)
        aid = "704.1"
        binds = default_binds(MountContext("alice", frozenset(), root), {})
        binds.append(Bind(str(code.snapshot_dir(root, snapshot)), SANDBOX_CODE, True, "code"))
        binds.append(Bind(str(outputs), SANDBOX_OUTPUTS, False, "outputs",
                          (StorageDir(str(outputs), "user", None, 0o700),)))  # fmt: skip
        mounts = (*(MountSpec(b.host_path, b.target, b.readonly) for b in binds),)
        data = MountSpec(str(version), "/data/digits", True)
        command = "sh ./run.sh; touch /data/digits/x 2>/dev/null || echo data-ro; "
        command += "touch x 2>/dev/null || echo code-ro"  # x: in the working dir, /code
        base = attempt(aid, instance("node1", command), user="alice")
        dirs = tuple(d for b in binds for d in b.prepare)
        with_code = replace(
            base, mounts=(*mounts, data), storage_dirs=dirs, home="/home/alice", cwd=SANDBOX_CODE
        )
        engine.launch(with_code)
        assert wait_for(engine, aid, FINISHED, timeout_s=30).phase is AttemptPhase.SUCCEEDED
        assert engine.logs(aid, 0).data.decode().split() == ["v1", "/code", "data-ro", "code-ro"]
        assert (outputs / "model.ckpt").read_text() == "ck\n"  # kept on the shared root
        assert os.stat(outputs / "model.ckpt").st_uid == home.st_uid  # written as alice's account
        # A root the job accounts cannot reach (below a 0700 dir, e.g. CORRAL_HOME): said clearly,
        # at start-up and at launch, instead of a bubblewrap error in the job's log.
        closed = slurm_cluster.new_state_dir()
        ensure_layout(closed / "storage", "slurm")
        os.chmod(closed, 0o700)
        hidden = slurm_engine(slurm_cluster, storage_root=closed / "storage")
        try:
            assert any("no o+x" in p for p in hidden.check_storage())
            dirs = default_binds(MountContext("alice", frozenset(), closed / "storage"), {})[0].prepare
            hidden.launch(replace(attempt("703.1", instance("node1", "true")), storage_dirs=dirs))
            status = wait_for(hidden, "703.1", FINISHED)
            assert status.phase is AttemptPhase.FAILED and "no o+x" in status.message, status
        finally:
            hidden.close()
    finally:
        engine.close()


def test_a_group_dir_the_account_cannot_enter_is_said_in_the_server_log(
    slurm_cluster: SlurmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A Corral group whose gid no Unix group of the job's account has (the site's admin step of
    docs/storage.md, "Identities", not done): the job still runs and gets "Permission denied" at
    /group/<g>, and the server log says why and what to do, once per account and gid (nothing
    said it anywhere)."""
    root = slurm_cluster.new_state_dir() / "storage"
    ensure_layout(root, "slurm")
    os.chmod(root.parent, 0o755)
    gid = 4_100_000 + os.getpid() % 1000  # far above every Unix group of the machine
    account = TEST_ACCOUNTS["alice"]
    assert gid not in os.getgrouplist(account, 0)
    engine: SlurmEngine = slurm_engine(slurm_cluster, storage_root=root)
    try:
        binds = default_binds(MountContext("alice", frozenset({"physics"}), root), {"physics": gid})
        base = attempt("705.1", instance("node1", "ls /group/physics"), user="alice")
        mounts = tuple(MountSpec(b.host_path, b.target, b.readonly) for b in binds)
        launch = replace(base, mounts=mounts, storage_dirs=tuple(d for b in binds for d in b.prepare))
        with caplog.at_level(logging.WARNING, "corral.engine.slurm.engine"):
            engine.launch(launch)
            engine.launch(replace(launch, attempt_id="705.2"))
        status = wait_for(engine, "705.1", FINISHED, timeout_s=30)
        assert status.phase is AttemptPhase.FAILED, status
        log = engine.logs("705.1", 0).data.decode()
        assert "Permission denied" in log
        # the job's own log says why, first, and what an admin does (it said nothing before)
        own_gids = gids_as_id_lists(account)
        assert log.splitlines()[0] == (
            f"corral: /group/physics is closed to this job (Permission denied): its account {account} "
            f"is not in gid {gid}, which owns it; no Unix group has gid {gid}; an admin gives it on every "
            f"node: groupadd -g {gid} physics; usermod -aG physics {account} (`corral doctor` lists all)"
            f"; seen on node1: owner:gid mode 0:{gid} 2770, the job's gids {own_gids}"
        ), log
        said = [r.getMessage() for r in caplog.records if f"not in gid {gid}" in r.getMessage()]
        assert said == [
            f"slurm engine: account {account} is not in gid {gid}, which owns {root / 'group' / 'physics'} "
            "(/group/physics in its jobs): its jobs get 'Permission denied' there; give gid "
            f"{gid} to a Unix group of the group members' accounts on every node (docs/storage.md, "
            "Identities; `corral storage ids` lists the gids)"
        ], said  # once for both launches
    finally:
        engine.close()


def test_a_group_dir_closed_on_the_node_alone_says_what_the_node_saw(slurm_cluster: SlurmCluster) -> None:
    """The account is in the dir's gid as the server's host sees it, yet the dir is closed on
    the node (here: its mode lets no group in, as storage mapping ownership otherwise would): the
    job's log says it is closed on this node, not that the account lacks the gid, and shows the
    owner, gid and mode and the job's gids the node gave."""
    root = slurm_cluster.new_state_dir() / "storage"
    ensure_layout(root, "slurm")
    os.chmod(root.parent, 0o755)
    account = TEST_ACCOUNTS["alice"]
    gid = unix_group([account])
    engine: SlurmEngine = slurm_engine(slurm_cluster, storage_root=root)
    try:
        binds = default_binds(MountContext("alice", frozenset({"vision"}), root), {"vision": gid})
        base = attempt("706.1", instance("node1", "ls /group/vision"), user="alice")
        mounts = tuple(MountSpec(b.host_path, b.target, b.readonly) for b in binds)
        group_dir = str(root / "group" / "vision")
        dirs = tuple(
            replace(d, mode=0o700) if d.path == group_dir else d for b in binds for d in b.prepare
        )  # root's alone
        engine.launch(replace(base, mounts=mounts, storage_dirs=dirs))
        assert wait_for(engine, "706.1", FINISHED, timeout_s=30).phase is AttemptPhase.FAILED
        log = engine.logs("706.1", 0).data.decode()
        own_gids = gids_as_id_lists(account)
        assert log.splitlines()[0] == (
            "corral: /group/vision is closed to this job on this node (Permission denied), though on "
            f"the Corral server's host its account {account} is in gid {gid}, which owns it: this "
            "node's Unix groups differ from the host's, or its storage shows the dir with another "
            f"owner, gid or mode (e.g. NFS root_squash or idmap); seen on node1: owner:gid mode "
            f"0:{gid} 700, the job's gids {own_gids}"
        ), log
    finally:
        engine.close()


def corral_groups(url: str, groups: dict[str, tuple[int, list[str]]]) -> None:
    """Corral groups {name: (gid, member user names)} in a fresh database, the gids as given."""
    init_db(url)
    engine = make_engine(url)
    now = time.time()
    with make_session_factory(engine)() as s:
        users = {
            n: User(name=n, created_at=now) for n in sorted({m for _, ms in groups.values() for m in ms})
        }
        s.add_all(users.values())
        for name, (gid, members) in groups.items():
            group = Group(name=name, created_at=now)
            s.add(group)
            s.flush()
            s.add_all(Membership(user_id=users[m].id, group_id=group.id) for m in members)
            s.add(StorageIdentity(kind="group", subject_id=group.id, subject_created_at=now,
                                  subject_name=name, number=gid, created_at=now))  # fmt: skip
        s.commit()
    engine.dispose()


def test_doctor_names_each_missing_unix_group_and_the_commands_that_fix_it(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three Corral groups with gids: corralt-vision, whose gid is the Unix group of that name
    listing both accounts (fine); corralt-physics, whose gid no Unix group has; corralt-nlp, whose
    Unix group lacks bob's account. Doctor names the two and the commands; run as printed, they
    put it right."""
    alice, bob = TEST_ACCOUNTS["alice"], TEST_ACCOUNTS["bob"]
    vision = unix_group([alice, bob])
    physics = 4_200_000 + os.getpid() % 1000  # far above every Unix group of the machine
    nlp_name = "corralt-nlp"
    subprocess.run(["groupdel", nlp_name], capture_output=True)
    subprocess.run(["groupadd", nlp_name], check=True, capture_output=True)
    nlp = grp.getgrnam(nlp_name).gr_gid
    subprocess.run(["gpasswd", "-a", alice, nlp_name], check=True, capture_output=True)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    corral_groups(
        url,
        {
            VISION: (vision, ["alice", "bob"]),
            "corralt-physics": (physics, ["alice", "carol"]),  # carol: in no user map, not checked
            "corralt-nlp": (nlp, ["alice", "bob"]),
        },
    )
    settings = Settings(engine="slurm", home=tmp_path / "home", database_url=url)
    monkeypatch.setenv("CORRAL_SLURM_USER_MAP", str(slurm_cluster.user_map))
    try:
        assert check_slurm_groups(Settings(engine="local", home=tmp_path / "home")).status == "skip"
        no_db = f"sqlite:///{tmp_path / 'no.db'}"
        none = Settings(engine="slurm", home=tmp_path / "home", database_url=no_db)
        assert check_slurm_groups(none).detail == "no database yet: no Corral group has a gid"
        assert not (tmp_path / "no.db").exists()  # checking created nothing
        found = check_slurm_groups(settings)
        gaps = {
            nlp: f"group corralt-nlp (gid {nlp}): Unix group {nlp_name} (gid {nlp}) does not list {bob}",
            physics: f"group corralt-physics (gid {physics}): no Unix group has gid {physics}",
        }
        fixes = {
            nlp: f"usermod -aG {nlp_name} {bob}",
            physics: f"groupadd -g {physics} corralt-physics; usermod -aG corralt-physics {alice}",
        }
        in_order = sorted(gaps)  # by gid
        carol = "; not checked, no Unix account (refused at launch): carol"
        assert (found.status, found.detail, found.fix) == (
            "warn",
            "; ".join(gaps[g] for g in in_order)
            + ": their jobs get 'Permission denied' in /group/<name>"
            + carol,
            "; ".join(fixes[g] for g in in_order) + " (as root, here and on every node; or the same in LDAP)",
        ), found
        assert found.fix is not None
        commands = found.fix.split(" (as root")[0]
        subprocess.run(["/bin/sh", "-c", commands], check=True, capture_output=True)
        fixed = check_slurm_groups(settings)
        assert (fixed.status, fixed.detail) == (
            "ok",
            "3 groups: each gid is a Unix group of its members' accounts" + carol,
        ), fixed
        # without a user map no member's account is checked: not "ok", and said why
        monkeypatch.delenv("CORRAL_SLURM_USER_MAP")
        unset = check_slurm_groups(settings)
        assert (unset.status, unset.detail) == (
            "skip",
            "3 groups: each gid is a Unix group; members' accounts not checked: "
            "CORRAL_SLURM_USER_MAP is unset (see slurm users)",
        ), unset
        monkeypatch.setenv("CORRAL_SLURM_USER_MAP", str(tmp_path / "no-such-map.yaml"))
        unreadable = check_slurm_groups(settings)
        assert (unreadable.status, unreadable.detail) == (
            "skip",
            "3 groups: each gid is a Unix group; members' accounts not checked: "
            "CORRAL_SLURM_USER_MAP cannot be read (see slurm users)",
        ), unreadable
    finally:
        for name in ("corralt-physics", nlp_name):
            subprocess.run(["groupdel", name], capture_output=True)


def test_doctor_refuses_a_gid_that_is_the_hosts_own_group(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CORRAL_GID_RANGE overlapping the host's groups: Corral group vision's gid is a Unix group
    named otherwise (here corralt-vision), even one that lists the members' accounts. Doctor
    names the overlap and gives no usermod: that would add vision's members to another's group."""
    theirs = unix_group([TEST_ACCOUNTS["alice"], TEST_ACCOUNTS["bob"]])
    url = f"sqlite:///{tmp_path / 'c.db'}"
    corral_groups(url, {"vision": (theirs, ["alice", "bob"])})
    settings = Settings(engine="slurm", home=tmp_path / "home", database_url=url)
    monkeypatch.setenv("CORRAL_SLURM_USER_MAP", str(slurm_cluster.user_map))
    found = check_slurm_groups(settings)
    assert (found.status, found.detail) == (
        "fail",
        f"group vision (gid {theirs}): gid {theirs} is Unix group {VISION}, not Corral group vision's "
        f"(named vision, corral-vision or corral-g{theirs}): CORRAL_GID_RANGE overlaps this host's "
        f"groups, and the group's dir is open to {VISION}'s members",
    ), found
    assert found.fix is not None and "usermod" not in found.fix and "groupadd" not in found.fix
