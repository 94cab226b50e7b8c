"""What a dataset name, a version reference or a path inside a dataset may be, and the manifest
digest both ends compute. Pure functions (the SDK and the CLI use them too)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

# 1-64 characters, starting with a letter or digit, not ending with a dot
NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9_-])?$")
MAX_PATH = 1024
MAX_COMPONENT = 255
RESERVED = frozenset({"uploads", "import"})  # words of the REST paths under /datasets/


class BadName(ValueError):
    """A dataset name, reference or path that is not allowed; the message says why."""


def check_name(name: str) -> str:
    """A dataset name: 1-64 letters, digits, '.', '_', '-', starting with a letter or digit (so no
    slashes, no control characters, never '.' or '..')."""
    if not NAME.match(name) or name.endswith("."):
        shown = name[:80]  # !r escapes what is not printable; unicode_escape and !r escaped twice
        raise BadName(
            f"bad dataset name {shown!r}: use 1-64 letters, digits, '.', '_' or '-', starting with "
            "a letter or digit and not ending with '.' (no slashes or control characters)"
        )
    if name in RESERVED:
        raise BadName(f"{name!r} is a reserved word; pick another dataset name")
    return name


def check_plain(text: str, what: str) -> str:
    """A name of something else (a group, a user) as given: no NUL or control characters (the
    databases store text; PostgreSQL refuses NUL outright)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise BadName(f"bad {what} {text[:80]!r}: it holds a control character")
    return text


def parse_version(text: str | int) -> int:
    """ "v3", "3" -> 3."""
    raw = str(text).strip()
    digits = raw[1:] if raw[:1] in ("v", "V") else raw
    if not digits.isdigit() or int(digits) < 1:
        raise BadName(f"bad dataset version {raw!r}: write a positive number such as 3 or v3")
    return int(digits)


def parse_ref(ref: str) -> tuple[str, int | None]:
    """`data/<name>[@<version>]` (or `<name>[@<version>]`) -> (name, version or None = latest)."""
    body = ref.removeprefix("data/")
    name, sep, version = body.partition("@")
    check_name(name)
    return name, (parse_version(version) if sep else None)


def check_path(path: str) -> str:
    """A file's path inside a dataset: relative, '/'-separated, no '.', '..' or empty parts, no
    NUL or control characters. Returns it unchanged; raises BadName naming the problem."""
    shown = path[:200]
    if not path:
        raise BadName("empty file path")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in path):  # how Python holds a name's non-UTF-8 bytes
        raise BadName(f"file path {shown!r} is not UTF-8; rename the file")
    if len(path.encode()) > MAX_PATH:
        raise BadName(f"file path {shown!r} is longer than {MAX_PATH} bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise BadName(f"file path {shown!r} holds a NUL or control character")
    if path.startswith("/") or "\\" in path:
        raise BadName(f"file path {shown!r} must be relative and use '/' (no absolute paths)")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise BadName(f"file path {shown!r} holds an empty, '.' or '..' part (path traversal)")
        if len(part.encode()) > MAX_COMPONENT:
            raise BadName(f"file path {shown!r} has a part longer than {MAX_COMPONENT} bytes")
    return path


def manifest_line(path: str, size: int, sha256: str) -> str:
    return f"{path}\t{size}\t{sha256}\n"


def manifest_digest(entries: Iterable[tuple[str, int, str]]) -> str:
    """sha256 over the manifest lines sorted by path: one value for the whole content."""
    h = hashlib.sha256()
    for path, size, sha in sorted(entries):
        h.update(manifest_line(path, size, sha).encode())
    return h.hexdigest()


UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
         "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
         "p": 1000**5, "pb": 1000**5, "pib": 1024**5}  # fmt: skip


def human_bytes(n: float) -> str:
    """bytes -> "1.5 GiB" (the inverse of parse_bytes, for tables and messages)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def parse_bytes(text: str) -> int:
    """ "2TiB", "500GB", "1.5 GiB", "1048576" -> bytes."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in UNITS:
        raise ValueError(
            f"bad size {text!r}: write a number with an optional unit such as 2TiB, 500GB or 1048576"
        )
    return int(float(found.group(1)) * UNITS[unit])


def parse_manifest(text: str) -> list[tuple[str, int, str]]:
    out = []
    for line in text.splitlines():
        if line:
            path, size, sha = line.split("\t")
            out.append((path, int(size), sha))
    return out
