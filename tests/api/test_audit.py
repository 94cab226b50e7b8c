"""The admin audit log: every state-changing route records who/what/when/where with before/after
(the route list comes from the OpenAPI schema, so a new route fails here until it records or is
exempted with its reason), nothing is recorded for a rolled-back change, no secret is stored,
the table is append-only in the database itself (SQLite and PostgreSQL), and the REST listing's
filters, pages and rights. Every test runs on SQLite and PostgreSQL (tests/api/conftest.py)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from corral.api.deps import CSRF_HEADER
from corral.cli import audit as audit_cli
from corral.config import Settings
from corral.db.audit_models import AuditRecord
from corral.db.base import Base
from corral.db.models import Node
from corral.db.session import make_engine
from corral.server.context import LoopMemory, ServerContext
from corral.server.retention import purge_audit_log
from corral.services import audit
from corral.services.auth import Principal
from tests.api.audit_oncall import ONCALL_CALLS
from tests.api.conftest import ALICE_PASSWORD, SIMPLE_JOB, World
from tests.api.helpers import add_node
from tests.api.test_cli import run, server_url
from tests.datasets import protocol as dataset_protocol

__all__ = ["server_url"]

API = "/api/v1"

# Non-GET routes that record nothing, and why (docs/security.md, "Admin audit log").
EXEMPT = {
    ("POST", "/api/v1/jobs"): "a user's own job submission: the job row is its record (high volume)",
    ("POST", "/api/v1/alerts/webhook"): "Alertmanager's delivery, not a principal's action",
    # `--code` uploads: a user's own content-addressed files, like a submission; the job that runs
    # the snapshot is their record, and a blob changes nothing anyone else sees.
    ("POST", "/api/v1/code/missing"): "a user's own code upload (asks which blobs are missing)",
    ("PUT", "/api/v1/code/blobs/{sha}"): "a user's own code upload (one chunk of a blob)",
    ("POST", "/api/v1/code/snapshots"): "a user's own code upload (the manifest)",
    # A dataset upload in progress is the uploader's own staging area; the version it makes is
    # recorded (dataset.version.create) when `complete` publishes it.
    ("POST", "/api/v1/datasets/uploads"): "a dataset upload starting (its version is recorded)",
    ("POST", "/api/v1/datasets/uploads/{upload_id}/files"): "a dataset upload's file list",
    ("PUT", "/api/v1/datasets/uploads/{upload_id}/chunk"): "a dataset upload's bytes",
    ("DELETE", "/api/v1/datasets/uploads/{upload_id}"): "the uploader abandoning their own upload",
    ("POST", "/api/v1/templates/{name}/use"): "a job submission from a template: the job row is its record",
}


def audit_rows(world: World) -> list[AuditRecord]:
    with world.session_factory() as db:
        return list(db.scalars(sa.select(AuditRecord).order_by(AuditRecord.id)))


def ssh_key() -> str:
    blob = b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(32)  # a whole ed25519 key (all zeros)
    return "ssh-ed25519 " + base64.b64encode(blob).decode() + " me@host"


def login(world: World) -> tuple[str, str]:
    """Log alice in; (session cookie, csrf token)."""
    r = world.client.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert r.status_code == 200, r.text
    cookie = world.client.cookies.get("corral_session")
    assert cookie is not None
    world.client.cookies.clear()
    return cookie, r.json()["csrf_token"]


Call = Callable[[World], tuple[str, str, dict[str, Any]]]  # -> (method, path, request kwargs)


def _logout(w: World) -> tuple[str, str, dict[str, Any]]:
    cookie, csrf = login(w)
    w.client.cookies.set("corral_session", cookie)
    return "POST", f"{API}/auth/logout", {"headers": {CSRF_HEADER: csrf}}


def _end_session(w: World) -> tuple[str, str, dict[str, Any]]:
    login(w)
    session_id = w.client.get(f"{API}/sessions", params={"all": True}, headers=w.as_("admin")).json()[0]["id"]
    return "DELETE", f"{API}/sessions/{session_id}", {}


def _unlock(w: World) -> tuple[str, str, dict[str, Any]]:
    w.client.post(f"{API}/auth/login", json={"username": "nobody", "password": "wrong-password"})
    lockout = w.client.get(f"{API}/auth/lockouts", headers=w.as_("admin")).json()[0]
    return "DELETE", f"{API}/auth/lockouts/{lockout['id']}", {}


def _queued_job(w: World) -> int:
    r = w.client.post(f"{API}/jobs", json=SIMPLE_JOB, headers=w.as_("alice"))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _release_job(w: World) -> tuple[str, str, dict[str, Any]]:
    job_id = _queued_job(w)
    assert w.client.post(f"{API}/jobs/{job_id}/hold", headers=w.as_("alice")).status_code == 200
    return "POST", f"{API}/jobs/{job_id}/release", {}


def _by_labels(verb: str, held: bool = False) -> Call:
    """POST /jobs/{verb} by label on one fresh job of alice's, acted on by the admin (user=alice):
    each job it touches is recorded as the single-job route records it."""

    def call(w: World) -> tuple[str, str, dict[str, Any]]:
        label = f"audit-{verb}"
        r = w.client.post(
            f"{API}/jobs", json={**SIMPLE_JOB, "labels": {"set": label}}, headers=w.as_("alice")
        )
        assert r.status_code == 201, r.text
        if held:
            assert (
                w.client.post(f"{API}/jobs/{r.json()['id']}/hold", headers=w.as_("alice")).status_code == 200
            )
        return "POST", f"{API}/jobs/{verb}", {"json": {"labels": [f"set={label}"], "user": "alice"}}

    return call


def _delete_job(w: World) -> tuple[str, str, dict[str, Any]]:
    job_id = _queued_job(w)
    assert w.client.post(f"{API}/jobs/{job_id}/cancel", headers=w.as_("alice")).status_code == 200
    return "DELETE", f"{API}/jobs/{job_id}", {}


def _delete_ssh_key(w: World) -> tuple[str, str, dict[str, Any]]:
    r = w.client.post(f"{API}/ssh-keys", json={"name": "k", "public_key": ssh_key()}, headers=w.as_("admin"))
    return "DELETE", f"{API}/ssh-keys/{r.json()['id']}", {}


def _revoke_token(w: World) -> tuple[str, str, dict[str, Any]]:
    r = w.client.post(f"{API}/tokens", json={"name": "t"}, headers=w.as_("admin"))
    return "DELETE", f"{API}/tokens/{r.json()['id']}", {}


def _remove_member(w: World) -> tuple[str, str, dict[str, Any]]:
    r = w.client.post(f"{API}/groups/vision/members", json={"user": "carol"}, headers=w.as_("admin"))
    assert r.status_code == 201, r.text
    return "DELETE", f"{API}/groups/vision/members/carol", {}


def _remove_quota(w: World) -> tuple[str, str, dict[str, Any]]:
    body = {"gpu_model": "A100", "guaranteed": 1}
    r = w.client.put(f"{API}/groups/vision/quota", json=body, headers=w.as_("admin"))
    assert r.status_code == 200, r.text
    return "DELETE", f"{API}/groups/vision/quota", {"params": {"gpu_model": "A100"}}


def _activate(w: World) -> tuple[str, str, dict[str, Any]]:
    """Activating an active user changes nothing and records nothing: deactivate carol first."""
    r = w.client.post(f"{API}/users/carol/deactivate", headers=w.as_("admin"))
    assert r.status_code == 200 and r.json()["changed"] is True, r.text
    return "POST", f"{API}/users/carol/activate", {}


def _node_action(w: World) -> tuple[str, str, dict[str, Any]]:
    with w.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    return "POST", f"{API}/nodes/n1/cordon", {}


def _node_remove(w: World) -> tuple[str, str, dict[str, Any]]:
    with w.session_factory() as db:  # only a node out of service can be removed
        add_node(db, "gone", state="down")
        db.commit()
    return "DELETE", f"{API}/nodes/gone", {}


def _gpu_fault(w: World) -> tuple[str, str, dict[str, Any]]:
    with w.session_factory() as db:  # a fault is refused for a GPU the cluster does not have
        add_node(db, "n2")
        db.commit()
    return "POST", f"{API}/chaos/gpus/n2/0", {"json": {"ecc_uncorrected": 1}}


def _gpu_quarantine(w: World) -> tuple[str, str, dict[str, Any]]:
    with w.session_factory() as db:
        add_node(db, "g1")
        db.commit()
    return "POST", f"{API}/nodes/g1/gpus/1/quarantine", {}


def _delete_secret(w: World) -> tuple[str, str, dict[str, Any]]:
    r = w.client.put(f"{API}/secrets/gone", json={"value": "x"}, headers=w.as_("admin"))
    assert r.status_code == 201, r.text
    return "DELETE", f"{API}/secrets/gone", {}


_DATASETS = iter(range(1, 1_000_000))


def _dataset(w: World) -> str:
    """A fresh dataset with one version, pushed by the admin."""
    name = f"ds{next(_DATASETS)}"
    r = dataset_protocol.push(w.client, w.as_("admin"), name, {"a.txt": b"hello"})
    assert r.status_code == 201, r.text
    return name


def _complete_upload(w: World) -> tuple[str, str, dict[str, Any]]:
    files = {"a.txt": b"payload"}
    r = dataset_protocol.start(w.client, w.as_("admin"), f"up{next(_DATASETS)}", files)
    assert r.status_code == 201, r.text
    upload_id = r.json()["id"]
    assert dataset_protocol.register(w.client, w.as_("admin"), upload_id, files).status_code == 200
    r = dataset_protocol.chunk(w.client, w.as_("admin"), upload_id, "a.txt", 0, files["a.txt"])
    assert r.status_code == 200, r.text
    return "POST", f"{API}/datasets/uploads/{upload_id}/complete", {}


def _import_dataset(w: World) -> tuple[str, str, dict[str, Any]]:
    settings = w.client.app.state.settings  # type: ignore[attr-defined]
    root = settings.home / "imports"
    (root / "ds").mkdir(parents=True, exist_ok=True)
    (root / "ds" / "f.txt").write_text("data")
    settings.dataset_import_roots = str(root)
    return (
        "POST",
        f"{API}/datasets/import",
        {"json": {"name": f"imp{next(_DATASETS)}", "path": str(root / "ds")}},
    )


def _create_environment(w: World) -> tuple[str, str, dict[str, Any]]:
    settings = w.client.app.state.settings  # type: ignore[attr-defined]
    settings.env_find_links = settings.home / "wheels"  # builds need an index; this one queues
    body = {"name": f"env{next(_DATASETS)}", "source": "numpy\n"}
    return "POST", f"{API}/environments", {"json": body}


def _failed_environment(w: World) -> tuple[str, str, dict[str, Any]]:
    from corral.db.environment_models import Environment, EnvironmentVersion
    from corral.db.models import User

    name = f"envf{next(_DATASETS)}"
    with w.session_factory() as db:
        owner = db.scalar(sa.select(User.id).where(User.name == "admin"))
        env = Environment(name=name, owner_id=owner, visibility="private", official=False, created_at=1.0)
        db.add(env)
        db.flush()
        db.add(
            EnvironmentVersion(
                environment_id=env.id,
                version=1,
                state="failed",
                source_kind="requirements",
                source="x",
                python="3",
                created_by="admin",
                created_at=1.0,
            )
        )
        db.commit()
    return "DELETE", f"{API}/environments/{name}", {}


def _workspace(w: World, name: str, start: bool) -> str:
    with w.session_factory() as db:
        if db.get(Node, "wsn") is None:
            add_node(db, "wsn")
            db.commit()
    body = {"name": name, "start": start}
    assert w.client.post(f"{API}/workspaces", json=body, headers=w.as_("admin")).status_code == 201
    return f"{API}/workspaces/{name}"


def _oom_job(w: World) -> tuple[str, str, dict[str, Any]]:
    """A job with a running attempt (written as the loops would), OOM-killed by chaos."""
    from corral.db.models import Attempt

    job_id = _queued_job(w)
    with w.session_factory() as db:
        db.add(Attempt(job_id=job_id, number=1, state="running", created_at=time.time()))
        db.commit()
    return "POST", f"{API}/chaos/jobs/{job_id}/oom", {"json": {"force": True}}


def _incident(w: World, resolved: bool = False) -> int:
    """A fresh SEV4 incident (resolved: ready to close)."""
    from corral.services import incidents

    with w.session_factory() as db:
        now = time.time()
        i = incidents.open_or_update(db, fingerprint=f"audit/{now}", title="t", severity="SEV4",
                                     source="manual", labels={}, links={}, now=now)  # fmt: skip
        if resolved:
            incidents.resolve(db, i.id, "admin", now)
        db.commit()
        return i.id


def _incident_call(action: str, method: str = "POST", **kwargs: Any) -> Call:
    suffix = f"/{action}" if action else ""
    return lambda w: (method, f"{API}/incidents/{_incident(w, action == 'close')}{suffix}", dict(kwargs))


_POSTMORTEM = {"summary": "s", "impact": "i", "root_cause": "r", "action_items": []}


# One successful call of each state-changing route, made as the admin (unless the call says
# otherwise), and the action it must record.
# -- catalogues (corral.catalog): templates and models -------------------------------------------
_CATALOG = iter(range(1, 1_000_000))
TEMPLATE_SPEC = {"name": "t", "command": "echo hi"}


def _template(w: World) -> str:
    name = f"tpl{next(_CATALOG)}"
    r = w.client.post(f"{API}/templates", json={"name": name, "spec": TEMPLATE_SPEC}, headers=w.as_("admin"))
    assert r.status_code == 201, r.text
    return name


def _succeeded_job_with_outputs(w: World) -> int:
    from corral.db.models import Job
    from corral.storage.layout import outputs_dir

    job_id = _queued_job(w)
    with w.session_factory() as db:
        db.execute(sa.update(Job).where(Job.id == job_id).values(state="succeeded", finished_at=time.time()))
        db.commit()
    top = outputs_dir(cast(Any, w.client.app).state.settings.storage_path, job_id)
    top.mkdir(parents=True, exist_ok=True)
    (top / "w.bin").write_bytes(b"weights")
    return job_id


def _register(w: World) -> tuple[str, str, dict[str, Any]]:
    job_id = _succeeded_job_with_outputs(w)
    return "POST", f"{API}/models/m{next(_CATALOG)}/versions", {"json": {"job_id": job_id}}


def _model(w: World) -> str:
    method, path, kwargs = _register(w)
    r = w.client.request(method, path, headers=w.as_("admin"), **kwargs)
    assert r.status_code == 201, r.text
    return path.split("/")[-2]


CALLS: dict[tuple[str, str], tuple[Call, str]] = {
    ("POST", "/api/v1/auth/login"): (
        lambda w: ("POST", f"{API}/auth/login", {"json": {"username": "alice", "password": ALICE_PASSWORD}}),
        "session.create",
    ),
    ("POST", "/api/v1/auth/logout"): (_logout, "session.end"),
    ("DELETE", "/api/v1/sessions/{session_id}"): (_end_session, "session.end"),
    ("DELETE", "/api/v1/auth/lockouts/{lockout_id}"): (_unlock, "auth.unlock"),
    ("POST", "/api/v1/jobs/{job_id}/cancel"): (
        lambda w: ("POST", f"{API}/jobs/{_queued_job(w)}/cancel", {}),
        "job.cancel",
    ),
    ("POST", "/api/v1/jobs/{job_id}/hold"): (
        lambda w: ("POST", f"{API}/jobs/{_queued_job(w)}/hold", {}),
        "job.hold",
    ),
    ("POST", "/api/v1/jobs/{job_id}/release"): (_release_job, "job.release"),
    ("PATCH", "/api/v1/jobs/{job_id}/labels"): (  # by the admin: not the owner's own edit
        lambda w: ("PATCH", f"{API}/jobs/{_queued_job(w)}/labels", {"json": {"labels": {"trial": "8"}}}),
        "job.labels",
    ),
    ("POST", "/api/v1/jobs/cancel"): (_by_labels("cancel"), "job.cancel"),
    ("POST", "/api/v1/jobs/hold"): (_by_labels("hold"), "job.hold"),
    ("POST", "/api/v1/jobs/release"): (_by_labels("release", held=True), "job.release"),
    ("DELETE", "/api/v1/jobs/{job_id}"): (_delete_job, "job.delete"),
    ("POST", "/api/v1/nodes/{name}/{action}"): (_node_action, "node.cordon"),
    ("DELETE", "/api/v1/nodes/{name}"): (_node_remove, "node.remove"),
    ("POST", "/api/v1/groups"): (
        lambda w: ("POST", f"{API}/groups", {"json": {"name": "g2"}}),
        "group.create",
    ),
    ("PUT", "/api/v1/groups/{name}/quota"): (
        lambda w: ("PUT", f"{API}/groups/vision/quota", {"json": {"gpu_model": "*", "guaranteed": 2}}),
        "group.quota.set",
    ),
    ("DELETE", "/api/v1/groups/{name}/quota"): (_remove_quota, "group.quota.remove"),
    ("POST", "/api/v1/groups/{name}/members"): (
        lambda w: ("POST", f"{API}/groups/vision/members", {"json": {"user": "carol"}}),
        "group.member.add",
    ),
    ("DELETE", "/api/v1/groups/{name}/members/{user}"): (
        _remove_member,
        "group.member.remove",
    ),
    ("POST", "/api/v1/users/{name}/deactivate"): (
        lambda w: ("POST", f"{API}/users/carol/deactivate", {}),
        "user.deactivate",
    ),
    ("POST", "/api/v1/users/{name}/activate"): (_activate, "user.activate"),
    ("POST", "/api/v1/users"): (
        lambda w: ("POST", f"{API}/users", {"json": {"name": "dave"}}),
        "user.create",
    ),
    ("PUT", "/api/v1/users/{name}/default-group"): (
        lambda w: ("PUT", f"{API}/users/alice/default-group", {"json": {"group": "vision"}}),
        "user.default_group.set",
    ),
    ("PUT", "/api/v1/users/{name}/password"): (
        lambda w: ("PUT", f"{API}/users/carol/password", {"json": {"password": "carol-password-1"}}),
        "user.passwd",
    ),
    ("POST", "/api/v1/ssh-keys"): (
        lambda w: ("POST", f"{API}/ssh-keys", {"json": {"name": "laptop", "public_key": ssh_key()}}),
        "ssh_key.add",
    ),
    ("DELETE", "/api/v1/ssh-keys/{key_id}"): (_delete_ssh_key, "ssh_key.delete"),
    ("POST", "/api/v1/tokens"): (
        lambda w: ("POST", f"{API}/tokens", {"json": {"name": "ci"}}),
        "token.create",
    ),
    ("DELETE", "/api/v1/tokens/{token_id}"): (_revoke_token, "token.revoke"),
    ("POST", "/api/v1/chaos/nodes/{node}/{action}"): (
        lambda w: ("POST", f"{API}/chaos/nodes/n1/up", {}),
        "chaos.node.up",
    ),
    ("PUT", "/api/v1/secrets/{name}"): (
        lambda w: ("PUT", f"{API}/secrets/wandb", {"json": {"value": "s3cr3t-value"}}),
        "secret.set",
    ),
    ("DELETE", "/api/v1/secrets/{name}"): (_delete_secret, "secret.delete"),
    ("POST", "/api/v1/datasets/uploads/{upload_id}/complete"): (_complete_upload, "dataset.version.create"),
    ("PUT", "/api/v1/datasets/{name}/share"): (
        lambda w: ("PUT", f"{API}/datasets/{_dataset(w)}/share", {"json": {"add_groups": ["vision"]}}),
        "dataset.share",
    ),
    ("DELETE", "/api/v1/datasets/{name}/versions/{version}"): (
        lambda w: ("DELETE", f"{API}/datasets/{_dataset(w)}/versions/1", {}),
        "dataset.version.delete",
    ),
    ("DELETE", "/api/v1/datasets/{name}"): (
        lambda w: ("DELETE", f"{API}/datasets/{_dataset(w)}", {}),
        "dataset.delete",
    ),
    ("POST", "/api/v1/datasets/import"): (_import_dataset, "dataset.import"),
    ("POST", "/api/v1/environments"): (_create_environment, "environment.version.create"),
    ("DELETE", "/api/v1/environments/{name}"): (_failed_environment, "environment.delete"),
    ("POST", "/api/v1/templates"): (
        lambda w: ("POST", f"{API}/templates", {"json": {"name": "tpl-new", "spec": TEMPLATE_SPEC}}),
        "template.publish",
    ),
    ("POST", "/api/v1/templates/{name}/share"): (
        lambda w: ("POST", f"{API}/templates/{_template(w)}/share", {"json": {"visibility": "public"}}),
        "template.share",
    ),
    ("DELETE", "/api/v1/templates/{name}"): (
        lambda w: ("DELETE", f"{API}/templates/{_template(w)}", {}),
        "template.delete",
    ),
    ("POST", "/api/v1/models/{name}/versions"): (_register, "model.version.register"),
    ("POST", "/api/v1/models/{name}/versions/{version}/stage"): (
        lambda w: ("POST", f"{API}/models/{_model(w)}/versions/1/stage", {"json": {"stage": "staging"}}),
        "model.version.promote",
    ),
    ("POST", "/api/v1/models/{name}/share"): (
        lambda w: ("POST", f"{API}/models/{_model(w)}/share", {"json": {"visibility": "public"}}),
        "model.share",
    ),
    ("DELETE", "/api/v1/models/{name}/versions/{version}"): (
        lambda w: ("DELETE", f"{API}/models/{_model(w)}/versions/1", {}),
        "model.version.delete",
    ),
    ("DELETE", "/api/v1/models/{name}"): (
        lambda w: ("DELETE", f"{API}/models/{_model(w)}", {}),
        "model.delete",
    ),
    ("PUT", "/api/v1/storage/quota/{scope}/{name}"): (
        lambda w: ("PUT", f"{API}/storage/quota/group/vision", {"json": {"max_bytes": 10**9}}),
        "storage.quota.set",
    ),
    ("POST", "/api/v1/nodes/{name}/gpus/{index}/{action}"): (
        _gpu_quarantine,
        "gpu.quarantine",
    ),
    ("POST", "/api/v1/storage/identities"): (
        lambda w: ("POST", f"{API}/storage/identities", {}),
        "storage.identities.allocate",
    ),
    ("POST", "/api/v1/workspaces"): (
        lambda w: ("POST", f"{API}/workspaces", {"json": {"name": "wsa", "start": False}}),
        "workspace.create",
    ),
    ("POST", "/api/v1/workspaces/{name}/start"): (
        lambda w: ("POST", _workspace(w, "wsb", False) + "/start", {}),
        "workspace.start",
    ),
    ("POST", "/api/v1/workspaces/{name}/stop"): (
        lambda w: ("POST", _workspace(w, "wsc", True) + "/stop", {}),
        "workspace.stop",
    ),
    ("DELETE", "/api/v1/workspaces/{name}"): (
        lambda w: ("DELETE", _workspace(w, "wsd", False), {}),
        "workspace.remove",
    ),
    ("PUT", "/api/v1/workspaces/policies/{group}"): (
        lambda w: ("PUT", f"{API}/workspaces/policies/vision", {"json": {"max_idle_timeout": "8h"}}),
        "workspace.policy.set",
    ),
    ("POST", "/api/v1/chaos/gpus/{node}/{index}"): (
        _gpu_fault,
        "chaos.gpu.fault",
    ),
    ("POST", "/api/v1/incidents/{incident_id}/ack"): (_incident_call("ack"), "incident.ack"),
    ("POST", "/api/v1/incidents/{incident_id}/comment"): (
        _incident_call("comment", json={"text": "x"}),
        "incident.comment",
    ),
    ("POST", "/api/v1/incidents/{incident_id}/mitigate"): (
        _incident_call("mitigate", json={}),
        "incident.mitigate",
    ),
    ("POST", "/api/v1/incidents/{incident_id}/resolve"): (
        _incident_call("resolve", json={}),
        "incident.resolve",
    ),
    ("POST", "/api/v1/incidents/{incident_id}/close"): (_incident_call("close"), "incident.close"),
    ("PATCH", "/api/v1/incidents/{incident_id}"): (
        _incident_call("", "PATCH", json={"severity": "SEV3"}),
        "incident.edit",
    ),
    ("PUT", "/api/v1/incidents/{incident_id}/postmortem"): (
        _incident_call("postmortem", "PUT", json=_POSTMORTEM),
        "incident.postmortem",
    ),
    ("POST", "/api/v1/chaos/jobs/{job_id}/oom"): (_oom_job, "chaos.job.oom"),
    ("PUT", "/api/v1/remediation/rules"): (
        lambda w: ("PUT", f"{API}/remediation/rules", {"json": {"text": "version: 1\nrules: []\n"}}),
        "remediation.rules.apply",
    ),
    ("PUT", "/api/v1/users/{name}/job-notify"): (
        lambda w: ("PUT", f"{API}/users/alice/job-notify", {"json": {"notify": {"on": ["failed"]}}}),
        "job_notify.default",
    ),
}
CALLS.update(ONCALL_CALLS)  # on-call, escalation and acknowledge links (tests/api/audit_oncall.py)


def state_changing_routes(world: World) -> set[tuple[str, str]]:
    schema = world.client.get("/openapi.json").json()
    return {
        (method.upper(), path)
        for path, ops in schema["paths"].items()
        for method in ops
        if method.upper() in ("POST", "PUT", "PATCH", "DELETE")
    }


def test_every_state_changing_route_records(world: World) -> None:
    routes = state_changing_routes(world)
    missing = routes - set(CALLS) - set(EXEMPT)
    assert not missing, f"routes that neither record an audit entry here nor are exempted: {sorted(missing)}"
    assert not (set(CALLS) | set(EXEMPT)) - routes, "a listed route is gone: update CALLS/EXEMPT"
    for route, (make_call, action) in sorted(CALLS.items()):
        method, path, kwargs = make_call(world)
        if route[1] not in ("/api/v1/auth/login", "/api/v1/auth/logout"):
            kwargs.setdefault("headers", world.as_("admin"))
        seen = len(audit_rows(world))
        r = world.client.request(method, path, **kwargs)
        assert r.status_code < 300, (route, r.status_code, r.text)
        new = audit_rows(world)[seen:]
        assert [row.action for row in new][-1:] == [action], (route, [row.action for row in new])
        row = new[-1]
        assert row.source == "testclient" and row.at > time.time() - 60, (route, row.source)
        assert row.actor == ("alice" if route[1].startswith("/api/v1/auth/log") else "admin"), route
        # An acknowledge link is its own credential: the signed link acts as the person it was sent to.
        assert row.credential is not None and row.credential.split(":")[0] in (
            "token",
            "session",
            "ack-link",
        ), route
        world.client.cookies.clear()


def test_records_say_who_what_before_and_after(world: World) -> None:
    admin = world.as_("admin")
    r = world.client.put(f"{API}/groups/vision/quota", json={"gpu_model": "A100", "max": 4}, headers=admin)
    assert r.status_code == 200, r.text
    world.client.post(f"{API}/groups/vision/members", json={"user": "alice", "role": "admin"}, headers=admin)
    quota, role = audit_rows(world)
    assert (quota.action, quota.target_kind, quota.target_id) == ("group.quota.set", "group", "vision")
    assert quota.before is not None and quota.after is not None
    assert "A100" not in quota.before["quotas"] and quota.after["quotas"]["A100"] == {
        "guaranteed": 0,
        "max": 4,
    }
    admin_token_id = world.client.get(f"{API}/tokens", headers=admin).json()[0]["id"]
    assert quota.actor == "admin" and quota.credential == f"token:{admin_token_id}"
    assert (role.action, role.before, role.after) == (
        "group.member.role.set",
        {"member": "alice", "role": "member"},
        {"member": "alice", "role": "admin"},
    )


def test_refused_or_failed_change_leaves_no_record(world: World) -> None:
    admin = world.as_("admin")
    bad = {"gpu_model": "*", "guaranteed": 4, "max": 2}  # max below guarantee: 422 after flushing
    assert world.client.put(f"{API}/groups/vision/quota", json=bad, headers=admin).status_code == 422
    assert (
        world.client.put(
            f"{API}/groups/vision/quota", json={"max": 1}, headers=world.as_("alice")
        ).status_code
        == 403
    )
    assert world.client.post(f"{API}/nodes/nope/cordon", headers=admin).status_code == 404
    assert audit_rows(world) == []
    with world.session_factory() as db:  # the service level: record, then the transaction rolls back
        audit.record(db, actor="system:test", action="test.rollback", target_kind="job", target_id=1)
        db.rollback()
        audit.record(db, actor="system:test", action="test.commit", target_kind="job", target_id=2)
        db.commit()
    assert [r.action for r in audit_rows(world)] == ["test.commit"]


def test_no_secret_is_ever_recorded(world: World) -> None:
    admin = world.as_("admin")
    token = world.client.post(f"{API}/tokens", json={"name": "ci", "user": "alice"}, headers=admin).json()
    world.client.post(f"{API}/users", json={"name": "erin", "password": "erin-secret-pw"}, headers=admin)
    world.client.put(f"{API}/users/carol/password", json={"password": "carol-secret-pw"}, headers=admin)
    login(world)
    with world.session_factory() as db:
        hashes = list(db.scalars(sa.text("SELECT password_hash FROM users WHERE password_hash IS NOT NULL")))
        csrf = list(db.scalars(sa.text("SELECT csrf_token FROM web_sessions")))
        token_hash = db.scalar(sa.text("SELECT token_hash FROM api_tokens WHERE id = :i"), {"i": token["id"]})
    text = json.dumps([audit.record_view(r) for r in audit_rows(world)])
    assert token["token"].startswith("crl_") and hashes and csrf
    for secret in [
        token["token"],
        token_hash,
        "erin-secret-pw",
        "carol-secret-pw",
        ALICE_PASSWORD,
        *hashes,
        *csrf,
    ]:
        assert secret not in text
    assert token["prefix"] in text  # the token's public prefix stays, to tell tokens apart
    # and anything secret-looking a caller passes is redacted before it reaches the table
    assert audit.redact({"password": "p", "nested": [{"token_hash": "h", "api_key": "k", "name": "n"}]}) == {
        "password": audit.REDACTED,
        "nested": [{"token_hash": audit.REDACTED, "api_key": audit.REDACTED, "name": "n"}],
    }


def test_the_database_refuses_update_and_delete(world: World) -> None:
    with world.session_factory() as db:
        old = audit.record(
            db, actor="system:test", action="test.old", target_kind="job", target_id=1, now=1000.0
        )
        new = audit.record(db, actor="system:test", action="test.new", target_kind="job", target_id=2)
        db.commit()
        old_id, new_id = old.id, new.id
    statements = [
        ("UPDATE audit_log SET actor = 'mallory' WHERE id = :i", old_id),
        ("DELETE FROM audit_log WHERE id = :i", old_id),
        ("DELETE FROM audit_log WHERE id = :i", new_id),
    ]
    for statement, row_id in statements:
        with world.session_factory() as db, pytest.raises(DBAPIError, match="append-only"):
            db.execute(sa.text(statement), {"i": row_id})
    with world.session_factory() as db, pytest.raises(DBAPIError, match="append-only"):
        row = db.get(AuditRecord, new_id)
        assert row is not None
        row.detail = "rewritten"
        db.commit()
    # retention deletes what is older than its cutoff, records that it did, and closes the gate
    with world.session_factory() as db:
        assert audit.purge_before(db, cutoff=2000.0) == 1
    rows = audit_rows(world)
    assert [(r.id, r.action) for r in rows][:1] == [(new_id, "test.new")] and rows[-1].action == "audit.purge"
    assert rows[-1].actor == "system:retention" and rows[-1].after == {"deleted": 1, "before": 2000.0}
    with world.session_factory() as db, pytest.raises(DBAPIError, match="append-only"):
        db.execute(sa.text("DELETE FROM audit_log WHERE id = :i"), {"i": new_id})


def test_listing_filters_pages_and_rights(world: World) -> None:
    admin = world.as_("admin")
    with world.session_factory() as db:
        for i, (action, kind, target) in enumerate(
            [
                ("group.quota.set", "group", "vision"),
                ("groups.x", "group", "nlp"),
                ("node.cordon", "node", "n1"),
            ]
        ):
            audit.record(
                db, actor="system:test", action=action, target_kind=kind, target_id=target, now=1000.0 + i
            )
        db.commit()
    world.client.post(f"{API}/groups", json={"name": "g3"}, headers=admin)  # now, by the admin

    def ids(**params: Any) -> list[str]:
        r = world.client.get(f"{API}/audit", params=params, headers=admin)
        assert r.status_code == 200, r.text
        return [f"{i['action']}@{i['target_id']}" for i in r.json()["items"]]

    assert ids() == ["group.create@g3", "node.cordon@n1", "groups.x@nlp", "group.quota.set@vision"]
    assert ids(action="group") == ["group.create@g3", "group.quota.set@vision"]  # dotted prefix only
    assert ids(actor="admin") == ["group.create@g3"]
    assert ids(target="group:vision") == ["group.quota.set@vision"]
    assert ids(target="node") == ["node.cordon@n1"]
    assert ids(since="1h") == ["group.create@g3"]
    assert ids(since="1001", until="1002.5") == ["node.cordon@n1", "groups.x@nlp"]
    assert ids(until="1970-01-01T00:16:41") == ["group.quota.set@vision"]  # 1001 s, exclusive
    page = world.client.get(f"{API}/audit", params={"limit": 2, "offset": 2}, headers=admin).json()
    assert page["total"] == 4 and [i["target_id"] for i in page["items"]] == ["nlp", "vision"]
    for bogus in ("bogus", "bogus:1", "nodes"):  # listed nothing; a kind no record can have is refused
        r = world.client.get(f"{API}/audit", params={"target": bogus}, headers=admin)
        assert r.status_code == 422, (bogus, r.text)
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["query", "target"], detail
        kind = bogus.partition(":")[0]
        assert f"target kind {kind!r} is not one the audit log records; use one of attempt, " in detail["msg"]
        assert ", node, " in detail["msg"] and detail["msg"].endswith(", workspace"), detail
    r = world.client.get(f"{API}/audit", params={"since": "last tuesday"}, headers=admin)
    assert r.status_code == 422 and "since 'last tuesday' is not a time" in r.text
    # not a time either: listed nothing on SQLite (nan binds as NULL) and everything on PostgreSQL
    for field, bad in (
        ("since", "nan"),
        ("until", "nan"),
        ("since", "inf"),
        ("until", "1e400"),
        ("since", "-5"),
    ):
        r = world.client.get(f"{API}/audit", params={field: bad}, headers=admin)
        assert r.status_code == 422, (field, bad, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", field]
        assert f"{field} {bad!r} is out of range: give a time from 1970 to the year 5138" in r.text
    assert world.client.get(f"{API}/audit", headers=world.as_("bob")).status_code == 403
    assert world.client.get(f"{API}/audit").status_code == 401


def test_record_refuses_a_malformed_action_or_actor(world: World) -> None:
    with world.session_factory() as db:
        with pytest.raises(ValueError, match="dotted lower-case"):
            audit.record(db, actor="system:test", action="Quota Set", target_kind="job", target_id=1)
        with pytest.raises(ValueError, match="system:<name>"):
            audit.record(db, actor="alice", action="x.y", target_kind="job", target_id=1)
        with pytest.raises(ValueError, match="audit target kind 'jobs' is not one of TARGET_KINDS"):
            audit.record(db, actor="system:test", action="x.y", target_kind="jobs", target_id=1)
        someone = Principal(user_id=1, name="alice", is_admin=False, default_group_id=None, source="10.0.0.9")
        row = audit.record(db, actor=someone, action="x.y", target_kind="job", target_id=1)
        assert (row.actor, row.actor_user_id, row.source, row.credential) == ("alice", 1, "10.0.0.9", None)
        db.rollback()


def test_retention_loop_purges_records_past_the_configured_age(world: World, tmp_path: Path) -> None:
    now = time.time()
    with world.session_factory() as db:
        for age_days, action in ((400, "test.ancient"), (40, "test.old"), (0, "test.new")):
            audit.record(
                db,
                actor="system:test",
                action=action,
                target_kind="job",
                target_id=1,
                now=now - age_days * 86400,
            )
        db.commit()
    assert Settings(home=tmp_path).audit_retention_days == 365  # the default
    for forever in ("", "never"):  # CORRAL_AUDIT_RETENTION_DAYS="" keeps everything
        assert Settings(home=tmp_path, audit_retention_days=forever).audit_retention_days is None
    settings = Settings(home=tmp_path, audit_retention_days=30)
    ctx = cast(
        ServerContext,
        SimpleNamespace(settings=settings, session_factory=world.session_factory, memory=LoopMemory()),
    )
    purge_audit_log(ctx, now)
    assert [r.action for r in audit_rows(world)] == ["test.new", "audit.purge"]
    with world.session_factory() as db:
        audit.record(
            db, actor="system:test", action="test.old", target_kind="job", target_id=2, now=now - 40 * 86400
        )
        db.commit()
    purge_audit_log(ctx, now + 60)  # within CORRAL_JOB_RETENTION_CHECK_S of the last pass: not yet
    assert [r.action for r in audit_rows(world)][-1] == "test.old"
    keep_all = Settings(home=tmp_path, audit_retention_days=None)
    purge_audit_log(cast(ServerContext, SimpleNamespace(settings=keep_all, memory=LoopMemory())), now + 1e9)
    assert len(audit_rows(world)) == 3


def test_create_all_schema_gets_the_same_guard(tmp_path: Path) -> None:
    """Some tests build the schema with create_all instead of the migrations: same triggers."""
    engine = make_engine(f"sqlite:///{tmp_path / 'create_all.db'}")
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as db:
            audit.record(db, actor="system:test", action="test.one", target_kind="job", target_id=1, now=5.0)
            db.commit()
            with pytest.raises(DBAPIError, match="append-only"):
                db.execute(sa.text("UPDATE audit_log SET actor = 'mallory'"))
            db.rollback()
            assert audit.purge_before(db, cutoff=10.0) == 1
    finally:
        engine.dispose()


def test_cli_audit_ls_against_a_real_server(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(world, server_url, "admin", "node", "ls")[0] == 0  # a read: no record
    assert run(world, server_url, "admin", "group", "create", "robotics")[0] == 0
    assert run(world, server_url, "admin", "group", "quota", "robotics", "--gpus", "4")[0] == 0
    code, out = run(world, server_url, "admin", "audit", "ls", "--action", "group", "-o", "json")
    assert code == 0, out
    page = json.loads(out)
    assert page["total"] == 2 and [i["action"] for i in page["items"]] == ["group.quota.set", "group.create"]
    assert {i["source"] for i in page["items"]} == {"127.0.0.1"}  # the CLI's request, over TCP
    code, out = run(world, server_url, "admin", "audit", "ls", "--target", "group:robotics", "--since", "1h")
    assert code == 0 and "group.quota.set" in out and "127.0.0.1" in out and "2 of 2 records" in out
    assert "quotas:" not in out  # 80 columns: no room for the CHANGE column
    code, out = run(world, server_url, "admin", "audit", "ls", "--target", "bogus")
    assert code == 1 and "target kind 'bogus' is not one the audit log records; use one of" in out, out
    assert "0 of 0 records" not in out and "ACTION" not in out, out  # no empty listing
    monkeypatch.setattr(audit_cli.out, "_width", 200)
    code, out = run(world, server_url, "admin", "audit", "ls", "--target", "group:robotics")
    assert code == 0 and 'quotas: {} -> {"*":{"guaranteed":4' in out
    code, out = run(world, server_url, "alice", "audit", "ls")
    assert code == 1 and "only an administrator" in out
    code, out = run(world, server_url, "admin", "audit", "ls", "--since", "yesterday-ish")
    assert code == 1 and "is not a time" in out
