"""`corral oncall schedule set -f FILE` reads the YAML of docs/operations.md as the server needs it;
the documented schedule and policy name users a new server has, and rotate as their comments say."""

from __future__ import annotations

import json
import shlex
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from corral.api.routers.oncall import ScheduleIn
from corral.cli.oncall import parse_step, read_yaml
from corral.sdk import CorralError
from corral.services.oncall import rotation_of, schedule_by_name
from corral.services.rotation import OnCall
from tests.oncall.conftest import Env

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
LAYER = {"name": "weekly", "rotation": "weekly", "start_date": "2026-11-02", "members": ["alice"]}


def docs_example() -> str:
    text = DOCS.read_text()
    start = text.index("```yaml\n# corral oncall schedule set primary -f primary.yaml")
    return text[start:].split("\n", 1)[1].split("```", 1)[0]


def test_the_documented_schedule_file_is_sent_as_json_the_server_accepts(tmp_path: Path) -> None:
    spec = tmp_path / "primary.yaml"
    spec.write_text(docs_example())  # start_date unquoted: a date to YAML
    body = json.loads(json.dumps(read_yaml(spec)))  # what the SDK sends
    assert body["layers"][0]["start_date"] == "2026-11-02"
    assert ScheduleIn.model_validate(body).layers[1].restrict_from == "10:00"


def test_an_unquoted_handoff_is_refused_by_name(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("layers:\n  - {rotation: daily, start_date: '2026-11-02', handoff: 10:00, members: [a]}")
    with pytest.raises(CorralError, match=r'layers\[0\]\.handoff: write the time quoted, e\.g\. "10:00"'):
        read_yaml(spec)


@pytest.mark.parametrize(
    ("local", "who", "source"),
    [
        ("2026-11-02T08:59", "admin", "fallback"),  # before the first handoff: a gap, the fallback
        ("2026-11-02T09:30", "alice", "layer weekly"),
        ("2026-11-04T12:00", "alice", "layer weekly"),  # the daytime layer starts on the 7th
        ("2026-11-07T12:00", "carol", "layer daytime"),  # a Saturday
        ("2026-11-08T12:00", "bob", "layer daytime"),
        ("2026-11-08T20:00", "alice", "layer weekly"),  # outside 10:00-18:00
        ("2026-11-09T09:30", "bob", "layer weekly"),  # the weekly layer's second week
        ("2026-11-11T12:00", "carol", "layer daytime"),  # a Wednesday: every day, as the comment says
    ],
)
def test_the_documented_schedule_is_accepted_and_rotates_as_its_comments_say(
    env: Env, tmp_path: Path, local: str, who: str, source: str
) -> None:
    """With the users a `corral up --demo` server has (admin, alice, bob, carol), the example
    schedule is stored as written, and who is on call when is what its comments say."""
    spec = tmp_path / "primary.yaml"
    spec.write_text(docs_example())
    env.put("/oncall/schedules/primary", json.loads(json.dumps(read_yaml(spec))))
    with env.factory() as db:
        rotation = rotation_of(db, schedule_by_name(db, "primary"))
    at = datetime.fromisoformat(local).replace(tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    assert rotation.on_call(at) == OnCall(who, source)


def test_the_documented_policy_command_names_users_the_server_has(env: Env) -> None:
    env.put("/oncall/schedules/primary", {"time_zone": "UTC", "layers": [LAYER]})
    env.put("/oncall/schedules/secondary", {"time_zone": "UTC", "layers": [LAYER]})
    command = next(
        line for line in DOCS.read_text().splitlines() if line.startswith("corral oncall policy set gpu")
    )
    words = shlex.split(command)
    steps = [parse_step(words[i + 1]) for i, word in enumerate(words) if word == "--step"]
    view = env.put(
        "/oncall/policies/gpu", {"steps": steps, "repeat": int(words[words.index("--repeat") + 1])}
    )
    assert [s.get("user") or s.get("schedule") for s in view["steps"]] == ["primary", "secondary", "admin"]
