"""Request limits, enforced as ASGI middleware before any route runs (docs/security.md, "API and
login"):

- `BodyLimits`: a body larger than `api_max_body_bytes` is answered 413 — at once when its
  Content-Length says so, otherwise as soon as the bytes received pass the limit, never after
  reading it all; a body not all received within `api_body_timeout_s` is answered 408; a JSON (or
  YAML flow-style) body nested deeper than `api_max_json_depth` or holding more than
  `api_max_json_elements` values is answered 400 before any parser sees it (Python's JSON
  decoder and PyYAML recurse, and raised RecursionError, a 500, on a few thousand levels).
- `RateLimits`: token buckets, in this process, on the expensive endpoints (submit, login, log
  reads, lists asking for many rows), keyed by the caller's credential or, without one, by its
  address; an empty bucket is answered 429 with `Retry-After`.

Every refusal is JSON `{"detail": "..."}` naming the limit and the setting that sets it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import HTTPConnection

from corral.api.deps import bearer_token, session_secret
from corral.config import Settings

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]

# A JSON string once escaped backslashes and escaped quotes are gone (see json_shape_error).
_JSON_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{},")
_OPENERS = frozenset(b"[{")
WORKSPACE_PROXY_PREFIX = "/ws/"
_CHUNK_PATH = re.compile(r"^/api/v1/datasets/uploads/[^/]+/chunk/?$")
_NOT_STRUCTURED = ("application/x-www-form-urlencoded", "multipart/", "application/octet-stream")


async def send_error(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """Answer a whole request with `{"detail": detail}`."""
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def json_shape_error(body: bytes, max_depth: int, max_elements: int) -> str | None:
    """Why `body` (JSON text) is too deep or too large, or None. Linear, parser-free and mostly at
    C speed: escaped backslashes, then escaped quotes, then whole strings are cut out (brackets
    and commas inside strings do not count); the brackets and commas left are counted."""
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = _JSON_STRING.sub(b"", unescaped).translate(None, _NOT_STRUCTURE)
    containers = skeleton.count(b"[") + skeleton.count(b"{")
    if containers + skeleton.count(b",") > max_elements:
        return (
            f"the request body holds more than {max_elements} JSON or YAML values "
            "(limit: CORRAL_API_MAX_JSON_ELEMENTS)"
        )
    if containers > max_depth and _deeper_than(skeleton, max_depth):
        return (
            f"the request body is nested more than {max_depth} levels deep (limit: CORRAL_API_MAX_JSON_DEPTH)"
        )
    return None


# A JSON escape of half a UTF-16 surrogate pair without its other half: valid JSON, but no Unicode
# text; such a string cannot be encoded as UTF-8 when it is stored or sent back (it was a 500).
_UNPAIRED_SURROGATE = re.compile(
    rb"\\u[dD][89aAbB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89aAbB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def unpaired_surrogate_error(body: bytes) -> str | None:
    """Why `body` (JSON text) holds no text, or None."""
    if b"\\u" not in body:
        return None
    if _UNPAIRED_SURROGATE.search(body.replace(b"\\\\", b"")) is None:
        return None
    return "the request body holds an unpaired UTF-16 surrogate (a \\uD800-\\uDFFF escape), which is no text"


def _deeper_than(skeleton: bytes, max_depth: int) -> bool:
    """Does the bracket sequence nest deeper than `max_depth`? Stops at the first level too many
    (a hostile body) or at a closing bracket too many (not JSON: the parser will say so)."""
    depth = 0
    for byte in skeleton:
        if byte in _OPENERS:
            depth += 1
            if depth > max_depth:
                return True
        elif byte != 44:  # a closing bracket (44 is the comma)
            depth -= 1
            if depth < 0:
                return False
    return False


class BodyTooLarge(Exception):
    pass


class BodyLimits:
    """Reads each request's body (up to the limit, within the timeout), checks it, then hands the
    app the same bytes. Bodies are small by design (job specs, settings), so holding one in memory
    up to `api_max_body_bytes` costs little and lets every check run before the app starts."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.max_bytes = settings.api_max_body_bytes
        # Dataset upload chunks (raw bytes, never parsed) may be larger: fewer requests per GB.
        self.chunk_max_bytes = max(settings.api_max_body_bytes, settings.dataset_chunk_bytes)
        self.max_depth = settings.api_max_json_depth
        self.max_elements = settings.api_max_json_elements
        self.timeout_s = settings.api_body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A workspace's JupyterLab (corral.workspaces.proxy) streams its own bodies (notebooks,
        # uploads) to the workspace; only its owner reaches it.
        if scope["type"] != "http" or scope["path"].startswith(WORKSPACE_PROXY_PREFIX):
            await self.app(scope, receive, send)
            return
        max_bytes, setting = self.max_bytes, "CORRAL_API_MAX_BODY_BYTES"
        if scope["method"] == "PUT" and _CHUNK_PATH.match(scope["path"]):
            max_bytes, setting = self.chunk_max_bytes, "CORRAL_DATASET_CHUNK_BYTES"
        too_large = f"the request body is larger than {max_bytes} bytes (limit: {setting})"
        declared = header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            await send_error(send, 413, too_large)
            return
        try:
            async with asyncio.timeout(self.timeout_s):  # no task per request, unlike wait_for
                body, first_after = await self._read_body(receive, max_bytes)
        except BodyTooLarge:
            await send_error(send, 413, too_large)
            return
        except TimeoutError:
            await send_error(
                send,
                408,
                f"the request body was not received within {self.timeout_s:g} s "
                "(limit: CORRAL_API_BODY_TIMEOUT_S)",
                {"connection": "close"},
            )
            return
        if first_after is not None:  # the client left while sending: nobody to answer
            return
        content_type = (header(scope, b"content-type") or "").lower()
        # Not only JSON: the API reads YAML (flow style nests with the same brackets) and bodies
        # without a content type too. Forms and uploads are not structured text.
        if body and not content_type.startswith(_NOT_STRUCTURED):
            problem = json_shape_error(body, self.max_depth, self.max_elements) or unpaired_surrogate_error(
                body
            )
            if problem is not None:
                await send_error(send, 400, problem)
                return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive, max_bytes: int) -> tuple[bytes, Message | None]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body once, then whatever the connection says next."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return replayed


# --- rate limits --------------------------------------------------------------------------------


@dataclass
class Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """Buckets of `burst` tokens refilled at `per_min` a minute, one per key."""

    MAX_KEYS = 50_000

    def __init__(self, per_min: float, burst: int) -> None:
        self.rate_per_s = per_min / 60.0
        self.burst = float(burst)
        self._buckets: dict[str, Bucket] = {}

    def take(self, key: str, now: float) -> float:
        """Take one token for `key`: 0.0 when allowed, else the seconds until one is available."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.MAX_KEYS:
                self._forget_full(now)
            bucket = self._buckets[key] = Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate_per_s)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate_per_s

    def _forget_full(self, now: float) -> None:
        """Buckets that have refilled hold no information: drop them (all, if none has)."""
        full_after = self.burst / self.rate_per_s
        stale = [k for k, b in self._buckets.items() if now - b.updated >= full_after]
        for key in stale or list(self._buckets):
            del self._buckets[key]


BIG_LIST_LIMIT = 100  # a GET asking for more rows than this counts as a big list


@dataclass(frozen=True)
class RateRule:
    name: str  # names the rule in the 429's detail
    setting: str  # the settings prefix that tunes it
    matches: Callable[[str, str, dict[str, list[str]]], bool]  # (method, path, query)
    per_address: bool  # key by source address even when a credential is sent
    buckets: TokenBuckets


def _is_submit(method: str, path: str, _query: dict[str, list[str]]) -> bool:
    return method == "POST" and path.rstrip("/") == "/api/v1/jobs"


def _is_login(method: str, path: str, _query: dict[str, list[str]]) -> bool:
    return method == "POST" and path.rstrip("/") == "/api/v1/auth/login"


_LOGS_PATH = re.compile(r"^/api/v1/jobs/[^/]+/logs/?$")


def _is_log_read(method: str, path: str, _query: dict[str, list[str]]) -> bool:
    return method == "GET" and _LOGS_PATH.match(path) is not None


def _is_big_list(method: str, path: str, query: dict[str, list[str]]) -> bool:
    if method != "GET" or not path.startswith("/api/"):
        return False
    limits = query.get("limit", [])
    return any(v.isdigit() and int(v) > BIG_LIST_LIMIT for v in limits)


def rate_rules(settings: Settings) -> list[RateRule]:
    """The rules in the order they are tried (the first that matches applies); rules whose rate
    is 0 are off."""
    table = [
        ("job submission", "CORRAL_RATE_SUBMIT", _is_submit, False,
         settings.rate_submit_per_min, settings.rate_submit_burst),
        ("login", "CORRAL_RATE_LOGIN", _is_login, True,
         settings.rate_login_per_min, settings.rate_login_burst),
        ("log reads", "CORRAL_RATE_LOGS", _is_log_read, False,
         settings.rate_logs_per_min, settings.rate_logs_burst),
        (f"lists with limit > {BIG_LIST_LIMIT}", "CORRAL_RATE_BIG_LIST", _is_big_list, False,
         settings.rate_big_list_per_min, settings.rate_big_list_burst),
    ]  # fmt: skip
    return [
        RateRule(name, setting, matches, per_address, TokenBuckets(per_min, burst))
        for name, setting, matches, per_address, per_min, burst in table
        if per_min > 0
    ]


def caller_key(scope: Scope, *, per_address: bool) -> str:
    """Who a request counts against: a hash of its bearer token or session cookie, else (or for
    per-address rules) its source address. Hashed: no credential is held in memory as text."""
    if not per_address:
        # Read as authentication reads them, so that a caller cannot get a fresh bucket per
        # request with a spelling of the same credential: the token as `_bearer` takes it (any
        # case of `Bearer`, blanks dropped), else the session cookie of the name that fits the
        # request from every Cookie header, as the session lookup takes it (a second header with
        # a random cookie first would otherwise key the limit while the real one authenticates).
        authorization = header(scope, b"authorization")
        if authorization:  # an empty one is none to authentication too (the cookie decides)
            credential = bearer_token(authorization) or authorization
        else:
            credential = session_secret(HTTPConnection(scope)) or ""
        if credential:
            return "cred:" + hashlib.sha256(credential.encode()).hexdigest()
    client = scope.get("client")
    return "addr:" + (str(client[0]) if client else "unknown")


class RateLimits:
    def __init__(self, app: Any, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.rules = rate_rules(settings)
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.rules:
            method, path = scope["method"], scope["path"]
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            for rule in self.rules:
                if not rule.matches(method, path, query):
                    continue
                wait_s = rule.buckets.take(caller_key(scope, per_address=rule.per_address), self.clock())
                if wait_s > 0:
                    retry = max(1, math.ceil(wait_s))
                    await send_error(
                        send,
                        429,
                        f"too many requests for {rule.name}: try again in {retry} s "
                        f"(limits: {rule.setting}_PER_MIN, {rule.setting}_BURST)",
                        {"retry-after": str(retry)},
                    )
                    return
                break
        await self.app(scope, receive, send)


def install(app: Any, settings: Settings) -> None:
    """Add the limits to `app`. Starlette runs the last added middleware first: rate limits are
    checked before a body is read, and bodies before the concurrency limit admits a request."""
    app.add_middleware(BodyLimits, settings=settings)
    app.add_middleware(RateLimits, settings=settings)
