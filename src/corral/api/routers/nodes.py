"""Nodes with their GPUs (and which job holds each), and admin actions on them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Response

from corral.api.deps import DB, SEGMENT_NAME, Admin, CurrentUser
from corral.api.schemas import NodeOut
from corral.db.models import Node
from corral.services import audit
from corral.services import nodes as svc
from corral.services.audit_state import node_state
from corral.services.views import node_view

NodeName = Annotated[str, Path(min_length=1, max_length=255, pattern=SEGMENT_NAME)]
router = APIRouter(tags=["nodes"])


@router.get("/nodes", response_model=list[NodeOut])
def list_nodes(db: DB, principal: CurrentUser) -> Any:
    """Every node with its GPUs: a held GPU names its job only to a caller who may see the job."""
    claims = svc.visible_gpu_claims(db, principal)
    return [node_view(n, claims) for n in svc.list_nodes(db)]


@router.post("/nodes/{name}/{action}", response_model=NodeOut)
def node_action(
    name: NodeName,
    action: Literal["cordon", "uncordon", "drain"],
    db: DB,
    admin: Admin,
) -> Any:
    """cordon: take nothing new; drain: take nothing new and empty out; uncordon: back to ready."""
    found = db.get(Node, name)
    before = None if found is None else node_state(found)
    node = svc.set_admin_state(db, name, action)
    audit.record(
        db,
        actor=admin,
        action=f"node.{action}",
        target_kind="node",
        target_id=name,
        before=before,
        after=node_state(node),
    )
    db.commit()
    return node_view(node, svc.gpu_claims(db))


@router.delete("/nodes/{name}", status_code=204)
def remove_node(name: NodeName, db: DB, admin: Admin) -> Response:
    """Remove a decommissioned node: cordoned, draining or down, with no job placed on it (409
    naming what stands in the way otherwise)."""
    found = db.get(Node, name)
    before = None if found is None else node_state(found)
    svc.remove_node(db, name, by=admin.name)
    audit.record(db, actor=admin, action="node.remove", target_kind="node", target_id=name, before=before)
    db.commit()
    return Response(status_code=204)


@router.post("/nodes/{name}/gpus/{index}/{action}", response_model=NodeOut)
def gpu_action(
    name: NodeName,
    index: Annotated[int, Path(ge=0, le=1023)],
    action: Literal["quarantine", "return"],
    db: DB,
    admin: Admin,
) -> Any:
    """quarantine: no new job on this GPU (the node's others keep working); return: back in
    service after a quarantine or a loss (admin)."""
    gpu, before = svc.set_gpu_health(db, name, index, action)
    audit.record(
        db,
        actor=admin,
        action=f"gpu.{action}",
        target_kind="gpu",
        target_id=f"{name}:{index}",
        before={"health": before},
        after={"health": gpu.health},
    )
    db.commit()
    node = db.get(Node, name)
    assert node is not None
    return node_view(node, svc.gpu_claims(db))
