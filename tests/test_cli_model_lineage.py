"""`corral model show NAME@V` prints the version's lineage as docs/catalogues.md lists it: the
job, the dataset versions and the model versions it mounted, its environment and code. The model
versions were left out (only `-o json` had them). The server is a mock transport."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import catalog as cli_catalog
from corral.cli.main import app
from corral.sdk import Client

LINEAGE = {
    "job_id": 26, "job_name": "lin", "user": "alice", "group": "vision", "finished_at": 1.0,
    "datasets": [{"name": "cifar", "version": 2}], "models": ["model/digits@1"],
    "environment": "sklearn@1", "environment_version": "sklearn@1",
    "code_snapshot": "", "code_checksum": None,
}  # fmt: skip
VERSION = {
    "name": "lin", "version": 1, "stage": "none", "files": 1, "bytes": 6, "digest": "4a52b3cf1d84a945",
    "source_path": "m", "metrics": {}, "card": "", "lineage": LINEAGE,
}  # fmt: skip


def test_model_show_names_the_model_versions_the_job_mounted(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/models/lin/versions/1", request.url.path
        return httpx.Response(200, json=VERSION)

    def client() -> Any:
        return Client("http://corral.test", "token", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli_catalog, "client", client)
    result = CliRunner().invoke(app, ["model", "show", "lin@1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "datasets: cifar@2; models: digits@1; environment: sklearn@1" in result.output, result.output


def test_model_show_prints_the_code_snapshot_id_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 64-digit snapshot id came at the end of the lineage's prose line, and Rich folded it
    at 80 columns: copied from the terminal it was two pieces."""
    snapshot = "7cca3ae4af65267e18ef01864113138ca0a9af58998007fb6e9f3fbe39352873"
    version = {**VERSION, "lineage": {**LINEAGE, "code_snapshot": snapshot, "code_checksum": "sha256:ab"}}

    def client() -> Any:
        return Client(
            "http://corral.test",
            "token",
            transport=httpx.MockTransport(lambda r: httpx.Response(200, json=version)),
        )

    monkeypatch.setattr(cli_catalog, "client", client)
    result = CliRunner().invoke(app, ["model", "show", "lin@1"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert f"code: {snapshot}; checksum: sha256:ab" in result.output.splitlines(), result.output
