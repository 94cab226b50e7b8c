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
