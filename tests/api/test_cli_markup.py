"""What users wrote (a template's or a model's description, a model's framework and metrics) is
printed by the CLI as it is: Rich markup in it is neither applied nor an error. A public template
whose description held "[/x]" made `corral template ls` a MarkupError traceback for everyone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncssh

from corral.services import incidents
from tests.api.conftest import World
from tests.api.test_catalog import TEMPLATE, finished_job, publish
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture
API = "/api/v1"
WRITTEN = "[/oops] see [bold]this[/bold] and [link=http://x.test]that[/link]"


def test_text_users_wrote_is_printed_as_it_is(world: World, server_url: str, settings: Any) -> None:
    r = publish(world, "carol", "evil", TEMPLATE, description=WRITTEN, visibility="public")
    assert r.status_code == 201, r.text
    job = finished_job(world, "alice", {"w.bin": b"w"}, settings.storage_path)
    body = {"job_id": job, "description": WRITTEN, "framework": "[/fw]", "metrics": {"[/m]": 1}}
    r = world.client.post(f"{API}/models/digits/versions", json=body, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    for args in (["template", "ls"], ["template", "show", "evil"], ["model", "show", "digits"]):
        code, out = run(world, server_url, "alice", *args)
        assert code == 0, (args, out)
        assert "[/oops]" in out and "[bold]" in out, (args, out)  # (a narrow table wraps the rest)
    code, out = run(world, server_url, "alice", "model", "versions", "digits")
    assert code == 0 and "[/fw]" in out and "[/m]=1" in out, out


def test_keys_tokens_pages_contacts_and_postmortems_are_printed_as_written(
    world: World, server_url: str, tmp_path: Path
) -> None:
    """The same for what the walk through workspaces and operations met: an SSH key whose comment
    was "[/oops]" was registered and then `corral key add` ended in a MarkupError traceback, and so
    did `corral key ls` from then on (the id to remove it with was in no table); likewise a token's
    name in `corral token ls`, a page's subject in `corral oncall pages` (incident titles come from
    alerts), a contact's address in `corral oncall contact ls`, and a postmortem in `corral
    incident show`."""
    key = tmp_path / "id.pub"
    key.write_text(
        asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip() + " [/oops]\n"
    )
    code, out = run(world, server_url, "alice", "key", "add", str(key))
    assert code == 0 and "[/oops]" in out, out
    for user, args in [
        ("alice", ["key", "ls"]),
        ("alice", ["token", "create", "--name", "[/tk]"]),
        ("alice", ["token", "ls"]),
        ("admin", ["oncall", "contact", "add", "bob", "webhook", "http://hook.test/[/x]"]),
        ("admin", ["oncall", "contact", "ls", "bob"]),
        ("admin", ["oncall", "policy", "set", "p", "--step", "user:bob:1"]),
        ("admin", ["oncall", "page", "p", "[/subject]"]),
        ("admin", ["oncall", "pages"]),
    ]:
        code, out = run(world, server_url, user, *args)
        assert code == 0, (args, out)
    assert "[/tk]" in run(world, server_url, "alice", "token", "ls")[1]
    assert "http://hook.test/[/x]" in run(world, server_url, "admin", "oncall", "contact", "ls", "bob")[1]
    assert "[/subject]" in run(world, server_url, "admin", "oncall", "pages")[1]
    with world.session_factory() as db:
        incident = incidents.open_or_update(db, fingerprint="f", title="t", severity="SEV2", source="manual",
                                            labels={}, links={}, now=time.time())  # fmt: skip
        db.commit()
    pm = ["--summary", "[/s]", "--impact", "[/i]", "--root-cause", "[/r]", "--action", "[/a];bob;2026-12-31"]
    assert run(world, server_url, "admin", "incident", "postmortem", str(incident.id), *pm)[0] == 0
    code, out = run(world, server_url, "admin", "incident", "show", str(incident.id))
    assert code == 0 and all(t in out for t in ("[/s]", "[/i]", "[/r]", "[/a]")), out


def test_an_on_call_layers_name_is_printed_as_written(world: World, server_url: str, tmp_path: Path) -> None:
    """A layer named "[/l]" made `corral oncall now` (which everyone logged in may run) and
    `corral oncall schedule show` end in a MarkupError traceback."""
    spec = tmp_path / "s.yaml"
    # A fixed-offset zone where it is about 11:00 now, so that the gap (local 23:00-24:00) is never
    # now: in UTC the test failed between 23:00 and 24:00 (`oncall now` said "nobody: gap")
    offset = (11 - time.gmtime().tm_hour + 12) % 24 - 12
    zone = "UTC" if offset == 0 else f"Etc/GMT{-offset:+d}"
    spec.write_text(
        f"time_zone: {zone}\nlayers:\n  - {{name: '[/l]', rotation: daily, start_date: '2026-01-05',"
        " handoff: '09:00', members: [alice], restrict_from: '00:00', restrict_to: '23:00'}\n"
    )
    code, out = run(world, server_url, "admin", "oncall", "schedule", "set", "s", "-f", str(spec))
    assert code == 0 and "warning:" in out, out  # the gap 23:00-24:00
    for args in (["oncall", "now"], ["oncall", "schedule", "show", "s"]):
        code, out = run(world, server_url, "bob", *args)
        assert code == 0 and "[/l]" in out, (args, out)


def test_specs_metrics_and_output_paths_are_printed_as_written(
    world: World, server_url: str, settings: Any
) -> None:
    """The CLI's consoles print text, not markup, unless a line asks for it: a template whose
    command held "[/c]" made `corral template show` a MarkupError (the spec is printed as JSON), and
    so did a metric named "[/m]" in `corral model show NAME@VERSION` and `corral model compare`, and
    an output file named "[/p].bin" in `corral job outputs`."""
    spec = TEMPLATE.replace("--amp ${amp}", "--amp ${amp} '[/c]'")
    assert publish(world, "alice", "t", spec).status_code == 201
    job = finished_job(world, "alice", {"[/p].bin": b"w", "[bold]b[/bold].bin": b"b"}, settings.storage_path)
    for value in (1, 2):
        body = {"job_id": job, "metrics": {"[/m]": value}}
        r = world.client.post(f"{API}/models/digits/versions", json=body, headers=world.as_("alice"))
        assert r.status_code == 201, r.text
    for args, written in [
        (["template", "show", "t"], "'[/c]'"),
        (["model", "show", "digits@1"], '{"[/m]": 1}'),
        (["model", "compare", "digits", "1", "2"], "[/m]"),
        (["job", "outputs", str(job)], "[bold]b[/bold].bin"),
        (["job", "outputs", str(job)], "[/p].bin"),
    ]:
        code, out = run(world, server_url, "alice", *args)
        assert code == 0 and written in out, (args, out)
