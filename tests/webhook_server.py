"""A real HTTP server that records the JSON bodies posted to it, for the notification and paging
tests (webhook, Slack/Mattermost channels). Its answer status can be switched by the test."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookServer:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[tuple[str, dict[str, Any]]] = []  # (request path, JSON body), in order
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                receiver.posts.append((self.path, json.loads(self.rfile.read(length))))
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"nope" if receiver.status >= 300 else b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.posts]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_webhook(status: int = 200) -> Iterator[WebhookServer]:
    """Body of a pytest fixture: the server for one test, closed after it."""
    server = WebhookServer(status)
    try:
        yield server
    finally:
        server.close()
