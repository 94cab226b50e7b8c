"""Mount sources opened without following symlinks and handed to bwrap as fds
(corral.engine.isolation.bind_sources), without starting a sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.engine.isolation.bind_sources import (
    BindSourceRefused,
    fd_bind_indexes,
    open_dir_nofollow,
    open_sources,
)
from corral.engine.isolation.sandbox import SandboxSpec, bwrap_argv

SRC = str(Path(__file__).resolve().parents[2] / "src")


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def test_a_dir_is_opened_as_itself(tmp_path: Path) -> None:
    sub = tmp_path / "group" / "sub"
    sub.mkdir(parents=True)
    fd = open_dir_nofollow(str(sub))
    try:
        assert (os.fstat(fd).st_ino, os.fstat(fd).st_dev) == (sub.stat().st_ino, sub.stat().st_dev)
        assert os.get_inheritable(fd) is False  # nothing else the supervisor starts gets it
    finally:
        os.close(fd)


def test_a_symlink_anywhere_on_the_way_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "last").symlink_to(tmp_path / "real" / "sub")
    before = open_fds()
    for path, named in ((tmp_path / "link" / "sub", tmp_path / "link"), (tmp_path / "real" / "last", None)):
        with pytest.raises(BindSourceRefused) as refused:
            open_dir_nofollow(str(path))
        assert str(named or path) + " is a symlink" in str(refused.value)
    assert open_fds() == before


def test_a_file_a_missing_dir_and_bad_paths_are_refused_saying_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cases = {
        str(tmp_path / "file"): f"{tmp_path / 'file'} is not a directory",
        str(tmp_path / "gone" / "sub"): f"{tmp_path / 'gone'} does not exist",
        "relative/path": "is not an absolute path",
        f"{tmp_path}/../x": "is not a plain path",
    }
    before = open_fds()
    for path, words in cases.items():
        with pytest.raises(BindSourceRefused) as refused:
            open_dir_nofollow(path)
        assert words in str(refused.value), refused.value
    assert open_fds() == before


def test_the_first_bad_source_names_its_mount_and_leaves_nothing_open(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.symlink_to("/etc")
    argv = ["bwrap", "--bind-fd", str(good), "/mnt/good", "--ro-bind-fd", str(bad), "/mnt/bad", "--", "true"]
    before = open_fds()
    with pytest.raises(BindSourceRefused) as refused:
        open_sources([argv], [fd_bind_indexes(argv)])
    assert str(refused.value) == f"mount {bad} -> /mnt/bad: {bad} is a symlink (never followed into a bind)"
    assert open_fds() == before  # the good one, opened first, was closed again


def test_the_local_engines_argv_names_its_mounts_by_fd_and_slurms_by_path(tmp_path: Path) -> None:
    mounts = [("/data/in", "/in", True), ("/data/out", "/out", False)]
    spec = SandboxSpec("ls -- --bind-fd x", str(tmp_path / "w"), 200001, {}, mounts=mounts, mounts_by_fd=True)
    argv = bwrap_argv("bwrap", "setpriv", spec)
    where = fd_bind_indexes(argv)
    assert [(argv[i - 1], argv[i], argv[i + 1]) for i in where] == [
        ("--ro-bind-fd", "/data/in", "/in"),
        ("--bind-fd", "/data/out", "/out"),
    ]
    assert "/data/in" not in argv[: where[0]] and argv.count("/data/out") == 1  # never also by name
    by_path = bwrap_argv("bwrap", None, SandboxSpec("true", str(tmp_path / "w"), 200001, {}, mounts=mounts))
    assert fd_bind_indexes(by_path) == []
    at = by_path.index("/data/in")
    assert by_path[at - 1 : at + 2] == ["--ro-bind", "/data/in", "/in"]


HAND_OVER = """
import json, os, sys
from corral.engine.isolation import bind_sources
fds = bind_sources.open_sources([sys.argv[1:]], [bind_sources.fd_bind_indexes(sys.argv[1:])])
stray = os.open("/", os.O_RDONLY)
os.set_inheritable(stray, True)
argv = bind_sources.hand_over(sys.argv[1:], bind_sources.fd_bind_indexes(sys.argv[1:]), fds)
def is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
kept = [fd for fd in range(3, 4096) if is_open(fd)]  # a listing of /proc/self/fd opens one
dup = int(argv[8])
same = [os.fstat(dup).st_ino == os.fstat(fds[sys.argv[3]]).st_ino]  # the first source
print(json.dumps({"argv": argv, "fds": fds, "kept": kept, "stray": stray, "same_dir": same,
                  "inheritable": [os.get_inheritable(f) for f in [*fds.values(), dup]]}))
"""


def test_the_child_hands_bwrap_the_fds_and_closes_every_other(tmp_path: Path) -> None:
    """In a process of its own: hand_over closes every fd from 3 up but those it keeps."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    argv = ["bwrap", "--bind-fd", str(a), "/a", "--ro-bind-fd", str(b), "/b", "--ro-bind-fd", str(a), "/a2"]
    out = subprocess.run(
        [sys.executable, "-c", HAND_OVER, *argv, "--", "true"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC},
        check=True,
    )
    got = json.loads(out.stdout)
    fds = got["fds"]
    assert set(fds) == {str(a), str(b)}  # each source opened once, however often it is bound
    fd_a, fd_b = str(fds[str(a)]), str(fds[str(b)])
    assert got["argv"][1:7] == ["--bind-fd", fd_a, "/a", "--ro-bind-fd", fd_b, "/b"]
    fd_a2 = int(got["argv"][8])  # bwrap closes each bind's fd: the second bind of `a` gets a dup
    assert got["argv"][7::2][:2] == ["--ro-bind-fd", "/a2"] and fd_a2 not in fds.values()
    assert got["same_dir"] == [True]
    assert sorted(got["kept"]) == sorted([*fds.values(), fd_a2]) and got["stray"] not in got["kept"]
    assert got["inheritable"] == [True, True, True]
