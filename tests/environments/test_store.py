"""The environments store on its own: a build's venv enters it read-only under its lock's key in
one rename, a second ingest of the same key keeps the first copy, and gc removes only copies no
version names (and leftovers of interrupted ingests), never young ones."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from corral.environments import store
from corral.environments.buildstep import cache_key


def fake_venv(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "tool").write_text("#!/bin/sh\n")
    os.chmod(path / "bin" / "tool", 0o755)
    (path / "lib.py").write_text("X = 1\n")
    os.symlink("/usr/bin/python3", path / "bin" / "python")
    return path


def test_ingest_is_read_only_and_first_copy_wins(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "env").mkdir(parents=True)
    key = cache_key("3.11.7", "b==2\na==1  # via x\n", "user-1")
    assert key == cache_key("3.11.7", "# header\na==1\nb==2\n", "user-1")  # pins, not the text
    assert key != cache_key("3.12.0", "a==1\nb==2\n", "user-1")
    assert key != cache_key("3.11.7", "a==1\nb==2\n", "user-2")  # nor another user's build
    assert store.ingest(root, key, fake_venv(tmp_path / "v1"))
    copy = store.copy_dir(root, key)
    assert not (tmp_path / "v1").exists()
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o555
    assert stat.S_IMODE(os.stat(copy / "lib.py").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(copy / "bin" / "tool").st_mode) == 0o555
    assert os.readlink(copy / "bin" / "python") == "/usr/bin/python3"  # links kept, not followed
    assert not store.ingest(root, key, fake_venv(tmp_path / "v2"))  # the earlier copy is shared
    assert not (tmp_path / "v2").exists() and (copy / "lib.py").read_text() == "X = 1\n"


def test_gc_removes_only_old_unreferenced_copies(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "env").mkdir(parents=True)
    keep, drop = cache_key("3", "a==1", "shared"), cache_key("3", "b==1", "shared")
    for key in (keep, drop):
        store.ingest(root, key, fake_venv(tmp_path / key))
    leftover = store.store_dir(root) / f"{store.INCOMING}{drop}-1-2"
    leftover.mkdir()
    now = time.time()
    assert store.gc(root, {keep}, min_age_s=600, now=now) == []  # all young
    removed = store.gc(root, {keep}, min_age_s=600, now=now + 3600)
    assert sorted(removed) == sorted([drop, leftover.name])
    assert store.copy_dir(root, keep).is_dir() and not store.copy_dir(root, drop).exists()


def test_ingest_leaves_a_file_hard_linked_into_the_venv_alone(tmp_path: Path) -> None:
    """The owner can enter the build job and hard-link into its venv a file they may write but do
    not own (another member's, in a group dir). Ingesting made that file root's and read-only:
    the same inode. The build copies every file, so such a link is dropped from the copy."""
    root = tmp_path / "root"
    (root / "env").mkdir(parents=True)
    venv = fake_venv(tmp_path / "v1")
    victim = tmp_path / "group" / "alice-notes.txt"
    victim.parent.mkdir()
    victim.write_text("alice's")
    os.chmod(victim, 0o660)
    if os.geteuid() == 0:
        os.chown(victim, 300_123, 300_123)  # alice's, not the server's
    os.link(victim, venv / "notes.txt")
    before = os.stat(victim)
    key = cache_key("3.11.7", "a==1\n", "user-1")
    assert store.ingest(root, key, venv)
    after = os.stat(victim)
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (
        before.st_uid,
        before.st_gid,
        0o660,
    )
    copy = store.copy_dir(root, key)
    assert not (copy / "notes.txt").exists() and (copy / "lib.py").read_text() == "X = 1\n"


def test_ingest_of_a_venv_swapped_for_a_symlink_touches_nothing_it_names(tmp_path: Path) -> None:
    """On Slurm the user's login shell can write their build's outputs dir and swap the venv for
    a symlink after the server looked at it: ingest walked where it pointed, making each file
    there root's and read-only."""
    root = tmp_path / "root"
    (root / "env").mkdir(parents=True)
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (elsewhere / "config").write_text("the host's")
    os.chmod(elsewhere / "config", 0o640)
    outputs = tmp_path / "outputs" / "7"
    outputs.mkdir(parents=True)
    (outputs / "venv").symlink_to(elsewhere)
    key = cache_key("3.11.7", "a==1\n", "user-1")
    with pytest.raises(NotADirectoryError):
        store.ingest(root, key, outputs / "venv")
    assert stat.S_IMODE(os.stat(elsewhere / "config").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(elsewhere).st_mode) != 0o555
    assert not store.copy_dir(root, key).exists() and os.listdir(store.store_dir(root)) == []
