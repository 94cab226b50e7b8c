"""The portal's Data page (real server, Chromium): a dataset uploaded from the browser in chunks
appears with its size and files; its detail lists the versions; the bytes on the server are the
bytes chosen in the browser."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.web.conftest import Portal, screenshot


def test_upload_from_the_browser_then_list_and_show_versions(portal: Portal, tmp_path: Path) -> None:
    files = {"train.csv": b"x,y\n" + b"1,2\n" * 50_000, "labels.txt": b"cat\ndog\n"}
    chosen = tmp_path / "set"
    chosen.mkdir()
    for name, data in files.items():
        (chosen / name).write_bytes(data)
    page = portal.login("ann", path="/data")
    page.wait_for_selector("#datasets-list")
    page.fill("#upload-form input[name=name]", "browser-set")
    page.select_option("#upload-form select[name=group]", "team-a")
    page.set_input_files("#upload-form input[name=dir]", str(chosen))  # a directory, as a person picks
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("#upload-status:has-text('v1: 2 files')")
    page.wait_for_selector("#datasets-list a[href='/data?name=browser-set']")
    row = page.locator("#datasets-list tr", has_text="browser-set")
    assert "group team-a" in row.inner_text() and "v1" in row.inner_text()
    page.click("#datasets-list a[href='/data?name=browser-set']")
    page.wait_for_selector("#dataset-detail code")
    assert "v1" in page.locator("#dataset-detail").inner_text()
    screenshot(page, "data")
    assert page.js_errors == []
    with portal.api() as api:
        manifest = api.get("/api/v1/datasets/browser-set/versions/latest/manifest").text
    for name, data in files.items():
        assert f"{name}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}" in manifest
