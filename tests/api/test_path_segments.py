"""A name sent with an encoded '/' (what the SDK's `seg` sends for the model name "../x") or a dot
segment is a 422 naming the segment. Starlette routes the decoded path, so `DELETE /models/..%2Fx`
matched no API route and the portal's catch-all GET route answered a bare 405 ("Method Not
Allowed", `Allow: GET`), and `DELETE /models/a%2Fversions%2F1` reached the route of version 1 of
model "a". Any other API path no route serves is a 404, not the portal's 405."""

from __future__ import annotations

import pytest

from tests.api.conftest import World

API = "/api/v1"


@pytest.mark.parametrize(
    ("method", "path", "segment"),
    [
        ("DELETE", "/models/..%2Fx", "'..%2Fx' after 'models/' is '../x'"),
        ("DELETE", "/models/a%2Fversions%2F1", "'a%2Fversions%2F1' after 'models/' is 'a/versions/1'"),
        ("GET", "/models/a%2Fb", "'a%2Fb' after 'models/' is 'a/b'"),
        ("POST", "/templates/a%2fb/use", "'a%2fb' after 'templates/' is 'a/b'"),
        ("DELETE", "/groups/vision%2F..", "'vision%2F..' after 'groups/' is 'vision/..'"),
        ("DELETE", "/secrets/%2E", "'%2E' after 'secrets/' is '.'"),
        ("DELETE", "/datasets/%2E%2E", "'%2E%2E' after 'datasets/' is '..'"),
    ],
)
def test_an_encoded_slash_or_dot_segment_is_a_422_naming_it(
    world: World, method: str, path: str, segment: str
) -> None:
    r = world.client.request(method, API + path, headers=world.as_("admin"))
    assert r.status_code == 422, (r.status_code, r.headers.get("allow"), r.text)
    assert r.json()["detail"][0]["loc"] == ["path"]
    assert f"the path segment {segment} once decoded" in r.json()["detail"][0]["msg"], r.text


def test_an_api_path_no_route_serves_is_a_404_not_the_portals_405(world: World) -> None:
    r = world.client.delete(API + "/no-such-thing/x", headers=world.as_("admin"))
    assert r.status_code == 404 and "allow" not in r.headers, r.text
    assert r.json()["detail"] == f"no API route serves {API}/no-such-thing/x"
    # A wrong method on a path that routes serve is still their 405 with Allow.
    r = world.client.request("PATCH", API + "/models/m", headers=world.as_("admin"))
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET", r.text


def test_a_dataset_file_path_may_hold_an_encoded_slash(world: World) -> None:
    # The `{path:path}` route takes the path as given (its service checks it): no 422 here.
    r = world.client.get(API + "/datasets/d/versions/1/files/a%2Fb.txt", headers=world.as_("admin"))
    assert r.status_code == 404, r.text
