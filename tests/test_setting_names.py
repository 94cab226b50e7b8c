"""Settings read from the environment outside pydantic's Settings are spelled once, in
corral.config, and every reader takes the name from there (corral.config is a low module that the
API, the workspace proxy, monitoring, the server and doctor may all import: tests/test_layering.py).
A second spelling is how one reader drifts from the others unseen (monitor/runbooks.py spelled
CORRAL_PUBLIC_URL itself because it must not import the API, where the name used to be)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from corral import config
from corral.monitor.runbooks import runbook_url

SRC = Path(__file__).resolve().parents[1] / "src" / "corral"
NAMED_ONCE = {config.PUBLIC_URL_ENV: "PUBLIC_URL_ENV"}


def test_environment_names_are_spelled_in_corral_config_only() -> None:
    spelled = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMED_ONCE:
                where = f"{path.relative_to(SRC.parent)}:{node.lineno}"
                spelled.append(f"{where}: {node.value!r} (use corral.config.{NAMED_ONCE[node.value]})")
    assert spelled == [], "names spelled again outside corral.config:\n" + "\n".join(spelled)


def test_the_runbook_links_read_the_same_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.PUBLIC_URL_ENV, "https://corral.example.org/")
    assert runbook_url("CorralDown") == "https://corral.example.org/runbooks/CorralDown"
