"""The portal's own routes without a browser: odd asset paths are a 404 naming them, never a 500."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from corral.web.routes import router


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    app.include_router(router)
    return TestClient(app, raise_server_exceptions=False)


ODD_PATHS = ["a%00b.js", "js/%00", "a" * 5000, "..%2F..%2F..%2Fpyproject.toml", "js", "nope.css"]


@pytest.mark.parametrize("path", ODD_PATHS)
def test_an_asset_that_is_not_there_is_a_404(client: TestClient, path: str) -> None:
    response = client.get(f"/portal-assets/{path}")
    assert response.status_code == 404, response.text
    assert response.json()["detail"].startswith("no portal asset")


def test_an_asset_that_is_there_is_served(client: TestClient) -> None:
    response = client.get("/portal-assets/js/app.js")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
