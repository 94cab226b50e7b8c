"""Datasets over the API (in-process app, SQLite and PostgreSQL): sharing, version pinning, the
mount source, lineage and the delete refusal, quotas, bad input and stale uploads. The real
server, the CLI and interrupted pushes: tests/datasets/test_datasets_server.py."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from threading import Event
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select

from corral.datasets import quotas, service, transfer, uploads
from corral.datasets.models import DatasetUpload, DatasetVersion
from corral.datasets.names import manifest_digest
from corral.datasets.store import Store
from corral.db.models import Group, Job, Membership, User
from corral.sdk.errors import CorralError
from corral.services.auth import Principal, load_principal
from corral.services.errors import Conflict, Forbidden
from corral.spec import JobSpecV1
from tests.api.conftest import World
from tests.datasets import protocol

API = "/api/v1"
V1 = {"train/x.bin": b"\x00" * 3000, "labels.txt": b"cat\ndog\n"}
V2 = {"train/x.bin": b"\x01" * 3000, "labels.txt": b"cat\ndog\nbird\n"}


def store_of(world: World) -> Store:
    return Store(world.client.app.state.settings.storage_path)  # type: ignore[attr-defined]


def staged_entries(world: World) -> list[str]:
    uploads_dir = store_of(world).uploads
    return sorted(os.listdir(uploads_dir)) if uploads_dir.exists() else []


def add_job(world: World, user: str, group: str, state: str = "queued") -> int:
    spec = JobSpecV1.model_validate({"name": "uses-data", "command": "true", "resources": {"cpus": 1}})
    with world.session_factory() as db:
        uid = db.query(User.id).filter(User.name == user).scalar()
        gid = db.query(Group.id).filter(Group.name == group).scalar()
        now = time.time()
        job = Job(
            name="uses-data",
            user_id=uid,
            group_id=gid,
            state=state,
            spec=spec,
            submitted_at=now,
            updated_at=now,
        )
        db.add(job)
        db.commit()
        return job.id


def test_group_dataset_shared_read_only_with_versions_pinned(world: World) -> None:
    alice, bob, carol = world.as_("alice"), world.as_("bob"), world.as_("carol")
    assert protocol.push(world.client, alice, "cifar", V1, group="vision").status_code == 201
    assert protocol.push(world.client, bob, "cifar", V2).json()["version"] == 2  # a member pushes v2
    # carol (nlp) sees nothing until it is shared with nlp; then reads but cannot change it.
    assert world.client.get(f"{API}/datasets/cifar", headers=carol).status_code == 404
    assert world.client.get(f"{API}/datasets", headers=carol).json() == []
    r = protocol.start(world.client, carol, "cifar", {"x": b"1"})  # the name is taken: no owner told
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == "dataset name 'cifar' is taken by another user; choose another"
    r = world.client.put(f"{API}/datasets/cifar/share", json={"add_groups": ["nlp"]}, headers=alice)
    assert r.status_code == 403, r.text  # alice is a member of vision, not its admin
    # "only the owner of dataset 'cifar' (or an admin of its group) may do this": a member of the
    # owning group read herself as its owner, and "this" named nothing.
    assert r.json()["detail"] == (
        "only an admin of group vision, which owns dataset 'cifar', or a platform admin may share it"
    ), r.text
    r = world.client.delete(f"{API}/datasets/cifar/versions/1", headers=alice)
    assert r.status_code == 403 and r.json()["detail"].endswith("may delete its versions"), r.text
    r = world.client.put(f"{API}/datasets/cifar/share", json={"add_groups": ["nlp"]}, headers=bob)
    assert r.status_code == 404, r.text  # bob administers vision, is not in nlp: an admin shares
    r = world.client.put(
        f"{API}/datasets/cifar/share", json={"add_groups": ["nlp"]}, headers=world.as_("admin")
    )
    assert r.status_code == 200 and r.json()["shared_with"] == ["nlp"], r.text
    shown = world.client.get(f"{API}/datasets/cifar", headers=carol).json()
    assert [v["version"] for v in shown["versions"]] == [1, 2] and shown["latest"] == 2
    assert shown["owner"] == {"user": None, "group": "vision"}
    pinned = world.client.get(f"{API}/datasets/cifar/versions/1/files/labels.txt", headers=carol)
    assert pinned.content == V1["labels.txt"]
    latest = world.client.get(f"{API}/datasets/cifar/versions/latest/manifest", headers=carol)
    assert latest.headers["X-Corral-Version"] == "2"
    assert (
        f"labels.txt\t{len(V2['labels.txt'])}\t{hashlib.sha256(V2['labels.txt']).hexdigest()}" in latest.text
    )
    r = protocol.start(world.client, carol, "cifar", {"x": b"1"})
    # carol reads cifar: "exists and belongs to someone else; pick another name" hid that she may
    # read it but not add to it, and whose it is.
    assert r.status_code == 403 and r.json()["detail"] == (
        "dataset 'cifar' is shared with you to read only: new versions come from its owner "
        "(group vision); push yours under another name"
    ), r.text
    assert world.client.delete(f"{API}/datasets/cifar/versions/1", headers=carol).status_code == 403
    # On disk: read-only files and directories.
    with world.session_factory() as db:
        path, version = service.resolve_dataset_ref(
            db, "carol", {"nlp"}, "data/cifar@1", store=store_of(world)
        )
    assert version == 1 and (Path(path) / "labels.txt").read_bytes() == V1["labels.txt"]
    assert (
        os.stat(path).st_mode & 0o777 == 0o555 and os.stat(Path(path) / "labels.txt").st_mode & 0o777 == 0o444
    )


def test_mount_source_resolves_latest_and_refuses_unknown_or_unreadable(world: World) -> None:
    assert protocol.push(world.client, world.as_("alice"), "mnist", V1).status_code == 201
    assert protocol.push(world.client, world.as_("alice"), "mnist", V2).status_code == 201
    store = store_of(world)
    with world.session_factory() as db:
        path, version = service.resolve_dataset_ref(db, "alice", {"vision"}, "data/mnist", store=store)
        assert version == 2 and path.endswith("/v2")
        assert Path(path, "labels.txt").read_bytes() == V2["labels.txt"]
        for ref, who, words in (
            ("data/mnist@7", "alice", "has no version v7 (it has v1, v2)"),
            ("data/nope", "alice", "no dataset named 'nope'"),
            ("data/mnist", "carol", "no dataset named 'mnist' that carol may read"),
            ("data/../etc", "alice", "bad dataset name"),
            ("data/mnist@x", "alice", "bad dataset version"),
        ):
            with pytest.raises(service.DatasetRefError, match=words.replace("(", r"\(").replace(")", r"\)")):
                service.resolve_dataset_ref(
                    db, who, {"vision"} if who == "alice" else {"nlp"}, ref, store=store
                )


def test_a_job_mounting_an_unknown_dataset_or_version_is_told_it_once(world: World) -> None:
    # `mounts: [{source: data/mnist@7}]` answered "mount source 'data/mnist@7': mnist@7: dataset
    # 'mnist' has no version v7 ...": the ref said twice, the second time bare, as if a field.
    assert protocol.push(world.client, world.as_("alice"), "mnist", V1).status_code == 201
    for user, source, said in (
        ("alice", "data/mnist@7", "dataset 'mnist' has no version v7 (it has v1)"),
        ("alice", "data/nope", "no dataset named 'nope' that alice may read"),
        ("carol", "data/mnist", "no dataset named 'mnist' that carol may read"),
    ):
        spec = {"name": "reads", "command": "true", "mounts": [{"source": source}]}
        r = world.client.post(f"{API}/jobs", json=spec, headers=world.as_(user))
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["msg"] == f"mount source {source!r}: {said}", r.text


def test_delete_refused_while_a_job_uses_the_version(world: World) -> None:
    alice = world.as_("alice")
    assert protocol.push(world.client, alice, "imagenet", V1).status_code == 201
    assert protocol.push(world.client, alice, "imagenet", V2).status_code == 201
    running = add_job(world, "alice", "vision", "running")
    with world.session_factory() as db:
        ds_id = db.query(DatasetVersion.dataset_id).limit(1).scalar()
        service.record_job_datasets(db, running, [(ds_id, 1)])
        service.record_job_datasets(db, running, [(ds_id, 1)])  # idempotent
        db.commit()
        assert service.jobs_using(db, ds_id, 1) == [running] and service.jobs_using(db, ds_id, 2) == []
        assert service.job_datasets(db, running) == [{"dataset": "imagenet", "version": 1}]
    r = world.client.delete(f"{API}/datasets/imagenet/versions/1", headers=alice)
    assert r.status_code == 409 and f"in use by 1 job that has not ended: {running}" in r.json()["detail"]
    r = world.client.delete(f"{API}/datasets/imagenet", headers=alice)
    assert r.status_code == 409 and str(running) in r.json()["detail"]
    assert world.client.delete(f"{API}/datasets/imagenet/versions/2", headers=alice).status_code == 204
    with world.session_factory() as db:  # the job ends: the version may go
        db.get(Job, running).state = "succeeded"  # type: ignore[union-attr]
        db.commit()
    assert world.client.delete(f"{API}/datasets/imagenet", headers=alice).status_code == 204
    assert world.client.get(f"{API}/datasets/imagenet", headers=alice).status_code == 404
    assert not store_of(world).dataset_dir(ds_id).exists()
    usage = world.client.get(f"{API}/storage/usage", headers=alice).json()
    assert [(u["name"], u["used_bytes"]) for u in usage if u["scope"] == "user"] == [("alice", 0)]


def test_quota_refuses_an_upload_before_any_byte_and_per_chunk(world: World) -> None:
    admin, alice = world.as_("admin"), world.as_("alice")
    r = world.client.put(
        f"{API}/storage/quota/group/vision", json={"max_bytes": 4000, "max_files": 10}, headers=admin
    )
    assert r.status_code == 200 and r.json()["max_bytes"] == 4000
    big = {"a.bin": b"x" * 5000}
    r = protocol.start(world.client, alice, "big", big, group="vision")
    assert (
        r.status_code == 403 and "storage quota exceeded: group vision may hold 3.9 KiB" in r.json()["detail"]
    )
    assert staged_entries(world) == []  # nothing written
    # Within the quota it starts; lowered meanwhile, the next chunk is refused.
    small = {"a.bin": b"y" * 3500}
    uid = protocol.start(world.client, alice, "small", small, group="vision").json()["id"]
    assert protocol.register(world.client, alice, uid, small).status_code == 200
    world.client.put(f"{API}/storage/quota/group/vision", json={"max_bytes": 1000}, headers=admin)
    r = protocol.chunk(world.client, alice, uid, "a.bin", 0, small["a.bin"])
    assert r.status_code == 403 and "storage quota exceeded" in r.text
    assert os.listdir(store_of(world).staging_dir(uid)) == []
    world.client.put(
        f"{API}/storage/quota/group/vision", json={"max_bytes": None, "max_files": 1}, headers=admin
    )
    r = protocol.start(world.client, alice, "two", {"a": b"1", "b": b"2"}, group="vision")
    assert r.status_code == 403 and "file quota exceeded: group vision may hold 1 file" in r.text
    assert world.client.get(f"{API}/datasets", headers=alice).json() == []


def test_bad_input_is_refused_with_the_reason(world: World) -> None:
    alice = world.as_("alice")
    for name in ("a/b", "..", "bad\x01name", "-x", "uploads", "x" * 65):
        r = protocol.start(world.client, alice, name, V1)
        assert r.status_code == 422, (name, r.text)
    files = {"ok.txt": b"1"}
    uid = protocol.start(world.client, alice, "trav", files).json()["id"]
    sha = hashlib.sha256(b"1").hexdigest()
    for path, words in (
        ("../etc/passwd", "path traversal"),
        ("/etc/passwd", "must be relative"),
        ("a/./b", "path traversal"),
        # a NUL is refused by the request body itself, as in every body (api.schemas.RequestBody)
        ("nul\x00x", "'path' holds a NUL character"),
        ("ctl\x01x", "NUL or control character"),
        ("a\\b", "must be relative"),
    ):
        r = world.client.post(
            f"{API}/datasets/uploads/{uid}/files",
            json={"files": [{"path": path, "size": 1, "sha256": sha}]},
            headers=alice,
        )
        assert r.status_code == 422 and words in r.text, (path, r.text)
    assert protocol.register(world.client, alice, uid, files).status_code == 200
    r = protocol.chunk(world.client, alice, uid, "../ok.txt", 0, b"1")
    assert r.status_code == 422 and "path traversal" in r.text
    r = protocol.chunk(world.client, alice, uid, "ok.txt", 1, b"1")
    assert r.status_code == 409 and "expected a chunk at offset 0" in r.text
    r = protocol.chunk(world.client, alice, uid, "ok.txt", 0, b"2")  # wrong content
    assert r.status_code == 422 and "sha256 of the bytes received" in r.text
    r = protocol.complete(world.client, alice, uid)
    assert r.status_code == 409 and "not complete" in r.text
    assert world.client.get(f"{API}/datasets/trav", headers=alice).status_code == 404  # nothing visible
    assert protocol.chunk(world.client, alice, uid, "ok.txt", 0, b"1").status_code == 200
    assert protocol.complete(world.client, alice, uid).json()["version"] == 1
    r = world.client.put(f"{API}/datasets/trav/share", json={"add_groups": ["nl\x00p"]}, headers=alice)
    assert r.status_code == 422 and "'add_groups' holds a NUL character" in r.text, r.text
    r = world.client.put(f"{API}/datasets/trav/share", json={"add_groups": ["nl\x01p"]}, headers=alice)
    assert r.status_code == 422 and "control character" in r.text, r.text
    r = protocol.start(world.client, alice, "other", files, group="vis\x00ion")
    assert r.status_code == 422 and "'group' holds a NUL character" in r.text, r.text
    r = protocol.start(world.client, alice, "other", files, group="vis\x01ion")
    assert r.status_code == 422 and "control character" in r.text, r.text
    r = protocol.start(world.client, alice, "trav", files)  # the same content again
    assert r.status_code == 409 and "v1 already holds exactly this content" in r.text
    for url, words in (
        (f"{API}/datasets/nope", "no dataset named 'nope'"),
        (f"{API}/datasets/trav/versions/9/manifest", "has no version v9 (it has v1)"),
        (f"{API}/datasets/trav/versions/1/files/missing.txt", "has no file 'missing.txt'"),
        (f"{API}/datasets/trav/versions/1/files/..%2F..%2Fetc%2Fpasswd", "path traversal"),
    ):
        r = world.client.get(url, headers=alice)
        assert r.status_code in (404, 422) and words in r.text, (url, r.text)


def test_stale_uploads_and_orphans_are_cleaned(world: World) -> None:
    alice = world.as_("alice")
    files = {"a.bin": b"a" * 100, "b.bin": b"b" * 100}
    uid = protocol.start(world.client, alice, "stale", files).json()["id"]
    protocol.register(world.client, alice, uid, files)
    assert protocol.chunk(world.client, alice, uid, "a.bin", 0, files["a.bin"]).status_code == 200
    store = store_of(world)
    orphan = store.version_dir(999, 1)  # as a crash between the rename and the commit leaves it
    orphan.mkdir(parents=True)
    (orphan / "f").write_text("x")
    with world.session_factory() as db:
        assert uploads.clean_stale(db, store, time.time(), 3600.0) == []  # not idle long enough
        assert uploads.clean_stale(db, store, time.time() + 7200, 3600.0) == [uid]
        assert db.get(DatasetUpload, uid) is None
    assert not store.staging_dir(uid).exists() and not orphan.exists()
    assert os.listdir(store.trash) == []
    r = protocol.chunk(world.client, alice, uid, "b.bin", 0, files["b.bin"])
    assert r.status_code == 404 and "removed after its timeout" in r.text


def test_import_from_an_allowed_root_only(world: World, tmp_path: Path) -> None:
    root = tmp_path / "imports"
    (root / "ds" / "sub").mkdir(parents=True)
    (root / "ds" / "sub" / "f.txt").write_text("data")
    (tmp_path / "secret").write_text("s")
    world.client.app.state.settings.dataset_import_roots = str(root)  # type: ignore[attr-defined]
    admin = world.as_("admin")
    r = world.client.post(
        f"{API}/datasets/import", json={"name": "imp", "path": str(tmp_path)}, headers=admin
    )
    assert r.status_code == 403 and "not under an allowed import root" in r.text
    # A relative path (`corral data import imp imports/ds`) was refused with the schema's regex.
    r = world.client.post(f"{API}/datasets/import", json={"name": "imp", "path": "imports/ds"}, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["msg"] == (
        "field 'path' 'imports/ds' is not an absolute path on the server (e.g. /srv/imports/cifar)"
    ), r.text
    r = world.client.post(
        f"{API}/datasets/import", json={"name": "imp", "path": str(root / "ds")}, headers=admin
    )
    assert r.status_code == 201 and r.json()["files"] == 1, r.text
    (root / "ds" / "link").symlink_to(tmp_path / "secret")
    r = world.client.post(
        f"{API}/datasets/import", json={"name": "imp", "path": str(root / "ds")}, headers=admin
    )
    assert r.status_code == 422 and "a link pointing outside the dataset" in r.text
    got = world.client.get(f"{API}/datasets/imp/versions/1/files/sub/f.txt", headers=admin)
    assert got.content == b"data"


def test_upload_chunks_may_exceed_the_api_body_limit_up_to_the_chunk_size(world: World) -> None:
    settings = world.client.app.state.settings  # type: ignore[attr-defined]
    two_mib = {"big.bin": os.urandom(2 * 1024 * 1024)}
    assert settings.api_max_body_bytes < 2 * 1024 * 1024 <= settings.dataset_chunk_bytes
    r = protocol.push(world.client, world.as_("alice"), "bigchunk", two_mib)
    assert r.status_code == 201 and r.json()["bytes"] == 2 * 1024 * 1024, r.text
    r = world.client.post(
        f"{API}/datasets/uploads", content=b"x" * (2 * 1024 * 1024), headers=world.as_("alice")
    )
    assert r.status_code == 413 and "CORRAL_API_MAX_BODY_BYTES" in r.text


def test_an_upload_does_not_add_a_version_to_a_dataset_someone_else_created_meanwhile(world: World) -> None:
    # alice starts pushing a new name; carol (another user, another group) pushes the same name
    # and finishes first. alice's upload must not become v2 of carol's dataset.
    alice, carol = world.as_("alice"), world.as_("carol")
    uid = protocol.start(world.client, alice, "race", V1).json()["id"]
    assert protocol.register(world.client, alice, uid, V1).status_code == 200
    for path, data in V1.items():
        assert protocol.chunk(world.client, alice, uid, path, 0, data).status_code == 200
    assert protocol.push(world.client, carol, "race", V2).status_code == 201
    r = protocol.complete(world.client, alice, uid)
    assert r.status_code == 409 and "created by someone else while this upload ran" in r.text, r.text
    shown = world.client.get(f"{API}/datasets/race", headers=carol).json()
    assert [v["created_by"] for v in shown["versions"]] == ["carol"]
    usage = world.client.get(f"{API}/storage/usage", headers=world.as_("admin")).json()
    assert {u["name"]: u["dataset_bytes"] for u in usage if u["scope"] == "user"}.get("alice", 0) == 0


def test_a_push_resumes_only_an_upload_of_the_same_owner(world: World) -> None:
    # docs/datasets.md: an open upload of the same name, owner and digest is resumed. alice's push
    # for group vision, interrupted, must not be resumed by her push of the same files for herself.
    alice = world.as_("alice")
    for_group = protocol.start(world.client, alice, "owned", V1, group="vision").json()
    again = protocol.start(world.client, alice, "owned", V1, group="vision").json()
    assert again["resumed"] and again["id"] == for_group["id"]
    for_herself = protocol.start(world.client, alice, "owned", V1).json()
    assert not for_herself["resumed"] and for_herself["id"] != for_group["id"], for_herself
    with world.session_factory() as db:
        mine = db.get(DatasetUpload, for_herself["id"])
        assert mine is not None and mine.owner_group_id is None and mine.owner_user_id is not None


def _race(first: Callable[[], Any], second: Callable[[], Any], pause: Callable[[Event], None]) -> list[Any]:
    """Run `first` in a thread until it calls `pause` (a patched step), then `second` to its end in
    another, then let `first` go on: without a lock, `second` commits between `first`'s read and
    its write. With one, `second` waits for `first` (pause gives up after 2 s). Returns each one's
    result or the exception it raised."""
    results: list[Any] = [None, None]
    paused, second_done = Event(), Event()

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except Exception as exc:  # the test looks at it
            results[i] = exc
        finally:
            if i == 1:
                second_done.set()

    pause_first = [True]

    def hook() -> None:
        if pause_first[0] and threading.current_thread().name == "first":
            pause_first[0] = False
            paused.set()
            second_done.wait(2)

    pause(hook)  # type: ignore[arg-type]
    t1 = threading.Thread(target=run, args=(0, first), name="first")
    t1.start()
    assert paused.wait(10)
    t2 = threading.Thread(target=run, args=(1, second), name="second")
    t2.start()
    t1.join(30)
    t2.join(30)
    return results


def _principal(world: World, name: str) -> Principal:
    with world.session_factory() as db:
        user = db.query(User).filter(User.name == name).one()
        return load_principal(db, user, via="token")


def test_two_uploads_started_at_once_each_under_the_quota_together_over_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = world.client.put(
        f"{API}/storage/quota/group/vision", json={"max_bytes": 5000}, headers=world.as_("admin")
    )
    assert r.status_code == 200
    alice, store = _principal(world, "alice"), store_of(world)
    real_check = quotas.check_room

    def pause(hook: Callable[[], None]) -> None:
        def checked(*args: Any, **kwargs: Any) -> None:
            real_check(*args, **kwargs)
            hook()  # between the check and the insert of the upload

        monkeypatch.setattr(uploads, "check_room", checked)

    def start(name: str, fill: bytes) -> Callable[[], Any]:
        def go() -> Any:
            files = {"a.bin": fill * 3000}
            with world.session_factory() as db:
                upload, _ = uploads.start(
                    db, store, alice, name=name, group="vision", total_bytes=3000, total_files=1,
                    digest=manifest_digest(protocol.entries(files)), now=time.time(),
                )  # fmt: skip
                return upload.id

        return go

    results = _race(start("one", b"1"), start("two", b"2"), pause)
    refused = [r for r in results if isinstance(r, quotas.QuotaExceeded)]
    assert len(refused) == 1 and "+2.9 KiB in other uploads" in str(refused[0]), results
    with world.session_factory() as db:
        assert len(list(db.scalars(select(DatasetUpload)))) == 1


def test_two_versions_published_at_once_both_count_in_the_owners_usage(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, store = _principal(world, "alice"), store_of(world)
    ids = {}
    for name, files in (("left", V1), ("right", V2)):
        uid = protocol.start(world.client, world.as_("alice"), name, files).json()["id"]
        assert protocol.register(world.client, world.as_("alice"), uid, files).status_code == 200
        for path, data in files.items():
            assert protocol.chunk(world.client, world.as_("alice"), uid, path, 0, data).status_code == 200
        ids[name] = uid
    real_charge = quotas.charge_dataset

    def pause(hook: Callable[[], None]) -> None:
        def charged(*args: Any, **kwargs: Any) -> None:
            hook()  # after this publish read the account, before it adds to it
            real_charge(*args, **kwargs)

        monkeypatch.setattr(uploads, "charge_dataset", charged)

    def complete(uid: str) -> Callable[[], Any]:
        def go() -> Any:
            with world.session_factory() as db:
                return uploads.complete(db, store, alice, uid, time.time()).version

        return go

    assert _race(complete(ids["left"]), complete(ids["right"]), pause) == [1, 1]
    usage = world.client.get(f"{API}/storage/usage", headers=world.as_("alice")).json()
    total = sum(len(b) for b in V1.values()) + sum(len(b) for b in V2.values())
    assert [(u["dataset_bytes"]) for u in usage if u["scope"] == "user"] == [total]


def test_import_with_a_bad_group_name_is_refused_with_the_reason(world: World, tmp_path: Path) -> None:
    root = tmp_path / "imports"
    (root / "ds").mkdir(parents=True)
    (root / "ds" / "f.txt").write_text("data")
    world.client.app.state.settings.dataset_import_roots = str(root)  # type: ignore[attr-defined]
    body = {"name": "imp", "path": str(root / "ds"), "group": "vis\x00ion"}
    r = world.client.post(f"{API}/datasets/import", json=body, headers=world.as_("admin"))
    assert r.status_code == 422 and "'group' holds a NUL character" in r.text, r.text  # (any body)
    body["group"] = "vis\x01ion"
    r = world.client.post(f"{API}/datasets/import", json=body, headers=world.as_("admin"))
    assert r.status_code == 422 and "control character" in r.text, r.text


def test_pending_with_a_bad_after_is_refused_with_the_reason(world: World) -> None:
    alice = world.as_("alice")
    uid = protocol.start(world.client, alice, "pend", V1).json()["id"]
    assert protocol.register(world.client, alice, uid, V1).status_code == 200
    r = world.client.get(f"{API}/datasets/uploads/{uid}/pending", params={"after": "a\x00b"}, headers=alice)
    assert r.status_code == 422 and "holds a control character" in r.text, r.text
    r = world.client.get(
        f"{API}/datasets/uploads/{uid}/pending", params={"after": "labels.txt"}, headers=alice
    )
    assert [p["path"] for p in r.json()] == ["train/x.bin"]


def test_a_file_name_that_is_not_utf8_is_refused_by_the_push_naming_it(tmp_path: Path) -> None:
    # Python holds a non-UTF-8 file name as lone surrogates: the push's scan died on it with a
    # bare UnicodeEncodeError (in check_path's length check) that named no file.
    (tmp_path / "d").mkdir()
    with open(bytes(tmp_path / "d") + b"/bad-\xff.bin", "wb") as f:
        f.write(b"1")
    with pytest.raises(CorralError, match=r"udcff\.bin' is not UTF-8; rename the file"):
        transfer.scan(tmp_path / "d")


def test_a_complete_repeated_while_the_first_runs_answers_the_same_version(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client whose `complete` timed out sends it again while the first still runs: the second
    # must answer the version the first published (docs: "Repeating it ... returns the same version").
    alice, store = _principal(world, "alice"), store_of(world)
    uid = protocol.start(world.client, world.as_("alice"), "twice", V1).json()["id"]
    assert protocol.register(world.client, world.as_("alice"), uid, V1).status_code == 200
    for path, data in V1.items():
        assert protocol.chunk(world.client, world.as_("alice"), uid, path, 0, data).status_code == 200
    real_get = uploads.get

    def pause(hook: Callable[[], None]) -> None:
        def got(*args: Any, **kwargs: Any) -> Any:
            found = real_get(*args, **kwargs)
            hook()  # this complete has read the upload; the other one runs to its end now
            return found

        monkeypatch.setattr(uploads, "get", got)

    def complete() -> Any:
        with world.session_factory() as db:
            return uploads.complete(db, store, alice, uid, time.time()).version

    assert _race(complete, complete, pause) == [1, 1]
    with world.session_factory() as db:
        assert [v.version for v in db.scalars(select(DatasetVersion))] == [1]
    assert not store.manifest_file(1, 2).exists() and not any(store.data.glob("*/v2.manifest"))


def test_a_member_removed_from_the_group_cannot_complete_its_upload(world: World) -> None:
    # docs/datasets.md: members of the owning group push. alice starts a push for vision, is
    # removed from vision, then completes: no version of vision's dataset may come of it.
    uid = protocol.start(world.client, world.as_("alice"), "left", V1, group="vision").json()["id"]
    assert protocol.register(world.client, world.as_("alice"), uid, V1).status_code == 200
    for path, data in V1.items():
        assert protocol.chunk(world.client, world.as_("alice"), uid, path, 0, data).status_code == 200
    with world.session_factory() as db:
        alice_id = db.query(User.id).filter(User.name == "alice").scalar()
        vision = db.query(Group.id).filter(Group.name == "vision").scalar()
        db.query(Membership).filter(Membership.user_id == alice_id, Membership.group_id == vision).delete()
        db.commit()
    with world.session_factory() as db, pytest.raises(Forbidden, match="no longer a member of the group"):
        uploads.complete(db, store_of(world), _principal(world, "alice"), uid, time.time())
    with world.session_factory() as db:
        assert list(db.scalars(select(DatasetVersion))) == []


def test_the_same_files_registered_twice_at_once_are_registered_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client retrying `register_files` while the first call still runs: the second committed the
    # same rows between the first's read of the files registered and its insert, whose commit then
    # failed on the primary key (500). Both must answer, the files counted once.
    files = {**V1, "empty.txt": b""}  # an empty file: staged in the call, where the first pauses
    alice, store = _principal(world, "alice"), store_of(world)
    uid = protocol.start(world.client, world.as_("alice"), "regtwice", files).json()["id"]
    real_write = store.write_chunk

    def pause(hook: Callable[[], None]) -> None:
        def written(*args: Any, **kwargs: Any) -> None:
            hook()  # this call has read the files registered and added its rows, not committed
            real_write(*args, **kwargs)

        monkeypatch.setattr(store, "write_chunk", written)

    def register() -> Any:
        with world.session_factory() as db:
            upload = uploads.register_files(db, store, alice, uid, protocol.entries(files), time.time())
            return upload.registered_files

    assert _race(register, register, pause) == [3, 3]
    with world.session_factory() as db:
        upload = db.get(DatasetUpload, uid)
        assert upload is not None and (upload.registered_files, upload.registered_bytes) == (
            3,
            sum(len(b) for b in files.values()),
        )


def test_a_chunk_sent_twice_at_once_leaves_the_file_whole(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same chunk in flight twice (a client's retry; two pushes resuming one upload): the later
    # request had passed its offset check before the first recorded the chunk, then wrote it again
    # and cut the file at its end, over the next chunk written meanwhile (the file's checksum had
    # been checked already: the bytes were gone, and the database went back to half the file).
    first, second = b"a" * 1000, b"b" * 1000
    files = {"big.bin": first + second}
    alice, store = _principal(world, "alice"), store_of(world)
    uid = protocol.start(world.client, world.as_("alice"), "dupchunk", files).json()["id"]
    assert protocol.register(world.client, world.as_("alice"), uid, files).status_code == 200
    real_check = uploads.check_room

    def pause(hook: Callable[[], None]) -> None:
        def checked(*args: Any, **kwargs: Any) -> None:
            hook()  # this request has read the offset received, not written yet
            real_check(*args, **kwargs)

        monkeypatch.setattr(uploads, "check_room", checked)

    def chunk(offset: int, data: bytes) -> Any:
        with world.session_factory() as db:
            try:
                return uploads.write_chunk(
                    db, store, alice, uid, "big.bin", offset, data, time.time()
                ).received
            except Conflict as exc:
                return exc.message

    def retry_then_next() -> Any:
        return [chunk(0, first), chunk(1000, second)]

    results = _race(lambda: chunk(0, first), retry_then_next, pause)
    staged = (store.staging_dir(uid) / "big.bin").read_bytes()
    assert (len(staged), staged == first + second) == (2000, True), results
    answers = [results[0], results[1][0]]  # the two requests for the first chunk
    assert sorted(answers, key=str)[1] == 1000, results  # one of them wrote it, the other was told
    refused = str(min(answers, key=str))
    assert re.fullmatch(r"'big.bin': expected a chunk at offset [12]000, got 0", refused), results
    with world.session_factory() as db:
        upload = db.get(DatasetUpload, uid)
        assert upload is not None and upload.received_bytes == 2000
    assert protocol.complete(world.client, world.as_("alice"), uid).status_code == 201


@pytest.mark.parametrize("step", ["check_room", "write_at"])
def test_a_chunk_sent_while_its_upload_is_aborted_is_refused_and_leaves_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    # The abort commits while the chunk is on its way: before the file is opened (check_room), the
    # write made the staging directory again and its commit matched no row (500, half a file left
    # in a staging directory no upload names); after it (write_at), the commit matched no row (500).
    alice, store = _principal(world, "alice"), store_of(world)
    uid = protocol.start(world.client, world.as_("alice"), "aborted", V1).json()["id"]
    assert protocol.register(world.client, world.as_("alice"), uid, V1).status_code == 200
    real_step = getattr(uploads, step)

    def pause(hook: Callable[[], None]) -> None:
        def paused(*args: Any, **kwargs: Any) -> Any:
            hook()  # the abort runs to its end now
            return real_step(*args, **kwargs)

        monkeypatch.setattr(uploads, step, paused)

    def chunk() -> Any:
        with world.session_factory() as db:
            uploads.write_chunk(db, store, alice, uid, "train/x.bin", 0, V1["train/x.bin"], time.time())

    def abort() -> Any:
        with world.session_factory() as db:
            uploads.abort(db, store, alice, uid)

    results = _race(chunk, abort, pause)
    assert isinstance(results[0], Conflict) and results[1] is None, results
    assert f"upload {uid} was aborted" in results[0].message
    assert staged_entries(world) == [] and not any(store.trash.iterdir())
    r = protocol.chunk(world.client, world.as_("alice"), uid, "labels.txt", 0, V1["labels.txt"])
    assert r.status_code == 404 and "(aborted, finished long ago" in r.text, r.text  # one sent after


def test_a_deleted_versions_number_is_never_given_again(world: World) -> None:
    # v2 (the latest) deleted, the next push became v2 again: `data/name@2`, as jobs and lineage
    # recorded it, then meant other data.
    alice = world.as_("alice")
    assert protocol.push(world.client, alice, "renum", V1).json()["version"] == 1
    assert protocol.push(world.client, alice, "renum", V2).json()["version"] == 2
    assert world.client.delete(f"{API}/datasets/renum/versions/2", headers=alice).status_code == 204
    third = {"other.txt": b"something else"}
    assert protocol.push(world.client, alice, "renum", third).json()["version"] == 3
    shown = world.client.get(f"{API}/datasets/renum", headers=alice).json()
    assert [v["version"] for v in shown["versions"]] == [1, 3] and shown["latest"] == 3
    with (
        world.session_factory() as db,
        pytest.raises(service.DatasetRefError, match=r"has no version v2 \(it has v1, v3\)"),
    ):
        service.resolve_dataset_ref(db, "alice", {"vision"}, "data/renum@2", store=store_of(world))


def test_a_chunk_reads_its_upload_row_once(world: World, db_engine: Any) -> None:
    """The upload's row is read once, before the file's lock (owner, state, quota); after the lock
    only the file's row is read again (the one that counts), and the upload's bytes are added in
    SQL by its id."""
    alice = world.as_("alice")
    files = {"a.bin": b"y" * 100}
    uid = protocol.start(world.client, alice, "once", files).json()["id"]
    assert protocol.register(world.client, alice, uid, files).status_code == 200
    seen: list[str] = []

    def log(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    sa_event.listen(db_engine, "before_cursor_execute", log)
    try:
        r = protocol.chunk(world.client, alice, uid, "a.bin", 0, files["a.bin"][:50])
    finally:
        sa_event.remove(db_engine, "before_cursor_execute", log)
    assert r.status_code == 200 and r.json()["received"] == 50
    reads = [s for s in seen if s.lstrip().upper().startswith("SELECT") and "FROM dataset_uploads" in s]
    assert len(reads) == 1, reads
    assert protocol.chunk(world.client, alice, uid, "a.bin", 50, files["a.bin"][50:]).status_code == 200
    assert protocol.complete(world.client, alice, uid).status_code == 201


def test_a_share_to_a_group_not_yours_reads_the_same_whether_it_exists_or_not(world: World) -> None:
    """bob (vision's admin) sharing vision's dataset with nlp, a group he is not in, was done
    (200) while a share with 'nosuch' answered 404 "no group named 'nosuch'": the answers told
    which group names exist. Both are now the same 404, naming what he may do."""
    bob, admin = world.as_("bob"), world.as_("admin")
    assert protocol.push(world.client, bob, "cifar", V1, group="vision").status_code == 201

    def share(group: str, headers: dict[str, str], key: str = "add_groups") -> Any:
        return world.client.put(f"{API}/datasets/cifar/share", json={key: [group]}, headers=headers)

    answers = {g: share(g, bob) for g in ("nlp", "nosuch")}
    assert {g: r.status_code for g, r in answers.items()} == {"nlp": 404, "nosuch": 404}
    detail = answers["nlp"].json()["detail"]
    assert detail == answers["nosuch"].json()["detail"].replace("nosuch", "nlp"), detail
    assert "share with a group you belong to (vision) or make the dataset public" in detail, detail
    assert share("vision", bob).json()["shared_with"] == ["vision"]  # his own group: shared
    # a platform admin shares with any group (and learns a missing one is missing)
    assert share("nlp", admin).json()["shared_with"] == ["nlp", "vision"]
    assert share("nosuch", admin).json()["detail"] == "no group named 'nosuch'"
    # a group it is shared with already is named in the view: bob may keep or remove it
    assert share("nlp", bob).json()["shared_with"] == ["nlp", "vision"]
    assert share("nlp", bob, "remove_groups").json()["shared_with"] == ["vision"]
    assert share("nosuch", bob, "remove_groups").json()["shared_with"] == ["vision"]  # nothing to remove


def test_the_rest_api_refuses_a_bad_dataset_name_or_version_in_words(world: World) -> None:
    # The SDK checks a name before sending it, in words; the REST API itself answered with its
    # regexes ("path parameter 'name' 'x.' does not match pattern ^[A-Za-z0-9](?:...)?$").
    alice = world.as_("alice")
    name_words = (
        "is not a dataset name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
        "digit and not ending with '.'"
    )
    for method, path, body, said in (
        ("GET", f"{API}/datasets/x.", None, f"path parameter 'name' 'x.' {name_words}"),
        ("POST", f"{API}/datasets/uploads", {"name": "x.", "bytes": 1, "files": 1, "digest": "0" * 64},
         f"field 'name' 'x.' {name_words}"),
        ("DELETE", f"{API}/datasets/cifar/versions/0",  None,
         "path parameter 'version' '0' is not a version: write a number such as 3 or v3"),
        ("GET", f"{API}/datasets/cifar/versions/newest/manifest", None,
         "path parameter 'version' 'newest' is not a version: write a number such as 3 or v3, or latest"),
    ):  # fmt: skip
        r = world.client.request(method, path, json=body, headers=alice)
        assert r.status_code == 422, (path, r.text)
        assert r.json()["detail"][0]["msg"] == said, (path, r.text)
