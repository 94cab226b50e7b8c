"""The dataset and storage routes' rows of the authorization matrix (tests/api/test_authz.py).
Datasets made here are alice's own (group-owned datasets: tests/api/test_datasets_api.py; by the
time these rows run, an earlier row has made carol a member of vision)."""

from __future__ import annotations

import itertools
from typing import Any

from tests.api.conftest import World
from tests.datasets import protocol

_n = itertools.count()
FILES = {"a.txt": b"hello", "d/b.txt": b"world"}


def _dataset(world: World) -> str:
    name = f"ds{next(_n)}"
    r = protocol.push(world.client, world.as_("alice"), name, FILES)
    assert r.status_code == 201, r.text
    return name


def _upload(world: World) -> str:
    """An upload of alice's, files registered, nothing sent."""
    r = protocol.start(world.client, world.as_("alice"), f"up{next(_n)}", FILES)
    assert r.status_code == 201, r.text
    uid = str(r.json()["id"])
    assert protocol.register(world.client, world.as_("alice"), uid, FILES).status_code == 200
    return uid


def _sent_upload(world: World) -> str:
    uid = _upload(world)
    for path, data in FILES.items():
        assert protocol.chunk(world.client, world.as_("alice"), uid, path, 0, data).status_code == 200
    return uid


def _new_upload_body(world: World) -> dict[str, Any]:
    listed = protocol.entries(FILES)
    return {"name": f"new{next(_n)}", "bytes": 10, "files": 2, "digest": protocol.manifest_digest(listed)}


def dataset_cases(case: Any, everyone: Any) -> list[Any]:
    readers = {"alice": 200, "bob": 404, "carol": 404, "admin": 200}
    managers = {"alice": 204, "bob": 404, "carol": 404, "admin": 204}
    uploader = {"alice": 200, "bob": 404, "carol": 404, "admin": 200}
    root = "/api/v1/datasets"
    return [
        case("GET", root, everyone(200)),
        case("GET", f"{root}/uploads", everyone(200)),
        case("GET", f"{root}/{{name}}", readers, path=lambda w: f"{root}/{_dataset(w)}"),
        case("DELETE", f"{root}/{{name}}", managers, path=lambda w: f"{root}/{_dataset(w)}"),
        case(
            "DELETE",
            f"{root}/{{name}}/versions/{{version}}",
            managers,
            path=lambda w: f"{root}/{_dataset(w)}/versions/1",
        ),
        case(
            "PUT",
            f"{root}/{{name}}/share",
            {"alice": 200, "bob": 404, "carol": 404, "admin": 200},
            path=lambda w: f"{root}/{_dataset(w)}/share",
            body=lambda w: {"add_groups": ["vision"]},  # alice's group (another is a 404 but for admins)
        ),
        case(
            "GET",
            f"{root}/{{name}}/versions/{{version}}/manifest",
            readers,
            path=lambda w: f"{root}/{_dataset(w)}/versions/latest/manifest",
        ),
        case(
            "GET",
            f"{root}/{{name}}/versions/{{version}}/files/{{path}}",
            readers,
            path=lambda w: f"{root}/{_dataset(w)}/versions/1/files/d/b.txt",
        ),
        # No import roots are configured here: even the admin is refused (403 naming the roots).
        case(
            "POST",
            f"{root}/import",
            {"alice": 403, "bob": 403, "carol": 403, "admin": 403},
            body=lambda w: {"name": "imp", "path": "/tmp"},
        ),
        case("POST", f"{root}/uploads", everyone(201), body=_new_upload_body),
        case("GET", f"{root}/uploads/{{upload_id}}", uploader, path=lambda w: f"{root}/uploads/{_upload(w)}"),
        case(
            "POST",
            f"{root}/uploads/{{upload_id}}/files",
            uploader,
            path=lambda w: f"{root}/uploads/{_upload(w)}/files",
            body=lambda w: {"files": [{"path": "a.txt", "size": 5, "sha256": protocol.entries(FILES)[0][2]}]},
        ),
        case(
            "GET",
            f"{root}/uploads/{{upload_id}}/pending",
            uploader,
            path=lambda w: f"{root}/uploads/{_upload(w)}/pending",
        ),
        case(
            "PUT",
            f"{root}/uploads/{{upload_id}}/chunk",
            uploader,
            path=lambda w: f"{root}/uploads/{_upload(w)}/chunk?path=a.txt&offset=0",
        ),
        case(
            "POST",
            f"{root}/uploads/{{upload_id}}/complete",
            {"alice": 201, "bob": 404, "carol": 404, "admin": 201},
            path=lambda w: f"{root}/uploads/{_sent_upload(w)}/complete",
        ),
        case(
            "DELETE",
            f"{root}/uploads/{{upload_id}}",
            {"alice": 204, "bob": 404, "carol": 404, "admin": 204},
            path=lambda w: f"{root}/uploads/{_upload(w)}",
        ),
        case("GET", "/api/v1/storage/usage", everyone(200)),
        case(
            "PUT",
            "/api/v1/storage/quota/{scope}/{name}",
            {"alice": 403, "bob": 403, "carol": 403, "admin": 200},
            path=lambda w: "/api/v1/storage/quota/group/vision",
            body=lambda w: {"max_bytes": 10**12},
        ),
    ]
