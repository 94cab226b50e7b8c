"""Every name the SDK puts into a URL path stays one segment of the route it was meant for: '/',
'?', '#', '%' and the dot segments '.' and '..' are escaped, so the server answers about the name
as given (no server needed: the requests are caught by a mock transport)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.sdk import Client, CorralError

CALLS: list[tuple[Callable[[Client, str], Any], str]] = [
    (lambda c, n: c.delete_model(n), "DELETE /api/v1/models/{}"),
    (lambda c, n: c.delete_template(n), "DELETE /api/v1/templates/{}"),
    (lambda c, n: c.template(n), "GET /api/v1/templates/{}"),
    (lambda c, n: c.model_version("digits", n), "GET /api/v1/models/digits/versions/{}"),
    (lambda c, n: c.group(n), "GET /api/v1/groups/{}"),
    (lambda c, n: c.set_quota(n, guaranteed=1), "PUT /api/v1/groups/{}/quota"),
    (lambda c, n: c.remove_quota(n, "A100"), "DELETE /api/v1/groups/{}/quota?gpu_model=A100"),
    (lambda c, n: c.add_member(n, "alice"), "POST /api/v1/groups/{}/members"),
    (lambda c, n: c.set_default_group(n, "vision"), "PUT /api/v1/users/{}/default-group"),
    (lambda c, n: c.set_password(n, "secret-password"), "PUT /api/v1/users/{}/password"),
    (lambda c, n: c.node_action(n, "cordon"), "POST /api/v1/nodes/{}/cordon"),
    (lambda c, n: c.set_storage_quota("group", n, max_bytes=1), "PUT /api/v1/storage/quota/group/{}"),
    (lambda c, n: c.environment(n), "GET /api/v1/environments/{}"),
]
NAMES = {
    "../templates/x": "..%2Ftemplates%2Fx",
    "..": "%2E%2E",
    ".": "%2E",
    "vision#x": "vision%23x",
    "vision?user=bob": "vision%3Fuser%3Dbob",
    "a%2Fb": "a%252Fb",
}


@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize(("call", "route"), CALLS)
def test_a_name_is_one_path_segment_of_its_own_route(
    call: Callable[[Client, str], Any], route: str, name: str
) -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.raw_path.decode()}")
        return httpx.Response(200, json={"items": []})

    client = Client("http://corral.test", "token", transport=httpx.MockTransport(answer))
    call(client, name)
    assert sent == [route.format(NAMES[name])]


@pytest.mark.parametrize(("call", "route"), CALLS)
def test_an_empty_name_is_refused_naming_it(call: Callable[[Client, str], Any], route: str) -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(405, json={"detail": "Method Not Allowed"})

    client = Client("http://corral.test", "token", transport=httpx.MockTransport(answer))
    with pytest.raises(CorralError, match="an empty name"):
        call(client, "")
    assert sent == []


def test_a_model_files_path_travels_as_a_query_parameter(tmp_path: Path) -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.params.get("path", ""))
        if request.url.path.endswith("/files"):
            return httpx.Response(200, json={"items": [{"path": "a b#1?.txt"}]})
        return httpx.Response(200, content=b"x")

    client = Client("http://corral.test", "token", transport=httpx.MockTransport(answer))
    client.pull_model("digits", 2, tmp_path)
    assert sent == ["", "a b#1?.txt"]
    assert (tmp_path / "a b#1?.txt").read_bytes() == b"x"


@pytest.mark.parametrize(
    ("args", "module", "route"),
    [
        (
            ["node", "gpu", "../jobs/1", "0", "return"],
            "nodes",
            "POST /api/v1/nodes/..%2Fjobs%2F1/gpus/0/return",
        ),
        (["chaos", "gpu", "xid", "../jobs/1", "0"], "monitor", "POST /api/v1/chaos/gpus/..%2Fjobs%2F1/0"),
        (["chaos", "node", "down", "a#b"], "monitor", "POST /api/v1/chaos/nodes/a%23b/down"),
    ],
)
def test_the_cli_paths_it_builds_keep_a_node_name_one_segment(
    monkeypatch: pytest.MonkeyPatch, args: list[str], module: str, route: str
) -> None:
    from typer.testing import CliRunner

    from corral.cli import monitor, nodes
    from corral.cli.main import app

    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.raw_path.decode()}")
        return httpx.Response(404, json={"detail": "no node named that"})

    transport = httpx.MockTransport(answer)
    commands = {"nodes": nodes, "monitor": monitor}[module]
    monkeypatch.setattr(commands, "client", lambda: Client("http://corral.test", "t", transport=transport))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and sent == [route], (result.output, sent)


def test_a_spec_file_name_given_as_a_str_is_refused_naming_the_path_to_give(tmp_path: Path) -> None:
    """`submit("train.yaml")` sent the text "train.yaml" (YAML for a string) and the server's
    answer, "the spec must be a mapping", did not say that a str is the spec's text: nothing is
    sent, and the error names `submit(Path('train.yaml'))`."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, json={"id": 1, "state": "queued"})

    client = Client("http://corral.test", "crl_x", transport=httpx.MockTransport(handler))
    for name in ("train.yaml", "specs/train.yml"):
        with pytest.raises(CorralError, match=re.escape(f"pass a Path: submit(Path('{name}'))")):
            client.submit(name)
    existing = tmp_path / "spec"
    existing.write_text("name: x\ncommand: 'true'\n")
    with pytest.raises(CorralError, match="pass a Path"):
        client.submit(str(existing))
    assert sent == []
    assert client.submit(existing)["id"] == 1  # a Path is read
    assert client.submit("{name: x, command: 'true'}")["id"] == 1  # one line of YAML text is sent
    assert [r.headers["Content-Type"] for r in sent] == ["application/yaml"] * 2


@pytest.mark.parametrize("failure", ["short", "refused"])
def test_a_model_pull_cut_short_leaves_no_cut_file(tmp_path: Path, failure: str) -> None:
    # pull_model wrote each file straight under its name: a download that broke off left a cut
    # `w.bin` (or cut the good copy an earlier pull had put there), with nothing to tell it apart.
    (tmp_path / "w.bin").write_bytes(b"earlier")

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/files"):
            items = [{"path": "a.txt", "size": 1}, {"path": "w.bin", "size": 5}]
            return httpx.Response(200, json={"items": items})
        if request.url.params["path"] == "a.txt":
            return httpx.Response(200, content=b"a")
        if failure == "short":
            return httpx.Response(200, content=b"wei")  # the connection dropped after 3 bytes
        return httpx.Response(404, json={"detail": "model 'digits' v2 has no file 'w.bin'"})

    client = Client("http://corral.test", "token", transport=httpx.MockTransport(answer))
    with pytest.raises(CorralError, match="3 of its 5 bytes arrived" if failure == "short" else "no file"):
        client.pull_model("digits", 2, tmp_path)
    assert (tmp_path / "a.txt").read_bytes() == b"a"
    assert (tmp_path / "w.bin").read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "w.bin"]
