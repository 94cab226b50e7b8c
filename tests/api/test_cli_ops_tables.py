"""Operator tables at 80 columns, against a real uvicorn server: what a new admin reads first
(who did what when) is never squeezed out or cut with an ellipsis."""

from __future__ import annotations

import time

import pytest

from corral.cli import common
from corral.cli.common import when
from corral.db.audit_models import AuditRecord
from corral.services import audit
from tests.api.conftest import World
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture


def column(out: str, heading: str) -> str:
    """One column of a borderless table, its folded lines run together (the count line left out)."""
    header, *rows = out.splitlines()[:-1]
    start = header.index(f" {heading} ")
    later = [header.find(f" {h} ", start + 1) for h in header.split()]
    end = min((i for i in later if i > start), default=len(header))
    return "".join("".join(row[start:end].split()) for row in rows)


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_audit_ls_keeps_each_records_id_and_time_whole_at_80_columns(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a long actor and target (a remediation run, an escalation policy) every column was
    squeezed: the ID column went and WHEN read "2026-11-30 0…"."""
    monkeypatch.setattr(common.out, "_width", 80)  # _width: see tests/api/test_cli_tables.py
    now = time.time()
    with world.session_factory() as db:
        audit.record(db, actor="system:remediation", action="remediation.run", target_kind="rule",
                     target_id="gpu-overheating", now=now - 60)  # fmt: skip
        audit.record(db, actor="system:remediation", action="oncall.escalation_policy.create",
                     target_kind="escalation_policy", target_id="sev1-weekend", now=now)  # fmt: skip
        db.commit()
        records = [(r.id, r.at) for r in db.query(AuditRecord).order_by(AuditRecord.id.desc())]
    code, out = run(world, server_url, "admin", "audit", "ls")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    rows = out.splitlines()[1:-1]  # between the header and the count
    starts = [line.split()[:3] for line in rows if line.split()[0].isdigit()]
    assert starts == [[str(number), *when(at).split()] for number, at in records], out
    assert column(out, "TARGET") == "escalation_policy:sev1-weekendrule:gpu-overheating", out
    assert column(out, "ACTOR") == "system:remediation" * 2, out
