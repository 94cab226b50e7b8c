"""The proxy's upstream client (corral.workspaces.upstream) against a real Tornado HTTP server on
a Unix socket (the server JupyterLab runs on): kept-alive connections reused, chunked answers and
request bodies, HEAD, an upstream restarted under a kept-alive connection, and one that is gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web

from corral.workspaces.upstream import HttpPool, UpstreamError


class Small(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write("hello")

    def head(self) -> None:
        self.set_header("Content-Length", "5")


class Chunked(tornado.web.RequestHandler):
    async def get(self) -> None:
        for part in ("one,", "two,", "three"):
            self.write(part)
            await self.flush()  # no Content-Length: Tornado answers chunked


@tornado.web.stream_request_body
class Echo(tornado.web.RequestHandler):
    def prepare(self) -> None:
        self.parts: list[bytes] = []

    def data_received(self, chunk: bytes) -> None:
        self.parts.append(chunk)

    def post(self) -> None:
        body = b"".join(self.parts)
        self.write(f"{len(body)}:{self.request.headers.get('Transfer-Encoding', '-')}:".encode() + body[:8])


def serve(path: Path) -> tornado.httpserver.HTTPServer:
    app = tornado.web.Application([("/small", Small), ("/chunked", Chunked), ("/echo", Echo)])
    server = tornado.httpserver.HTTPServer(app)
    server.add_socket(tornado.netutil.bind_unix_socket(str(path)))
    return server


async def parts(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def test_upstream_client_against_tornado(tmp_path: Path) -> None:
    sock = tmp_path / "jupyter.sock"

    async def scenario() -> None:
        server = serve(sock)
        pool = HttpPool(str(sock))
        host = [("host", "localhost")]
        for _ in range(3):  # one connection, kept alive and reused
            response = await pool.request("GET", "/small", host)
            assert (response.status_code, await response.read()) == (200, b"hello")
            assert response.header(b"content-length") == b"5"
            await response.aclose()
            assert len(pool._idle) == 1
        response = await pool.request("GET", "/chunked", host)
        assert response.header(b"transfer-encoding") == b"chunked"
        assert await response.read() == b"one,two,three"  # de-chunked
        await response.aclose()
        body = b"x" * 300_000
        response = await pool.request("POST", "/echo", host, parts(body[:100], body[100:]), len(body))
        assert await response.read() == b"300000:-:xxxxxxxx"
        await response.aclose()
        response = await pool.request("POST", "/echo", host, parts(b"abc", b"", b"defgh"), None)
        assert await response.read() == b"8:chunked:abcdefgh"
        await response.aclose()
        response = await pool.request("HEAD", "/small", host)
        assert (response.status_code, response.header(b"content-length"), await response.read()) == (
            200, b"5", b"",
        )  # fmt: skip
        idle_before = len(pool._idle)
        await response.aclose()  # a HEAD answer's connection is not reused
        assert len(pool._idle) == idle_before
        response = await pool.request("GET", "/nowhere", host)
        assert response.status_code == 404 and b"404" in await response.read()
        await response.aclose()
        # The upstream restarts: the kept-alive connection is dead; a bodyless request goes again.
        await pool.aclose()
        response = await pool.request("GET", "/small", host)
        await response.read()
        await response.aclose()
        server.stop()
        await server.close_all_connections()
        sock.unlink()
        server = serve(sock)
        await asyncio.sleep(0.05)
        response = await pool.request("GET", "/small", host)
        assert await response.read() == b"hello"
        await response.aclose()
        server.stop()
        await server.close_all_connections()
        sock.unlink()
        await pool.aclose()
        with pytest.raises(UpstreamError):
            await pool.request("GET", "/small", host)

    asyncio.run(scenario())


class Disconnected(Exception):
    """What the body stream raises when the browser goes away mid-upload (starlette's
    ClientDisconnect is a plain Exception, not an OSError)."""


def test_an_upload_the_client_breaks_off_closes_its_upstream_connection(tmp_path: Path) -> None:
    """A request body that fails half-way (the client left) must not leave the connection to
    JupyterLab open: JupyterLab would wait for the rest of the body, and the server's socket
    stayed open until the garbage collector found it, one per broken-off upload."""
    sock = tmp_path / "jupyter.sock"

    async def scenario() -> None:
        ended = asyncio.Event()

        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.read(65536):  # reads the head and what comes of the body
                pass
            ended.set()  # the proxy closed its side
            writer.close()

        server = await asyncio.start_unix_server(upstream, str(sock))

        async def broken_body() -> AsyncIterator[bytes]:
            yield b"x" * 1000
            raise Disconnected

        pool = HttpPool(str(sock))
        # The error is kept, as the server's error handling and log do for a while: what closes
        # the connection must be the client itself, not the garbage collector.
        with pytest.raises(Disconnected) as caught:
            await pool.request("POST", "/upload", [("host", "localhost")], broken_body(), 1_000_000)
        await asyncio.wait_for(ended.wait(), 2)
        assert caught.value is not None
        assert pool._idle == []
        server.close()

    asyncio.run(scenario())
