"""The HTTP side every part of the client shares: one httpx client under `/api/v1`, JSON
requests whose errors become CorralError, streamed downloads. The resource areas (jobs.py,
accounts.py, ...) are mixins over BaseClient, put together as corral.sdk.Client."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import httpx

from corral.sdk.config import DEFAULT_URL, config_path, load_cli_config
from corral.sdk.errors import ApiError, AuthenticationFailed, CorralError, ServerUnreachable, describe_detail


class Keep:
    """The type of KEEP: "leave this setting as it is" where None already means "no limit"."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


def seg(value: object) -> str:
    """`value` as one segment of a URL path. Everything but letters, digits and `_.-~` is escaped
    ('/', '?', '#', '%', control characters), and so are the dots of '.' and '..', which the HTTP
    client would otherwise resolve: `delete_model("../templates/x")` sent DELETE /templates/x and
    `group("vision#x")` read the group vision. The server then names the value it was given. An
    empty value is refused here: "/models/" is another route, answered "Not Found" or "Method Not
    Allowed" without a word about the empty name."""
    text = quote(str(value), safe="")
    if not text:
        raise CorralError("an empty name (or id) was given: name what to act on")
    return text.replace(".", "%2E") if text in (".", "..") else text


class BaseClient:
    """A connection to one Corral server: `request` for JSON calls, `download` for raw bodies."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        if token and not (token.isascii() and token.isprintable()):
            # A header holds printable ASCII only: httpx raised UnicodeEncodeError for a pasted
            # "é", and a newline was refused by the HTTP layer on every request.
            raise CorralError(
                f"the API token (CORRAL_TOKEN or {config_path()}) holds a character a token never "
                "has (a space or line break copied with it?); set it again"
            )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = httpx.Client(
                base_url=f"{self.url}/api/v1", headers=headers, timeout=timeout, transport=transport
            )
        except httpx.InvalidURL as exc:  # "http://[::1", "http://host:x"
            raise CorralError(f"bad Corral server URL {url!r} (CORRAL_URL or {config_path()}): {exc}")

    @classmethod
    def from_config(cls, home: Path | None = None, **kwargs: Any) -> Self:
        cfg = load_cli_config(home)
        return cls(cfg.url, cfg.token, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request_with_headers(method, path, **kwargs)[0]

    def request_with_headers(self, method: str, path: str, **kwargs: Any) -> tuple[Any, httpx.Headers]:
        """As `request`, with the answer's headers (what a list answer says beside its items)."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise ServerUnreachable(
                f"cannot reach the Corral server at {self.url}; is it running "
                "(`corral up`) and is CORRAL_URL right?"
            )
        except httpx.TimeoutException:
            raise ServerUnreachable(f"the Corral server at {self.url} did not answer in time")
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"cannot talk to the Corral server at {self.url}: {exc}")
        except httpx.InvalidURL as exc:
            raise CorralError(f"cannot make a request of {path!r}: {exc}")
        except ValueError as exc:
            # json= holding nan or infinity (`corral group quota g --cpus-max nan`): httpx encodes
            # with allow_nan=False, and the ValueError was a traceback.
            if "JSON" not in str(exc):
                raise
            raise CorralError(
                f"cannot send {method} {path}: a number in it is nan or infinity, which JSON cannot carry"
            ) from None
        if response.status_code == 204:
            return None, response.headers
        try:
            body = response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            if response.is_success or kind == "text/html":
                # Not the API: CORRAL_URL with a path (the portal's /jobs answers its HTML page
                # with 200, which the commands then read as JSON: a KeyError traceback) or a
                # proxy's error page (printed whole as the error).
                raise CorralError(
                    f"{method} {response.url} answered HTTP {response.status_code} with {kind}, not "
                    f"the Corral API's JSON: is CORRAL_URL ({self.url}) the server's address, with "
                    "no path after it?",
                    response.status_code,
                ) from None
            body = {"detail": response.text}
        if response.is_success:
            return body, response.headers
        detail = body.get("detail") if isinstance(body, dict) else body
        text = describe_detail(detail)
        if response.status_code == 401:
            raise AuthenticationFailed(
                f"authentication failed: {text}. Check CORRAL_TOKEN or {config_path()}", 401, detail
            )
        raise ApiError(text, response.status_code, detail)

    def download(
        self, path: str, params: dict[str, Any] | None = None
    ) -> AbstractContextManager[httpx.Response]:
        """GET a raw (non-JSON) body as a streamed response (a context manager); errors raise
        like `request`."""
        return self._stream(path, params)

    def download_to(
        self,
        path: str,
        params: dict[str, Any] | None,
        dest: Path,
        *,
        expected_size: int | None = None,
        on_progress: Callable[[int], None] | None = None,
        label: str | None = None,
    ) -> int:
        """Stream a raw body into `dest`, and return its size: it goes to a hidden temporary name
        beside `dest` and is renamed over it only once all of it (with `expected_size`, that many
        bytes) arrived, so an interrupted transfer leaves neither a cut file under the name (nor
        over an earlier good copy) nor the temporary one. `on_progress(bytes so far)` per block;
        `label`: the file as errors name it (default: its name)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.corral-part")
        size = 0
        try:
            with self.download(path, params) as response, tmp.open("wb") as fh:
                for block in response.iter_bytes(1024 * 1024):
                    fh.write(block)
                    size += len(block)
                    if on_progress:
                        on_progress(size)
            if expected_size is not None and size != expected_size:
                raise CorralError(
                    f"{label or dest.name}: {size} of its {expected_size} bytes arrived; pull again"
                )
            os.replace(tmp, dest)
            return size
        finally:
            tmp.unlink(missing_ok=True)

    @contextmanager
    def _stream(self, path: str, params: dict[str, Any] | None) -> Iterator[httpx.Response]:
        try:
            with self._http.stream("GET", path, params=params) as response:
                if not response.is_success:
                    response.read()
                    try:
                        detail = response.json().get("detail")
                    except ValueError:
                        detail = response.text
                    raise ApiError(describe_detail(detail), response.status_code, detail)
                yield response
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"cannot talk to the Corral server at {self.url}: {exc}")
