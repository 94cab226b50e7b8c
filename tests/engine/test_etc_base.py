"""The prepared /etc copy a sandbox binds in one mount (corral.engine.isolation.etc_base)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from corral.engine.isolation import etc_base
from corral.engine.isolation.etc_base import PER_JOB_FILES, EtcBase
from corral.engine.isolation.sandbox import SandboxSpec, bwrap_argv, write_etc


@pytest.fixture
def host_etc(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "ssl" / "private").mkdir(mode=0o700)
    (etc / "ssl" / "private" / "key.pem").write_text("SECRET KEY")
    (etc / "ssl" / "certs" / "ca.pem").write_text("CERT")
    os.symlink("ca.pem", etc / "ssl" / "certs" / "abcd.0")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (tmp_path / "real-resolv.conf").write_text("nameserver 10.0.0.1\n")
    os.symlink(tmp_path / "real-resolv.conf", etc / "resolv.conf")
    (etc / "closed.conf").write_text("only root")
    os.chmod(etc / "closed.conf", 0o600)
    return etc


def test_copy_is_what_binds_showed_and_no_more(tmp_path: Path, host_etc: Path) -> None:
    base = Path(
        EtcBase(
            tmp_path / "base", ("hosts", "resolv.conf", "ssl", "closed.conf", "absent"), str(host_etc)
        ).path()
    )
    assert (base / "hosts").read_text() == "127.0.0.1 localhost\n"
    # a top-level symlink is followed (a bind would follow it), inner ones stay links
    assert not (base / "resolv.conf").is_symlink()
    assert (base / "resolv.conf").read_text() == "nameserver 10.0.0.1\n"
    assert os.readlink(base / "ssl" / "certs" / "abcd.0") == "ca.pem"
    # what the job could not read is not copied: no key lands in the engine home
    assert not (base / "ssl" / "private").exists()
    assert (base / "closed.conf").read_text() == "" and (base / "closed.conf").stat().st_mode & 0o777 == 0o600
    assert not (base / "absent").exists()
    for name in PER_JOB_FILES:  # bind targets for each job's own files
        assert (base / name).exists()
    assert base.stat().st_mode & 0o777 == 0o755


def test_a_host_change_reaches_the_next_base(
    tmp_path: Path, host_etc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(etc_base, "REFRESH_S", 0.0)
    bases = EtcBase(tmp_path / "base", ("hosts", "ssl"), str(host_etc))
    first = bases.path()
    assert bases.path() == first  # unchanged host: the same dir, not rebuilt
    time.sleep(0.01)
    (host_etc / "ssl" / "certs" / "new.pem").write_text("NEW CERT")  # a dir below changes
    second = bases.path()
    assert second != first and (Path(second) / "ssl" / "certs" / "new.pem").read_text() == "NEW CERT"
    (host_etc / "hosts").write_text("127.0.0.1 localhost renamed\n")
    third = bases.path()
    assert (Path(third) / "hosts").read_text().endswith("renamed\n")
    time.sleep(0.01)
    with open(host_etc / "ssl" / "certs" / "ca.pem", "r+") as f:  # in place: no dir changes
        f.write("EDIT")
    fourth = bases.path()
    assert (Path(fourth) / "ssl" / "certs" / "ca.pem").read_text() == "EDIT"
    # the previous base stays (a launch may be between its argv and bwrap), older ones go
    assert sorted(p.name for p in (tmp_path / "base").iterdir()) == sorted(
        {Path(third).name, Path(fourth).name}
    )


def test_argv_binds_the_base_once_and_the_jobs_own_files_over_it(tmp_path: Path, host_etc: Path) -> None:
    base = EtcBase(tmp_path / "base", ("hosts", "ssl"), str(host_etc)).path()
    etc = write_etc(tmp_path / "job-etc", "alice", 200123)
    argv = bwrap_argv("bwrap", "setpriv", SandboxSpec("true", "/w", 200123, etc, etc_base=base))
    binds = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--ro-bind"]
    etc_binds = [b for b in binds if b[1] == "/etc" or b[1].startswith("/etc/")]
    assert etc_binds == [
        (base, "/etc"),
        (etc["/etc/passwd"], "/etc/passwd"),
        (etc["/etc/group"], "/etc/group"),
    ]
    # a job file the base has no placeholder for: every entry bound from the host, as before
    odd = {**etc, "/etc/other.conf": str(tmp_path / "other.conf")}
    argv = bwrap_argv("bwrap", "setpriv", SandboxSpec("true", "/w", 200123, odd, etc_base=base))
    assert ("/etc/hosts", "/etc/hosts") in [
        (argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--ro-bind"
    ]


def test_accounts_come_from_files_only(tmp_path: Path, host_etc: Path) -> None:
    (host_etc / "nsswitch.conf").write_text(
        "# comment: passwd: systemd\npasswd:         files systemd\ngroup: files sss\nhosts: files dns\n"
    )
    base = Path(EtcBase(tmp_path / "base", ("nsswitch.conf",), str(host_etc)).path())
    assert (base / "nsswitch.conf").read_text().splitlines() == [
        "# comment: passwd: systemd",
        "passwd: files",
        "group: files",
        "hosts: files dns",  # everything else as on the host
    ]
