"""Jobs: submit, copy (from a job, retry), list (by label too), logs, wait, cancel (one, or by
label), metrics, hold, release, events (`corral submit/retry/ls/show/logs/cancel/metrics/rm/hold/
release/events`). Many jobs at once (wait_any, wait_all, metrics_of, iter_jobs): job_sets.py."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from corral.sdk.base import BaseClient, seg
from corral.sdk.errors import CorralError
from corral.spec import SpecError, load_spec_text
from corral.yaml_lines import safe_load

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
# GET /jobs/{id}/events: how many of the job's events come before the page (absent: a server
# older than paging, which ignores skip and before)
EARLIER_EVENTS_HEADER = "X-Corral-Earlier-Events"
# The most events one answer of GET /jobs/{id}/events holds, on every server version (the oldest
# ones sent this many whatever the limit asked): a page this full without a count may not be all.
EVENTS_PAGE_MAX = 500


def _refuse_a_file_name(text: str) -> None:
    """`submit("train.yaml")` sends the text "train.yaml", which is YAML for a string, and the
    server's answer ("the spec must be a mapping ...") does not say why: a one-line str that is
    no mapping and reads as a file name (a .yaml/.yml/.json one, or an existing file) is refused
    here, naming the Path that reads the file."""
    name = text.strip()
    if "\n" in name or not name:
        return
    try:
        named = Path(name).suffix.lower() in (".yaml", ".yml", ".json") or Path(name).is_file()
    except (OSError, ValueError):  # too long for a file name, or a NUL: text, not a file name
        return
    if not named:
        return
    try:
        data = safe_load(text)
    except yaml.YAMLError:
        return  # not YAML: the server's answer names the line and column
    if not isinstance(data, dict):
        raise CorralError(
            f"the spec {text!r} is one line of text, not a mapping of fields such as 'name' and "
            f"'tasks' (a str is the spec's YAML text); to submit a file, pass a Path: "
            f"submit(Path({text!r}))"
        )


def label_selectors(labels: Mapping[str, object]) -> list[str]:
    """{"experiment": "e1", "trial": 7, "tag": None} -> ["experiment=e1", "trial=7", "tag"]: the
    API's selectors (NAME=VALUE; NAME alone for any value)."""
    return [key if value is None else f"{key}={value}" for key, value in labels.items()]


class JobsApi(BaseClient):
    """Submitting, reading and ending jobs."""

    def submit(
        self,
        spec: Mapping[str, Any] | str | Path,
        *,
        code: str | None = None,
        hold: bool = False,
        labels: Mapping[str, object] | None = None,
    ) -> dict[str, Any]:
        """Submit a spec given as a mapping, YAML text (a str), or a YAML file (a `pathlib.Path`;
        a str is never read as a file name). `code`: a code snapshot id (upload_code) the job runs
        in, mounted read-only at /code. `hold`: queue it held, never scheduled until
        `release_job`. `labels`: added to the spec's own (a name in both: this value)."""
        if isinstance(spec, Path):
            spec = spec.read_text()
        elif isinstance(spec, str):
            _refuse_a_file_name(spec)
        params = {"hold": "true"} if hold else {}
        if code is not None or labels:
            try:
                data = load_spec_text(spec) if isinstance(spec, str) else dict(spec)
            except SpecError as exc:
                raise CorralError(str(exc))
            if not isinstance(data, dict):
                raise CorralError("the spec must be a mapping with fields such as 'name' and 'tasks'")
            if labels:
                own = data.get("labels") or {}
                if not isinstance(own, Mapping):
                    raise CorralError("the spec's 'labels' must be a mapping of names to values")
                data["labels"] = {**own, **labels}
            if code is not None:
                data["code"] = code
            return self.request("POST", "/jobs", json=data, params=params)
        if isinstance(spec, str):
            return self.request(
                "POST",
                "/jobs",
                content=spec.encode(),
                headers={"Content-Type": "application/yaml"},
                params=params,
            )
        return self.request("POST", "/jobs", json=dict(spec), params=params)

    def submit_from_job(
        self,
        job_id: int,
        *,
        code: str | None = None,
        hold: bool = False,
        labels: Mapping[str, object] | None = None,
    ) -> dict[str, Any]:
        """Submit a copy of job `job_id` as a new job and return it (`corral submit --from-job`):
        its spec as stored (pinned mounts, its group and its code included), whatever the job's
        state. `code`: a code snapshot id (upload_code) to run the copy in instead of the job's
        own; `hold`: as for `submit`. Refusals raise ApiError with the server's message: no such
        job or one you may not see (404, the same answer for both), a spec the server no longer accepts
        (422: a copy of an environment's build job, a mount gone since). `labels`: as for
        `submit`."""
        return self.submit(self.job(job_id)["spec"], code=code, hold=hold, labels=labels)

    def retry(self, job_id: int, *, hold: bool = False) -> dict[str, Any]:
        """Submit a copy of job `job_id`, which has ended (succeeded, failed or cancelled), as a
        new job and return it (`corral retry`, Slurm's `scontrol requeue`): `submit_from_job` for
        an ended job. A job still queued or running has not ended, so there is nothing to retry:
        CorralError naming its state. Otherwise refused as `submit_from_job` is."""
        source = self.job(job_id)
        if source["state"] not in TERMINAL_STATES:
            raise CorralError(
                f"job {job_id} is {source['state']}, not ended: only a succeeded, failed or cancelled "
                f"job is retried (cancel it first to start it over: `corral cancel {job_id}`)"
            )
        return self.submit(source["spec"], hold=hold)

    def jobs(
        self,
        *,
        state: str | None = None,
        user: str | None = None,
        group: str | None = None,
        labels: Mapping[str, object] | None = None,
        ids: Iterable[int] | None = None,
        sort: str = "created_at",
        order: str = "desc",
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        """One page of the jobs you can see: {"items", "total", "limit", "offset"}. `state`:
        comma-separated states; `labels`: {"experiment": "e1"} for the jobs carrying all of them
        (a value None: the label with any value); `ids`: only these jobs (at most 1000)."""
        params: dict[str, Any] = {"sort": sort, "order": order, "limit": limit, "offset": offset}
        params.update({k: v for k, v in {"state": state, "user": user, "group": group}.items() if v})
        if labels:
            params["label"] = label_selectors(labels)
        if ids is not None:
            params["id"] = ",".join(str(int(i)) for i in ids)
        return self.request("GET", "/jobs", params=params)

    def job(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{seg(job_id)}")

    def cancel(self, job_id: int, *, reason: str | None = None) -> dict[str, Any]:
        """Cancel a job; `reason` (one line) follows who cancelled it in the job's reason:
        "cancel requested by alice: stopped early at step 5"."""
        body = {"json": {"reason": reason}} if reason is not None else {}
        return self.request("POST", f"/jobs/{seg(job_id)}/cancel", **body)

    def cancel_by_labels(
        self,
        labels: Mapping[str, object],
        *,
        reason: str | None = None,
        user: str | None = None,
        all_users: bool = False,
    ) -> dict[str, Any]:
        """Cancel every live job of yours that carries all of `labels` (`corral cancel -l`):
        {"matched", "more", "items": [{"id", "outcome", "state", "message"}]}, outcome
        `cancelled` (it was queued), `stopping` (it runs and is being stopped), `ended` or `gone`
        (meanwhile); at most 1000 at once (`more`: call again). `reason`: as for `cancel`.
        Others' jobs only when asked: `user` (that user's) or `all_users` (every job you may act
        on), for admins and group admins (every job in their groups, a former member's too)."""
        if not labels:
            raise CorralError("name at least one label whose jobs to cancel")
        body: dict[str, Any] = {"labels": label_selectors(labels)}
        if reason is not None:
            body["reason"] = reason
        if user is not None:
            body["user"] = user
        if all_users:
            body["all_users"] = True
        return self.request("POST", "/jobs/cancel", json=body)

    def metrics(self, job_id: int) -> dict[str, Any]:
        """What the job reported in $CORRAL_OUTPUTS/metrics.jsonl (`corral.sdk.report_metrics`
        writes it): {"points": [{"step", "values"}], "latest": {name: value}, "skipped",
        "truncated"}; while it runs and after it ended. Nothing reported yet: no points."""
        return self.request("GET", f"/jobs/{seg(job_id)}/metrics")

    def set_labels(
        self,
        job_id: int,
        labels: Mapping[str, object] | None = None,
        *,
        remove: Iterable[str] | str = (),
    ) -> dict[str, Any]:
        """Edit a job's labels after submit, in any state (`corral label`): set `labels` ({"trial":
        8}: a number is taken as its text) and remove the names in `remove` (one name as a str, or
        many); others stay. The job as it is now. The rules of submit, at most 16 labels in the end:
        ApiError 422 naming the label otherwise."""
        patch: dict[str, object] = {**(labels or {})}
        # a str is one name: iterated, remove="stale" removed the labels s, t, a, l and e (review112 #4)
        for name in (remove,) if isinstance(remove, str) else remove:
            if name in patch:
                raise CorralError(f"label {name!r} is both set and removed: do one of them")
            patch[name] = None
        if not patch:
            raise CorralError("name at least one label to set or remove")
        return self.request("PATCH", f"/jobs/{seg(job_id)}/labels", json={"labels": patch})

    def hold_job(self, job_id: int) -> dict[str, Any]:
        """Hold a queued job back from the scheduler: {"changed", "message", "job"} (`changed`
        false: it already was held). A job that is not queued: ApiError 409."""
        return self.request("POST", f"/jobs/{seg(job_id)}/hold")

    def release_job(self, job_id: int) -> dict[str, Any]:
        """Release a held job (schedulable again at once): {"changed", "message", "job"}
        (`changed` false: it was not held). An admin's hold, by someone else: ApiError 403."""
        return self.request("POST", f"/jobs/{seg(job_id)}/release")

    def delete(self, job_id: int) -> None:
        """Delete a finished job and its logs (owner or admin)."""
        self.request("DELETE", f"/jobs/{seg(job_id)}")

    def events(
        self, job_id: int, *, skip: int = 0, limit: int = 500, before: int | None = None
    ) -> list[dict[str, Any]]:
        """A job's newest events (`limit`, 500 at most) after its newest `skip`, oldest first; of
        those older than the event with id `before` if given (page back with the first's "id").
        Whether more come before them (and whether the server said): `events_page`."""
        return self.events_page(job_id, skip=skip, limit=limit, before=before)[0]

    def events_page(
        self, job_id: int, *, skip: int = 0, limit: int = 500, before: int | None = None
    ) -> tuple[list[dict[str, Any]], int | None]:
        """As `events`, and how many of the job's events come before the first of them: None when
        the server did not count them (no X-Corral-Earlier-Events header) and its page is full, so
        more events may exist (review115 #3). To see them: `before=rows[0]["id"]` where the events
        have ids (a current server whose header a proxy dropped); without ids the server shows at
        most 500 events and pages through none of the rest (upgrade it).

        An older server (review114 #9) sends events without an "id" (each gets "id": None here)
        and ignores `before`; one older still sends no X-Corral-Earlier-Events header and ignores
        `skip` too (a page of numbered events without the header is a current server's whose
        header a proxy dropped: read as asked). Its page would be the newest or the oldest events,
        not the ones asked for, so asking it for either raises CorralError saying so. Without the
        header, a page less than full is the whole rest of the history (count 0)."""
        params: dict[str, int] = {"skip": skip, "limit": limit}
        if before is not None:
            params["before"] = before
        rows, headers = self.request_with_headers("GET", f"/jobs/{seg(job_id)}/events", params=params)
        counted = headers.get(EARLIER_EVENTS_HEADER)
        # A server that numbers its events pages by skip and before: the header alone may have been
        # dropped by a proxy on the way (review115 #4), so events with ids are not refused for it.
        numbered = any("id" in event for event in rows)
        if counted is None and not numbered and (skip or before is not None):
            raise CorralError(
                f"the Corral server at {self.url} is older than paging a job's events: it ignores "
                f"{'skip' if skip else 'before'} and would show its first ones instead; upgrade the "
                f"server to page back"
            )
        if before is not None and not all(_event_id(e) < before for e in rows):
            raise CorralError(
                f"the Corral server at {self.url} is older than paging a job's events by event id: it "
                f"ignores before and would show its newest ones instead; page back with skip "
                f"(corral events --skip N) or upgrade the server"
            )
        for event in rows:
            event.setdefault("id", None)
        if counted is not None:
            return rows, int(counted)
        # Not counted: a full page may have more before it (the oldest servers send their first
        # 500 of any number and say nothing); one less than full is all there is.
        return rows, None if len(rows) >= min(limit, EVENTS_PAGE_MAX) else 0

    def notify_default(self, user: str) -> dict[str, Any]:
        """{"user", "notify": {"on", "to"} | None}: what `user`'s jobs without `notify` get."""
        return self.request("GET", f"/users/{seg(user)}/job-notify")

    def set_notify_default(self, user: str, notify: dict[str, Any] | None) -> dict[str, Any]:
        """Set `user`'s job notification default ({"on": [...], "to": [...]}), or clear it (None)."""
        return self.request("PUT", f"/users/{seg(user)}/job-notify", json={"notify": notify})

    def notifications(self, job_id: int) -> list[dict[str, Any]]:
        """What the job's spec `notify` sent its owner: each event (started, succeeded, failed,
        cancelled, requeued), its state and its message's deliveries (kind, state, attempts, error)."""
        return self.request("GET", f"/jobs/{seg(job_id)}/notifications")

    def logs(
        self, job_id: int, *, attempt: int | None = None, rank: int = 0, offset: int = 0
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        return self.request("GET", f"/jobs/{seg(job_id)}/logs", params=params)

    def follow_logs(
        self, job_id: int, *, attempt: int | None = None, rank: int = 0, poll_s: float = 0.5
    ) -> Iterator[str]:
        """Yield log text as it arrives until the job has ended and everything was read. Follows
        a retried job onto its newest attempt; with `attempt`, that attempt's log until it ended."""
        pinned = attempt is not None
        offset = 0
        while True:
            chunk = self.logs(job_id, attempt=attempt, rank=rank, offset=offset)
            if chunk.get("attempt") is not None and attempt is None:
                attempt = chunk["attempt"]
            if chunk["data"]:
                yield chunk["data"]
            offset = chunk["next_offset"]
            if chunk["eof"]:
                job = self.job(job_id)
                newest = job["attempts"][-1]["number"] if job["attempts"] else None
                if pinned:  # that attempt only: done once it has ended and all of it was read
                    if job["state"] in TERMINAL_STATES or any(
                        a["number"] == attempt and a["ended_at"] for a in job["attempts"]
                    ):
                        return
                elif newest is not None and attempt is not None and newest != attempt:
                    attempt, offset = newest, 0
                    continue
                elif job["state"] in TERMINAL_STATES:
                    return
            if not chunk["data"]:
                time.sleep(poll_s)

    def wait(self, job_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> dict[str, Any]:
        """Poll until the job reaches a terminal state; returns the job. TimeoutError on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL_STATES:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout_s} s")
            time.sleep(poll_s)


def _event_id(event: dict[str, Any]) -> float:
    """An event's id; infinity for one without (an older server's), which no `before` is above."""
    ident = event.get("id")
    return ident if isinstance(ident, int) else float("inf")
