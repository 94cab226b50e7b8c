"""What the operations commands print, against a real uvicorn server: `corral alert ls` and
`incident ls` at 80 columns cut nothing without saying so, `incident comment` says what it did,
`rules show` takes `-o json` as every read command does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import common
from corral.cli.main import app as cli
from corral.monitor.alerts import record_alert
from corral.services import incidents
from tests.api.conftest import World
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_alert_ls_shows_the_alert_name_and_labels_whole_at_80_columns(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The boxed table cut the alert's name ("CorralGpuE…") and its labels ("uuid=GPU-v…")."""
    # _width, not width: undone to None; the width setter would pin the old width for later tests
    monkeypatch.setattr(common.out, "_width", 80)
    labels = {"alertname": "CorralGpuEccErrors", "severity": "critical", "node": "node-a17", "gpu": "3",
              "uuid": "GPU-5b1f0c2e-9a4d-4c61-8f3e-2d7a9b0c1e44"}  # fmt: skip
    with world.session_factory() as db:
        record_alert(db, labels=labels, status="firing", now=time.time(), channels=[], source="corral")
        db.commit()
    code, out = run(world, server_url, "admin", "alert", "ls")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    assert "CorralGpuEccErrors" in out.split(), out
    assert "node=node-a17" in out.split() and "gpu=3" in out.split(), out
    assert "uuid=" not in out, out  # node and gpu say where; --labels gives the rest
    code, out = run(world, server_url, "admin", "alert", "ls", "--labels")
    assert code == 0 and "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    # the uuid folded over lines of its own (the row's other cells are on its first line)
    assert "uuid=GPU-5b1f0c2e-9a4d-4c61-8f3e-2d7a9b0c1e44" in "".join(out.split()), out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_incident_ls_marks_a_title_it_cuts(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Titles over 60 characters were cut with nothing to say so ("... ECC error(s) si")."""
    monkeypatch.setattr(common.out, "_width", 200)  # one line per row
    long_title = "GPU 0 on vm: GPU 0 on vm has 1 uncorrectable ECC error(s) since its last reset"
    with world.session_factory() as db:
        for key, title in (("long", long_title), ("short", "node n7 lost")):
            incidents.open_or_update(db, fingerprint=key, title=title, severity="SEV2", source="manual",
                                     labels={}, links={}, now=time.time())  # fmt: skip
        db.commit()
    code, out = run(world, server_url, "admin", "incident", "ls")
    assert code == 0, out
    assert f"{long_title[:59]}…" in out and long_title not in out, out
    assert "node n7 lost" in out and "node n7 lost…" not in out, out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_incident_comment_says_the_comment_was_added(world: World, server_url: str) -> None:
    """`corral incident comment 1 "text"` printed only the state ("incident 1: triggered"), as if
    the incident had been acted on rather than commented."""
    with world.session_factory() as db:
        made = incidents.open_or_update(db, fingerprint="c", title="node n7 lost", severity="SEV3",
                                        source="manual", labels={}, links={}, now=time.time())  # fmt: skip
        db.commit()
        number = made.id
    code, out = run(world, server_url, "admin", "incident", "comment", str(number), "looking at it")
    assert code == 0 and out.strip() == f"incident {number}: comment added (triggered)", out
    code, out = run(world, server_url, "admin", "incident", "ack", str(number))
    assert (
        code == 0 and out.strip() == f"incident {number}: acknowledged by admin, owner admin (acknowledged)"
    ), out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_rules_show_takes_o_json_as_every_read_command(world: World, server_url: str) -> None:
    """The README: "Every read command takes `-o json`"; `corral rules show -o json` was refused
    ("No such option: -o")."""
    code, out = run(world, server_url, "admin", "rules", "show", "--version", "0", "-o", "json")
    assert code == 0, out
    shipped = json.loads(out)
    assert shipped["version"] == 0 and "name: gpu-fault" in shipped["text"]
    code, out = run(world, server_url, "admin", "rules", "show", "--version", "0")
    assert code == 0 and out == f"# version 0\n{shipped['text']}", out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_an_empty_list_says_so_rather_than_print_a_header_alone(world: World, server_url: str) -> None:
    """`corral incident ls`, `oncall now` and `ws ls` with nothing to list printed their header
    row alone, which reads as a listing that failed half-way; an admin's `ws ls --user alice` or
    `--all` was then told how to make a workspace of their own."""
    expected = {
        ("incident", "ls"): "no open incidents (--all: resolved and closed ones too)",
        ("incident", "ls", "--all"): "no incidents",
        ("oncall", "now"): "no on-call schedules (`corral oncall schedule set NAME -f FILE` defines one)",
        ("ws", "ls"): "no workspaces (`corral ws create NAME` makes one)",
        # another's list or everyone's: no hint to make one of one's own (it gave it)
        ("ws", "ls", "--user", "alice"): "alice has no workspaces",
        ("ws", "ls", "--all"): "no workspaces of any user",
    }
    for args, line in expected.items():
        code, out = run(world, server_url, "admin", *args)
        assert code == 0 and out == line + "\n", (args, out)


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_key_add_of_a_missing_file_says_why_once(world: World, server_url: str, tmp_path: Path) -> None:
    """`corral key add nokey.pub` said "cannot read nokey.pub: [Errno 2] No such file or
    directory: 'nokey.pub'": the path twice and Python's errno."""
    missing = tmp_path / "nokey.pub"
    code, out = run(world, server_url, "alice", "key", "add", str(missing))
    assert code == 1 and out.strip() == f"error: cannot read {missing}: No such file or directory", out
    binary = tmp_path / "k.pub"
    binary.write_bytes(b"\xff\xfe\x00")
    code, out = run(world, server_url, "alice", "key", "add", str(binary))
    assert code == 1 and "not text (a public key file is one line of text)" in out, out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_incident_ack_says_who_owns_it_when_someone_acknowledged_first(world: World, server_url: str) -> None:
    """`incident ack --help` said "you own it now", and the ack printed "acknowledged" alone; but
    only the first to acknowledge becomes the owner (services/incidents.acknowledge)."""
    result = CliRunner().invoke(cli, ["incident", "ack", "--help"], env={"COLUMNS": "200"})
    said = " ".join(result.output.replace("│", " ").split())
    assert "you own it now" not in said, said
    promise = (
        "The first to acknowledge becomes its owner unless it has one; acknowledging it again, by anyone,"
    )
    assert f"{promise} changes nothing." in said, said
    with world.session_factory() as db:
        made = incidents.open_or_update(db, fingerprint="n7", title="node n7 lost", severity="SEV3",
                                        source="manual", labels={}, links={}, now=time.time())  # fmt: skip
        incidents.acknowledge(db, made.id, "bob", time.time())  # bob answered the page first
        db.commit()
        number = made.id
    code, out = run(world, server_url, "admin", "incident", "ack", str(number))
    assert code == 0 and out.strip() == f"incident {number}: acknowledged by bob, owner bob (acknowledged)", (
        out
    )
