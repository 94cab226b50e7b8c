"""What users wrote (a template's or a model's description, a model's framework and metrics) is
printed by the CLI as it is: Rich markup in it is neither applied nor an error. A public template
whose description held "[/x]" made `corral template ls` a MarkupError traceback for everyone."""

from __future__ import annotations

from typing import Any

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
