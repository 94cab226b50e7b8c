"""A lean HTTP/1.1 client for the proxy's upstream: JupyterLab on a Unix socket or a node's port
(corral.workspaces.proxy). Kept-alive connections per socket, requests written in one go,
responses parsed by httptools (uvicorn's C parser, already a dependency). A node's port is
spoken to only over TLS pinned to its JupyterLab's certificate (corral.workspaces.labtls): the
pin is checked in the handshake, before the first byte of a request is written.

Why not httpx: its connection pool and anyio layers cost more server CPU per proxied request
than everything else on the path together (profiled: about 1 ms of the proxy's 2 ms per
`GET api/status` on this 2-core machine), and the proxy needs none of its features: one host,
no redirects, no cookies, no decoding (the bytes pass through as they came).

Bodies pass through as they came, except chunked ones, which arrive de-chunked (the parser
takes the framing off; the server frames them again on the way out). A request body is
streamed with its Content-Length when it had one, else chunked.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httptools

from corral.workspaces.endpoint import open_unix_socket
from corral.workspaces.labtls import pinned_context

READ_BYTES = 256 * 1024
# A workspace on a Slurm node that went dead: TCP's own connect retries took about two minutes,
# each holding a browser request. Alike for the WebSocket side (proxy.py's open_timeout).
CONNECT_TIMEOUT_S = 10.0
# From the request's last byte to the answer's headers: a JupyterLab that accepts and never
# answers held the browser's request (and a proxy connection) forever. Generous, as a kernel
# start or restart answers only once the kernel is up (jupyter_client waits up to 60 s); the body
# that follows may stream for as long as it likes, and WebSockets are not HTTP requests here.
RESPONSE_HEADERS_TIMEOUT_S = 120.0
MAX_IDLE_PER_SOCKET = 8  # kept-alive connections per upstream socket (a browser opens about 6)
NO_BODY_STATUS = frozenset({204, 304})


class UpstreamError(Exception):
    """The upstream did not answer (refused, closed, or sent something that is not HTTP)."""


class UpstreamTimeout(UpstreamError):
    """The upstream took the request but sent no answer's headers within RESPONSE_HEADERS_TIMEOUT_S."""


class UpstreamImpostor(UpstreamError):
    """What answers on the node's port did not complete TLS with the pinned certificate: not the
    workspace's JupyterLab (another process holds the port). Nothing was sent to it."""


@dataclass
class _Parsed:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    headers_done: bool = False
    complete: bool = False
    chunks: list[bytes] = field(default_factory=list)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class UpstreamResponse:
    """One response: status and raw headers at once, then the body by `chunks()`; `aclose()`
    gives the connection back when the body was read to its end, else closes it."""

    def __init__(
        self,
        pool: HttpPool,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        parser: httptools.HttpResponseParser,
        state: _Parsed,
        no_body: bool,
    ) -> None:
        self._pool, self._reader, self._writer = pool, reader, writer
        self._parser, self._state = parser, state
        self.status_code = state.status
        self.headers = state.headers
        self._done = no_body or state.complete
        self._reusable = not no_body  # a HEAD answer's framing is unknown to the parser: close
        self._closed = False

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    async def chunks(self) -> AsyncIterator[bytes]:
        state = self._state
        while True:
            if state.chunks:
                pending, state.chunks = state.chunks, []
                for chunk in pending:
                    yield chunk
            if self._done or state.complete:
                self._done = True
                return
            data = await self._reader.read(READ_BYTES)
            if not data:
                raise UpstreamError("the upstream closed the connection in the middle of a response")
            self._feed(data)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise UpstreamError(f"the upstream's answer is not HTTP: {exc}") from exc

    def _keep_alive(self) -> bool:
        """HTTP/1.1 without `Connection: close`. (httptools' should_keep_alive() reads False
        once the message is complete: its flags are reset for the next one.)"""
        closing = b"close" in (self.header(b"connection") or b"").lower()
        return self._parser.get_http_version() == "1.1" and not closing

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._done and self._reusable and self._keep_alive():
            self._pool.give_back(self._reader, self._writer)
        else:
            self._writer.close()


class HttpPool:
    """HTTP/1.1 to one upstream, with up to MAX_IDLE_PER_SOCKET idle connections kept: a Unix
    socket (`path`, the local engine) or a host and port (a workspace on a Slurm node), the
    latter over TLS accepting only the certificate of SHA-256 `fingerprint`."""

    def __init__(
        self,
        path: str | None,
        host: str = "localhost",
        port: int | None = None,
        fingerprint: str | None = None,
    ) -> None:
        if path is None and port is None:
            raise ValueError("an upstream needs a socket path or a port")
        if path is None and fingerprint is None:
            raise ValueError("a TCP upstream needs its JupyterLab's certificate fingerprint (no clear text)")
        self.path, self.host, self.port = path, host, port
        self._tls = pinned_context(fingerprint) if path is None and fingerprint is not None else None
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def give_back(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._idle) < MAX_IDLE_PER_SOCKET and not reader.at_eof():
            self._idle.append((reader, writer))
        else:
            writer.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()

    async def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes] | None = None,
        body_length: int | None = None,
    ) -> UpstreamResponse:
        """Send one request; returns once the response's headers are in. A kept-alive
        connection the upstream had closed is replaced and the request sent again, when it
        has no body (a body stream cannot be read twice)."""
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                return await self._exchange(reader, writer, method, target, headers, body, body_length)
            except _StaleConnection:
                writer.close()
                if body is not None:
                    raise UpstreamError("the upstream closed a kept-alive connection") from None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                if self.path is not None:
                    sock = await open_unix_socket(self.path)  # a path too long for an address too
                    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=READ_BYTES)
                else:
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, limit=READ_BYTES, ssl=self._tls
                    )
        except TimeoutError:
            raise UpstreamError(f"no connection within {CONNECT_TIMEOUT_S:g} s") from None
        except ssl.SSLError as exc:  # (the pin's PinMismatch included): before OSError, its base
            raise UpstreamImpostor(
                f"{self.host}:{self.port} did not prove to be the workspace's JupyterLab "
                f"({exc}); nothing was sent to it"
            ) from exc
        except OSError as exc:
            raise UpstreamError(str(exc)) from exc
        try:
            return await self._exchange(reader, writer, method, target, headers, body, body_length)
        except _StaleConnection as exc:
            writer.close()
            raise UpstreamError("the upstream closed the connection without answering") from exc

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes] | None,
        body_length: int | None,
    ) -> UpstreamResponse:
        lines = [f"{method} {target} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in headers]
        if body is not None:
            chunked = body_length is None
            lines.append("transfer-encoding: chunked" if chunked else f"content-length: {body_length}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            writer.write(head)
            if body is not None:
                await _write_body(writer, body, chunked=body_length is None)
            await writer.drain()
            state = _Parsed()
            parser = httptools.HttpResponseParser(state)
            async with asyncio.timeout(RESPONSE_HEADERS_TIMEOUT_S):
                await _read_headers(reader, parser, state)
        except TimeoutError:  # before OSError, of which it is one
            writer.close()
            raise UpstreamTimeout(f"no response headers within {RESPONSE_HEADERS_TIMEOUT_S:g} s") from None
        except httptools.HttpParserError as exc:
            writer.close()
            raise UpstreamError(f"the upstream's answer is not HTTP: {exc}") from exc
        except ConnectionError as exc:
            raise _StaleConnection() from exc
        except OSError as exc:
            writer.close()
            raise UpstreamError(str(exc)) from exc
        except BaseException:
            # The request body broke off (the client left mid-upload: starlette's ClientDisconnect)
            # or the request was cancelled: the connection is half-used, JupyterLab waits for the
            # rest of the body; close it here, not whenever the garbage collector finds it.
            writer.close()
            raise
        state.status = parser.get_status_code()
        no_body = method == "HEAD" or state.status in NO_BODY_STATUS or state.status < 200
        return UpstreamResponse(self, reader, writer, parser, state, no_body)


async def _read_headers(
    reader: asyncio.StreamReader, parser: httptools.HttpResponseParser, state: _Parsed
) -> None:
    received = False
    while not state.headers_done:
        data = await reader.read(READ_BYTES)
        if not data:
            raise _StaleConnection() if not received else UpstreamError("the upstream hung up")
        received = True
        parser.feed_data(data)


class _StaleConnection(Exception):
    """The connection was closed before any byte of the answer came."""


async def _write_body(writer: asyncio.StreamWriter, body: AsyncIterator[bytes], chunked: bool) -> None:
    async for chunk in body:
        if not chunk:
            continue
        if chunked:
            writer.write(b"%x\r\n" % len(chunk))
            writer.write(chunk)
            writer.write(b"\r\n")
        else:
            writer.write(chunk)
        await writer.drain()
    if chunked:
        writer.write(b"0\r\n\r\n")


async def close_quietly(pool: HttpPool) -> None:
    with contextlib.suppress(Exception):
        await pool.aclose()
