"""When a running workspace's JupyterLab was last used: the latest `last_activity` of its kernels
and terminals (a kernel busy right now counts as now), asked where the proxy reaches it (its
socket, or its Slurm node's address). The idle-GPU policy (corral.monitor.idle) uses it as
evidence of use beside GPU readings. A workspace whose JupyterLab does not answer gives no
evidence (it is left out).

The server asks as root, and the job owns the directory its socket lies in: the socket reached
must be answered by the job's uid (`endpoint.check_peer`, as the proxy checks), or a symlink put
in its place would have root send the request (with the workspace's credential) to any socket of
the host. httpx's `uds` transport cannot check that, so this talks through httpcore (httpx's
own engine) with a network backend that checks the peer of every connection it opens. A Slurm
node's JupyterLab is asked over TLS pinned to its certificate, as the proxy asks it
(corral.workspaces.labtls): whatever else holds its port gets no request and no credential."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpcore
from sqlalchemy.orm import Session, sessionmaker

from corral.services.workspaces import ProxyTarget, proxy_target, workspace_job_ids
from corral.workspaces.endpoint import (
    EndpointUnusable,
    Upstream,
    check_peer,
    jupyter_upstream,
    reachable_path,
)
from corral.workspaces.jupyter_auth import HEADER
from corral.workspaces.labtls import pinned_context

log = logging.getLogger("corral.workspaces.activity")
TIMEOUT_S = 2.0
CONCURRENT_ASKS = 16  # JupyterLabs asked at once in an idle pass (threads, for the pass only)
# A JupyterLab that does not answer, or not HTTP, or not the job's own: no reading for it.
NO_ANSWER = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, OSError, ValueError)


class PeerCheckedBackend(httpcore.SyncBackend):
    """httpcore's own sockets, connected to a job's Unix socket only when the job's uid listens
    on it (`check_peer` against `path`, the socket's real path, whatever address reached it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        stream = super().connect_unix_socket(path, timeout, socket_options)
        try:
            check_peer(stream.get_extra_info("socket"), self.path)
        except BaseException:
            stream.close()
            raise
        return stream


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
    backend = None if upstream.socket is None else PeerCheckedBackend(upstream.socket)
    scheme, tls = "http", None
    if upstream.socket is None:  # a node's port: TLS with the pinned certificate, never clear text
        if upstream.fingerprint is None:
            raise ValueError("a TCP upstream without its certificate's fingerprint")
        scheme, tls = "https", pinned_context(upstream.fingerprint)
    timeouts = dict.fromkeys(("connect", "read", "write", "pool"), TIMEOUT_S)
    with httpcore.ConnectionPool(uds=uds, network_backend=backend, ssl_context=tls) as pool:
        for kind in ("kernels", "terminals"):
            url = f"{scheme}://{upstream.authority}{base_url}api/{kind}"
            reply = pool.request("GET", url, headers=[(HEADER, token)], extensions={"timeout": timeouts})
            if kind == "terminals" and reply.status == 404:
                continue  # a JupyterLab without terminals (no terminado): its kernels still count
            if not 200 <= reply.status < 300:
                raise ValueError(f"api/{kind} answered HTTP {reply.status}")
            items = json.loads(reply.content)
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
        try:
            upstream = jupyter_upstream(engine, target.attempt_id, target.node_address)
        except EndpointUnusable as exc:  # no evidence from it, the others still asked
            log.debug("workspace %s: no activity reading (%s)", target.workspace_id, exc)
            continue
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
    except NO_ANSWER as exc:
        log.debug("workspace %s: no activity reading (%s)", target.workspace_id, exc)
        return None
