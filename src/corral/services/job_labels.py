"""Editing a job's labels after submit (PATCH /jobs/{id}/labels, `corral label`), as Kubernetes
edits an object's labels: a JSON merge patch of the label map (RFC 7386): a name with a value
sets it, a name with null removes it, names left out stay as they are.

- Who: the job's owner, an admin of its group, or an admin, as for cancel and hold (anyone else
  gets get_job's 404, as for a missing job); an audit entry (`job.labels`) when it is someone
  other than the owner.
- What: the same rules as at submit (corral.spec.check_labels: names, values, at most
  MAX_LABELS in all), on the labels the job ends up with. Any state, ended jobs too: labels are
  what a job is found by (`corral ls -l`, cancel and wait by label), not its state, so the
  lifecycle's compare-and-set on `state` is not involved and `updated_at` (the last state
  change) is left as it is. The spec keeps the labels (a copy, `retry` or `submit --from-job`,
  takes them as they are now) and so do the filters' rows (job_labels); both change in one
  transaction, with a `labels` event in the job's history saying who changed what.
- Races: two edits of one job are applied one after the other, each on the labels the other
  left (see `edit_labels`), never on a stale copy.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from sqlalchemy import delete, insert
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.orm import Session

from corral.db.base import table_of
from corral.db.models import Job, JobLabel
from corral.services import audit
from corral.services.auth import Principal
from corral.services.errors import Invalid, NotFound
from corral.services.jobs import get_job
from corral.services.lifecycle import record_event
from corral.spec import MAX_LABELS, STORED_SPEC, JobSpecV1, check_labels

LabelPatch = Mapping[str, str | int | float | None]
WHERE = ("body", "labels")


def edit_labels(
    session: Session, principal: Principal, job_id: int, patch: LabelPatch, *, now: float | None = None
) -> Job:
    """Apply `patch` (this module's docstring) to the job's labels; the job as it is now. A patch
    that changes nothing writes nothing. Commits."""
    now = time.time() if now is None else now
    removed = [name for name, value in patch.items() if value is None]
    setting = _checked({name: value for name, value in patch.items() if value is not None}, removed)
    job = get_job(session, principal, job_id, for_update=True)  # PostgreSQL: the row, locked
    # The filters' rows of the names patched go first: on SQLite this first write takes the
    # database's write lock (PostgreSQL's row lock is taken above), so the spec read again next
    # is the last one committed, and no other edit commits between that read and this commit.
    session.execute(delete(JobLabel).where(JobLabel.job_id == job.id, JobLabel.key.in_(list(patch))))
    try:
        session.refresh(job, ["spec"])
    except InvalidRequestError:  # SQLite: deleted (corral rm, retention) since get_job read it
        session.rollback()
        raise NotFound(f"no job with id {job_id}") from None
    before = dict(job.spec.labels)
    after = {name: value for name, value in before.items() if name not in removed} | setting
    if after == before:
        session.rollback()
        return job
    if len(after) > MAX_LABELS:  # in all, as at submit
        session.rollback()
        raise Invalid(
            f"job {job.id} would have {len(after)} labels; at most {MAX_LABELS} are allowed "
            "(remove some in the same patch: a name with null)",
            WHERE,
        )
    job.spec = JobSpecV1.model_validate({**job.spec.stored(), "labels": after}, context=STORED_SPEC)
    if setting:
        rows = [{"job_id": job.id, "key": name, "value": value} for name, value in setting.items()]
        session.execute(insert(table_of(JobLabel)), rows)
    what = change_text(before, after)
    record_event(session, job.id, now, f"labels changed by {principal.name}: {what}", kind="labels")
    if principal.user_id != job.user_id:
        audit.record(
            session, actor=principal, action="job.labels", target_kind="job", target_id=job.id,
            before={"labels": before}, after={"labels": after}, now=now,
        )  # fmt: skip
    session.commit()
    return job


def _checked(setting: dict[str, str | int | float], removed: list[str]) -> dict[str, str]:
    """The labels set, as text, checked as at submit; the names removed checked as names (a
    typo such as `trial=7` would otherwise remove nothing and say nothing). 422 naming each."""
    wrong: list[tuple[tuple[str | int, ...], str]] = []
    checked: dict[str, str] = {}
    for name, value in setting.items():
        try:
            checked |= check_labels({name: value})
        except ValueError as exc:
            wrong.append(((*WHERE, name), str(exc)))
    for name in removed:
        try:
            check_labels({name: "x"})  # a valid value: only the name can be wrong
        except ValueError as exc:
            wrong.append(((*WHERE, name), str(exc)))
    if wrong:
        raise Invalid.each(wrong)
    return checked


def change_text(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """`trial=8, best=yes, -stale`: the labels set (new or changed) and removed, by name."""
    changed = [f"{name}={value}" for name, value in sorted(after.items()) if before.get(name) != value]
    gone = [f"-{name}" for name in sorted(before) if name not in after]
    return ", ".join(changed + gone)
