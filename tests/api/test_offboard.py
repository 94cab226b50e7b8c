"""What a non-member learns about group names (corral.services.accounts.visible_group)."""

from __future__ import annotations

from tests.api.conftest import World

API = "/api/v1"


def test_a_non_member_cannot_tell_which_group_names_exist(world: World) -> None:
    """carol (nlp only) gets the same answer for vision (exists) as for a name no group has."""
    w = world
    for path, kwargs in (
        ("POST /groups/{}/members", {"json": {"user": "carol"}}),
        ("GET /groups/{}", {}),
    ):
        method, template = path.split(" ")
        answers = []
        for name in ("vision", "no-such-group"):
            r = w.client.request(method, API + template.format(name), headers=w.as_("carol"), **kwargs)
            answers.append((r.status_code, r.json()["detail"].replace(name, "NAME")))
        assert answers[0] == answers[1] and answers[0][0] == 404, (path, answers)
    answers = []
    for name in ("vision", "no-such-group"):
        r = w.client.put(f"{API}/users/carol/default-group", json={"group": name}, headers=w.as_("carol"))
        answers.append((r.status_code, r.json()["detail"].replace(name, "NAME")))
    assert answers[0] == answers[1] and answers[0][0] == 404, answers
