"""The SDK's dataset calls check the name before it goes into a URL path (no server needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.sdk import Client
from corral.sdk.errors import CorralError


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.delete_dataset("../users/bob"),
        lambda c: c.dataset("../users/bob"),
        lambda c: c.share_dataset("../users/bob", public=True),
        lambda c: c.pull_dataset("../users/bob", Path("/nonexistent-corral-test")),
    ],
)
def test_a_dataset_name_with_a_path_in_it_never_reaches_another_route(call: Callable[[Client], Any]) -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        return httpx.Response(204)

    client = Client("http://corral.test", "token", transport=httpx.MockTransport(answer))
    with pytest.raises(CorralError, match="bad dataset name"):
        call(client)
    assert sent == []


@pytest.mark.parametrize("name", ["x.", ".x", "bad name", "uploads"])
def test_push_and_import_refuse_a_bad_name_before_reading_or_sending_anything(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral data push x. DIR` hashed all of DIR, then printed the server's schema error ("field
    'name' 'x.' does not match pattern ^[A-Za-z0-9](?:...)?$"); it now says what a name may be,
    as the other dataset commands do, with nothing hashed or sent."""
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        detail = [{"loc": ["body", "name"], "msg": "does not match pattern", "type": "pattern"}]
        return httpx.Response(422, json={"detail": detail})  # what the server answers

    import corral.datasets.transfer as transfer

    hashed: list[Path] = []
    monkeypatch.setattr(transfer, "file_sha256", lambda p: hashed.append(p) or "0" * 64)
    (tmp_path / "f.txt").write_text("x")
    client = Client("http://corral.test", "token", transport=httpx.MockTransport(answer))
    with pytest.raises(CorralError, match=r"dataset name|reserved word"):
        client.push_dataset(name, tmp_path)
    with pytest.raises(CorralError, match=r"dataset name|reserved word"):
        client.import_dataset(name, "/srv/data/x")
    assert sent == [] and hashed == []


@pytest.mark.parametrize(
    ("name", "shown"),
    [("é", "'é'"), ("a\x01b", "'a\\x01b'"), ("x y", "'x y'")],
)
def test_a_bad_name_is_shown_as_written_control_characters_escaped_once(name: str, shown: str) -> None:
    # `corral data push é DIR` said "bad dataset name '\\xe9'": the name escaped (unicode_escape),
    # then quoted with repr, which escaped the escape's backslash again.
    from corral.datasets.names import BadName, check_name, check_path

    with pytest.raises(BadName) as refused:
        check_name(name)
    assert str(refused.value).startswith(f"bad dataset name {shown}: use 1-64 letters"), refused.value
    with pytest.raises(BadName) as refused:
        check_path(f"{name}/../x")
    assert str(refused.value).startswith(f"file path '{name}/../x'".replace("\x01", "\\x01")), refused.value
