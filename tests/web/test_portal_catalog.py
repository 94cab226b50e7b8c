"""The portal's Templates and Models pages (real server, Chromium): a template's form is built
from its typed parameters, a value out of range is refused in the browser naming the parameter
(nothing is submitted), a good one submits the job; a model registered from that job's outputs
shows its lineage, and a stage move from the page is kept."""

from __future__ import annotations

import time

from corral.sdk import Client
from tests.web.conftest import Portal, screenshot

TEMPLATE = """
parameters:
  gpus: {type: int, default: 0, min: 0, max: 1, description: GPUs for the run}
  lr: {type: float, default: 0.1, min: 0, max: 1}
  opt: {type: choice, choices: [sgd, adam], default: sgd}
name: portal-train
command: >-
  mkdir -p /outputs/m && echo "lr=${lr} opt=${opt}" > /outputs/m/weights.txt &&
  echo '{"accuracy": 0.5}' > /outputs/m/metrics.json
resources: {gpus: "${gpus}", cpus: 0.25, memory: 128MiB}
"""


def job_count(portal: Portal) -> int:
    with portal.api() as api:
        return int(api.get("/api/v1/jobs").json()["total"])


def test_template_form_validates_then_submits_and_model_shows_lineage(portal: Portal) -> None:
    with portal.api() as api:
        r = api.post(
            "/api/v1/templates", json={"name": "portal-train", "spec": TEMPLATE, "visibility": "public"}
        )
        assert r.status_code == 201, r.text
    before = job_count(portal)
    page = portal.login("ann", path="/templates?name=portal-train")
    page.wait_for_selector("#template-form")
    assert "portal-train" in page.locator("#templates-list").inner_text()
    assert page.locator("#param-opt option").all_inner_texts() == ["sgd", "adam"]
    page.fill("#param-gpus", "5")
    page.fill("#param-lr", "0.5")
    page.select_option("#param-opt", "adam")
    page.click("#template-form button[type=submit]")
    page.wait_for_selector("#param-gpus-error:not([hidden])")
    assert "parameter 'gpus'" in page.inner_text("#param-gpus-error")
    assert "maximum 1" in page.inner_text("#param-gpus-error")
    assert job_count(portal) == before  # refused in the browser: nothing was sent
    page.fill("#param-gpus", "0")
    page.click("#template-form button[type=submit]")
    page.wait_for_selector("#template-result a")
    assert page.locator("#param-gpus-error").is_hidden()
    job_id = int(page.inner_text("#template-result a").split()[1])
    screenshot(page, "templates")

    with portal.api() as api:
        spec = api.get(f"/api/v1/jobs/{job_id}").json()["spec"]
        assert (
            spec["tasks"]["main"]["resources"]["gpus"] == 0 and "opt=adam" in spec["tasks"]["main"]["command"]
        )
    admin = Client(portal.url, portal.server.token)
    deadline = time.monotonic() + 60
    while (
        admin.job(job_id)["state"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert admin.job(job_id)["state"] == "succeeded", admin.logs(job_id)["data"]
    ann = Client(portal.url, admin.create_token("ann-models", user="ann")["token"])
    admin.close()
    version = ann.register_model("portal-model", job_id, path="m", framework="numpy", card="# Portal model")
    assert version["metrics"] == {"accuracy": 0.5}
    ann.close()

    page.goto(portal.url + "/models?name=portal-model")
    page.wait_for_selector("#model-lineage")
    lineage = page.inner_text("#model-lineage")
    assert f"job {job_id} (portal-train)" in lineage and "default" in lineage
    assert "accuracy=0.5" in page.inner_text("#model-detail")
    page.select_option("#model-detail select", "staging")
    page.click("#model-detail button:has-text('Move')")
    page.wait_for_selector("#toasts:has-text('is now staging')")
    screenshot(page, "models")
    assert page.js_errors == []
    with portal.api() as api:
        assert api.get("/api/v1/models/portal-model/versions/1").json()["stage"] == "staging"


def test_catalogue_pages_fit_a_phone(portal: Portal) -> None:
    page = portal.login("root", width=390)
    for path in ("/templates?name=portal-train", "/models?name=portal-model"):
        page.goto(portal.url + path)
        page.wait_for_selector("main h1")
        page.wait_for_selector("#template-form, #model-lineage")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} scrolls sideways by {overflow}px at 390px"
    assert page.js_errors == []
