"""A websockets server on a Unix socket, run on its own thread: JupyterLab's stand-in for the
proxy's tests (the proxy reaches a local workspace's JupyterLab on such a socket)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from websockets.asyncio.server import ServerConnection, unix_serve


def serve_on_unix(
    sock: str, answer: Callable[[ServerConnection], Awaitable[None]], process_request: Any = None
) -> Iterator[str]:
    """Yields `sock` while the server answers on it (WebSockets by `answer`, plain HTTP by
    `process_request` when given); stops it afterwards. For a fixture's `yield from`."""
    loop = asyncio.new_event_loop()
    ready, stop = threading.Event(), asyncio.Event()

    async def serve() -> None:
        async with unix_serve(answer, sock, process_request=process_request):
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield sock
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
