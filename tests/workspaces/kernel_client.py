"""Run code in a workspace's Jupyter kernel over its WebSocket through Corral's proxy, as a
browser tab would (the kernel protocol's execute_request; stdout collected until idle)."""

from __future__ import annotations

import json
import uuid

from websockets.sync.client import connect


def run_in_kernel(
    server_url: str, ws_id: int, kernel: str, code: str, token: str, timeout_s: float = 30
) -> str:
    """`code`'s stdout, run in `kernel` of workspace `ws_id` with `token` (the owner's)."""
    url = server_url.replace("http://", "ws://", 1) + f"/ws/{ws_id}/api/kernels/{kernel}/channels"
    headers = {"Authorization": f"Bearer {token}", "Origin": server_url}
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "",
        "session": "t",
        "version": "5.3",
    }
    request = {
        "header": header,
        "parent_header": {},
        "metadata": {},
        "content": {"code": code, "silent": False},
        "channel": "shell",
    }
    out = []
    with connect(url, additional_headers=headers, open_timeout=20) as ws:
        ws.send(json.dumps(request))
        while True:
            msg = json.loads(ws.recv(timeout=timeout_s))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)
