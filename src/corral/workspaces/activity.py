"""When a running workspace's JupyterLab was last used: the latest `last_activity` of its kernels
and terminals (a kernel busy right now counts as now), asked where the proxy reaches it (its
socket, or its Slurm node's address). The idle-GPU policy (corral.monitor.idle) uses it as
evidence of use beside GPU readings. A workspace whose JupyterLab does not answer gives no
evidence (it is left out)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from corral.services.workspaces import ProxyTarget, proxy_target, workspace_job_ids
from corral.workspaces.endpoint import Upstream, jupyter_upstream, reachable_path
from corral.workspaces.jupyter_auth import HEADER

log = logging.getLogger("corral.workspaces.activity")
TIMEOUT_S = 2.0
CONCURRENT_ASKS = 16  # JupyterLabs asked at once in an idle pass (threads, for the pass only)


def _parse(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def jupyter_last_activity(upstream: Upstream, base_url: str, token: str, now: float) -> float | None:
    with contextlib.ExitStack() as stack:
        uds = None if upstream.socket is None else stack.enter_context(reachable_path(upstream.socket))
        return _kernels_last_activity(upstream, uds, base_url, token, now)


def _kernels_last_activity(
    upstream: Upstream, uds: str | None, base_url: str, token: str, now: float
) -> float | None:
    latest: float | None = None
    transport = httpx.HTTPTransport(uds=uds)
    with httpx.Client(transport=transport, timeout=TIMEOUT_S, headers={HEADER: token}) as client:
        for kind in ("kernels", "terminals"):
            reply = client.get(f"http://{upstream.authority}{base_url}api/{kind}")
            if kind == "terminals" and reply.status_code == 404:
                continue  # a JupyterLab without terminals (no terminado): its kernels still count
            reply.raise_for_status()
            items = reply.json()
            # Whatever listens on the socket is the owner's to run: an answer of another shape is
            # no evidence (ValueError, skipped by the caller), not an error out of the idle pass.
            if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
                raise ValueError(f"api/{kind} did not answer a list of objects")
            for item in items:
                if item.get("execution_state") == "busy":
                    return now
                at = _parse(item.get("last_activity"))
                if at is not None and (latest is None or at > latest):
                    latest = at
    return latest


def last_activity(
    factory: sessionmaker[Session], engine: Any, job_ids: Sequence[int], now: float | None = None
) -> Mapping[int, float]:
    """{job id: last activity} of the workspace jobs among `job_ids` that answered. The
    JupyterLabs are asked at once, CONCURRENT_ASKS at a time: asked in turn, each hung one cost
    its timeouts, and 30 of them made one idle pass take a minute."""
    now = time.time() if now is None else now
    with factory() as session:
        workspace_of = workspace_job_ids(session)
        targets = [proxy_target(session, workspace_of[j]) for j in job_ids if j in workspace_of]
    asks: list[tuple[ProxyTarget, Upstream]] = []
    for target in targets:
        if target is None or target.attempt_id is None or target.job_id is None:
            continue
        upstream = jupyter_upstream(engine, target.attempt_id, target.node_address)
        if upstream is not None:
            asks.append((target, upstream))
    if not asks:
        return {}
    with ThreadPoolExecutor(min(CONCURRENT_ASKS, len(asks)), "jupyter-activity") as pool:
        found = list(pool.map(lambda ask: _ask(ask[0], ask[1], now), asks))
    return {
        target.job_id: at
        for (target, _), at in zip(asks, found, strict=True)
        if at is not None and target.job_id is not None
    }


def _ask(target: ProxyTarget, upstream: Upstream, now: float) -> float | None:
    try:
        return jupyter_last_activity(upstream, f"/ws/{target.workspace_id}/", target.token, now)
    except (httpx.HTTPError, OSError, ValueError) as exc:
        log.debug("workspace %s: no activity reading (%s)", target.workspace_id, exc)
        return None
