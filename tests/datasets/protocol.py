"""Drive the dataset upload protocol by hand over any httpx-like client (the API tests' TestClient
or a real server's client), step by step, so tests can stop it anywhere."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote

from corral.datasets.names import manifest_digest

API = "/api/v1"


def entries(files: dict[str, bytes]) -> list[tuple[str, int, str]]:
    return sorted((p, len(b), hashlib.sha256(b).hexdigest()) for p, b in files.items())


def start(
    client: Any, headers: dict[str, str], name: str, files: dict[str, bytes], group: str | None = None
) -> Any:
    listed = entries(files)
    body = {
        "name": name,
        "group": group,
        "bytes": sum(e[1] for e in listed),
        "files": len(listed),
        "digest": manifest_digest(listed),
    }
    return client.post(f"{API}/datasets/uploads", json=body, headers=headers)


def register(client: Any, headers: dict[str, str], upload_id: str, files: dict[str, bytes]) -> Any:
    batch = [{"path": p, "size": s, "sha256": h} for p, s, h in entries(files)]
    return client.post(f"{API}/datasets/uploads/{upload_id}/files", json={"files": batch}, headers=headers)


def chunk(client: Any, headers: dict[str, str], upload_id: str, path: str, offset: int, data: bytes) -> Any:
    url = f"{API}/datasets/uploads/{upload_id}/chunk?path={quote(path, safe='')}&offset={offset}"
    return client.put(url, content=data, headers=headers | {"Content-Type": "application/octet-stream"})


def complete(client: Any, headers: dict[str, str], upload_id: str) -> Any:
    return client.post(f"{API}/datasets/uploads/{upload_id}/complete", headers=headers)


def push(
    client: Any, headers: dict[str, str], name: str, files: dict[str, bytes], group: str | None = None
) -> Any:
    """The whole protocol; returns complete's response (asserts each step before it)."""
    r = start(client, headers, name, files, group)
    assert r.status_code == 201, r.text
    uid = r.json()["id"]
    r = register(client, headers, uid, files)
    assert r.status_code == 200, r.text
    for path, data in files.items():
        if data:
            r = chunk(client, headers, uid, path, 0, data)
            assert r.status_code == 200, r.text
    return complete(client, headers, uid)
