"""A tiny pure-Python wheel built by the test itself, so environment builds need no network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

WHEEL = b"Wheel-Version: 1.0\nGenerator: corral-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(directory: Path, name: str, version: str, body: str) -> Path:
    """`<name>-<version>-py3-none-any.whl` holding module `<name>` whose source is `body`."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": body.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": WHEEL,
    }
    record = [_record_line(p, d) for p, d in files.items()] + [f"{dist}/RECORD,,"]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(p, d)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path
