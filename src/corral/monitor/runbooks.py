"""Alert runbooks shipped with Corral (`runbooks.md` beside this module, in the package), served
at `/runbooks` (all) and `/runbooks/<AlertName>` (one), unauthenticated like the docs, so every
alert's `runbook_url` opens a real page: Prometheus's rules build it from the `corral_url`
external label, Corral's own health alerts from CORRAL_PUBLIC_URL (the server sets it to its own
address when it is not given)."""

from __future__ import annotations

import functools
import os
import re
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from corral.config import PUBLIC_URL_ENV

router = APIRouter(include_in_schema=False)
SECTION = re.compile(r"^## (\w+)\s*$", re.MULTILINE)


@functools.cache
def runbook_text() -> str:
    return resources.files("corral.monitor").joinpath("runbooks.md").read_text(encoding="utf-8")


@functools.cache
def runbooks() -> dict[str, str]:
    """{alert name: its section, heading included}."""
    text = runbook_text()
    marks = list(SECTION.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.start() : end].strip() + "\n" for m, end in zip(marks, ends, strict=True)}


def runbook_url(alertname: str) -> str:
    """Where an alert's runbook is served; a bare path when the public address is unknown."""
    base = os.environ.get(PUBLIC_URL_ENV, "").rstrip("/")
    return f"{base}/runbooks/{alertname}"


_TEXT = "text/plain; charset=utf-8"


@router.get("/runbooks")
def all_runbooks() -> PlainTextResponse:
    return PlainTextResponse(runbook_text(), media_type=_TEXT)


@router.get("/runbooks/{alertname}")
def one_runbook(alertname: str) -> PlainTextResponse:
    found = runbooks().get(alertname)
    if found is None:
        known = ", ".join(sorted(runbooks()))
        return PlainTextResponse(f"no runbook for {alertname!r}; there are: {known}\n", 404, media_type=_TEXT)
    return PlainTextResponse(found, media_type=_TEXT)
