"""`corral oncall schedule set -f FILE` reads the YAML of docs/operations.md as the server needs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.api.routers.oncall import ScheduleIn
from corral.cli.oncall import read_yaml
from corral.sdk import CorralError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


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
