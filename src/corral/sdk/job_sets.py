"""Waiting for many jobs at once (an AutoML search's trials, a sweep): `wait_any` and `wait_all`
watch a set of jobs, given by id or by label, with one list request per poll (GET /jobs?id=... or
?label=...), not one GET per job; `hold_by_labels` / `release_by_labels` hold or release every
queued one carrying some labels; and `report_metrics`, which a job calls to report a metric that
the tool reads back with `Client.metrics`.

A set given by label is your own jobs carrying the labels unless you ask for others' (`user=`,
or `all_users=True`): labels are free text, and another user's experiment may share yours."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from corral.metric_points import point_problem
from corral.sdk.base import BaseClient
from corral.sdk.errors import CorralError
from corral.sdk.jobs import TERMINAL_STATES, label_selectors

LIVE_STATES = ("queued", "scheduled", "starting", "running", "preempted")
MAX_IDS = 1000  # ids per list request (the server's limit)
PAGE = 100  # jobs per page read (a bigger page counts against the server's big-list rate limit)
MANY_MAX_POINTS = 100_000  # GET /jobs/metrics: at most tail x limit points a page (the server's)
METRICS_FILE = "metrics.jsonl"


def _chunks(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + MAX_IDS] for i in range(0, len(ids), MAX_IDS)]


class JobSetsApi(BaseClient):
    """Watching sets of jobs: by ids (`wait_any`, `wait_all`) or by labels (`wait_all`)."""

    _my_name: str | None = None  # GET /me's, asked once: whose jobs a set by labels is

    def _list(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.request("GET", "/jobs", params={"sort": "id", "order": "asc", **params})

    def _all_of(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every job under `params`, page by page."""
        found: list[dict[str, Any]] = []
        while True:
            page = self._list({**params, "limit": PAGE, "offset": len(found)})
            found.extend(page["items"])
            if not page["items"] or len(found) >= page["total"]:
                return found

    def iter_jobs(
        self,
        *,
        labels: Mapping[str, object] | None = None,
        state: str | None = None,
        user: str | None = None,
        group: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every job you can see under the filters (as `jobs`), oldest first, page by page: a
        restarted tool's trials however many (`jobs` gives one page of at most 1000). Pages go by
        offset in id order: a job submitted meanwhile comes last, and one deleted meanwhile may
        make it miss the job after it on the next page."""
        named = {"state": state, "user": user, "group": group}
        params: dict[str, Any] = {k: v for k, v in named.items() if v}
        if labels:
            params["label"] = label_selectors(labels)
        offset = 0
        while True:
            page = self._list({**params, "limit": PAGE, "offset": offset})
            yield from page["items"]
            offset += len(page["items"])
            if not page["items"] or offset >= page["total"]:
                return

    def _whose(self, user: str | None, all_users: bool) -> dict[str, Any]:
        """The `user` filter of a set given by labels: yours (GET /me, asked once), `user`'s, or
        none (`all_users`: every job you can see)."""
        if user is not None and all_users:
            raise CorralError("give user or all_users, not both")
        if all_users:
            return {}
        if user is None:
            if self._my_name is None:
                self._my_name = self.request("GET", "/me")["name"]
            user = self._my_name
        return {"user": user}

    def _selections(
        self,
        job_ids: Iterable[int] | None,
        labels: Mapping[str, object] | None,
        user: str | None = None,
        all_users: bool = False,
    ) -> list[dict[str, Any]]:
        """The list requests' filters that together name the set: ids in chunks, or labels (of
        your jobs, `user`'s, or `all_users`)."""
        if (job_ids is None) == (labels is None):
            raise CorralError("name the jobs to wait for by job_ids or by labels, one of them")
        if labels is not None:
            if not labels:
                raise CorralError("name at least one label of the jobs to wait for")
            return [{"label": label_selectors(labels), **self._whose(user, all_users)}]
        if user is not None or all_users:
            raise CorralError("user and all_users go with labels; ids name the jobs themselves")
        ids = list(dict.fromkeys(int(i) for i in job_ids or ()))
        if not ids:
            raise CorralError("no job ids given to wait for")
        return [{"id": ",".join(map(str, chunk))} for chunk in _chunks(ids)]

    def _check_found(self, selections: list[dict[str, Any]], job_ids: Iterable[int] | None) -> None:
        """Every id names a job you can see, and a label selection matches some job: a wrong id
        or a misspelt label would otherwise wait for nothing, or forever."""
        if job_ids is None:
            if not self._list({**selections[0], "limit": 1})["total"]:
                named = ", ".join(selections[0]["label"])
                whose = f"of {selections[0]['user']} " if "user" in selections[0] else ""
                raise CorralError(f"no job {whose}you can see carries the labels {named}")
            return
        for selection in selections:
            self._check_ids_there(selection, "no job with id {} (or not one you can see)")

    def _check_ids_there(self, selection: dict[str, Any], missing_words: str) -> None:
        """CorralError (`missing_words` formatted with the ids) when some of the selection's ids
        name no job you can see: a wrong id, or a job deleted (purged) while waited on."""
        wanted = {int(i) for i in selection["id"].split(",")}
        if self._list({**selection, "limit": 1})["total"] == len(wanted):
            return
        missing = sorted(wanted - {job["id"] for job in self._all_of(selection)})
        if missing:
            raise CorralError(missing_words.format(", ".join(map(str, missing))))

    def hold_by_labels(
        self, labels: Mapping[str, object], *, user: str | None = None, all_users: bool = False
    ) -> dict[str, Any]:
        """Hold every queued job of yours that carries all of `labels` (`corral hold -l`):
        {"matched", "more", "items": [{"id", "outcome", "state", "held", "message"}]}, outcome
        `held`, `unchanged` (it already was), `refused` (placed meanwhile) or `gone` (deleted
        meanwhile); at most 1000 at once (`more`: call again). Others' jobs only when asked, as
        for `cancel_by_labels` (`user`, `all_users`)."""
        return self._hold_set("hold", labels, user, all_users)

    def release_by_labels(
        self, labels: Mapping[str, object], *, user: str | None = None, all_users: bool = False
    ) -> dict[str, Any]:
        """Release every queued job of yours that carries all of `labels` (`corral release -l`):
        as `hold_by_labels`, outcome `released`, `unchanged` (it was not held), `refused` (an
        admin's hold, released by someone else) or `gone`."""
        return self._hold_set("release", labels, user, all_users)

    def _hold_set(
        self, verb: str, labels: Mapping[str, object], user: str | None, all_users: bool
    ) -> dict[str, Any]:
        if not labels:  # the server refuses it too: said here before a request
            raise CorralError(f"name at least one label whose jobs to {verb}")
        body: dict[str, Any] = {"labels": label_selectors(labels)}
        if user is not None:
            body["user"] = user
        if all_users:
            body["all_users"] = True
        return self.request("POST", f"/jobs/{verb}", json=body)

    def metrics_of(
        self,
        job_ids: Iterable[int] | None = None,
        *,
        labels: Mapping[str, object] | None = None,
        state: str | None = None,
        tail: int = 100,
        user: str | None = None,
        all_users: bool = False,
    ) -> list[dict[str, Any]]:
        """Many jobs' metrics at once, by id (GET /jobs/metrics, up to 100 jobs a request): for
        each job given (by id, or of yours carrying all of `labels`: `user`, `all_users` as for
        `wait_all`; `state`: comma-separated states) its `state`, `labels`, `latest` values and
        last `tail` points, as `metrics` gives one job's. What an early-stopping rule compares
        each round, in one request instead of one per trial."""
        found: list[dict[str, Any]] = []
        page_jobs = max(1, min(PAGE, MANY_MAX_POINTS // max(1, tail)))  # the server's tail x limit cap
        for selection in self._selections(job_ids, labels, user, all_users):
            params = {**selection, "tail": tail, "limit": page_jobs, **({"state": state} if state else {})}
            offset = 0
            while True:
                page = self.request("GET", "/jobs/metrics", params={**params, "offset": offset})
                found.extend(page["items"])
                offset += len(page["items"])
                if not page["items"] or offset >= page["total"]:
                    break
        return found

    def wait_all(
        self,
        job_ids: Iterable[int] | None = None,
        *,
        labels: Mapping[str, object] | None = None,
        timeout_s: float | None = None,
        poll_s: float = 2.0,
        user: str | None = None,
        all_users: bool = False,
    ) -> list[dict[str, Any]]:
        """Wait until every job given (by id, or every job of yours carrying all of `labels`,
        including those submitted meanwhile; `user`: that user's instead, `all_users`: every
        one you can see) has ended; the jobs, by id. Each poll is one request (per 1000 ids)
        that counts the jobs still live. TimeoutError naming how many are left; CorralError
        naming the ids of jobs deleted while waited on."""
        selections = self._selections(job_ids, labels, user, all_users)
        self._check_found(selections, job_ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        live_states = ",".join(LIVE_STATES)
        while True:
            live = sum(self._list({**s, "state": live_states, "limit": 1})["total"] for s in selections)
            if not live:
                if job_ids is not None:
                    for s in selections:
                        self._check_ids_there(s, "job {} was deleted while waited on")
                return [job for s in selections for job in self._all_of(s)]
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{live} of the jobs are still queued or running after {timeout_s} s")
            time.sleep(poll_s)

    def wait_any(
        self, job_ids: Iterable[int], *, timeout_s: float | None = None, poll_s: float = 2.0
    ) -> list[dict[str, Any]]:
        """Wait until at least one of the jobs has ended; every one of them that has, by id (an
        AutoML loop: start a trial in each freed place, read the ended ones' metrics). One
        request per poll (per 1000 ids), and one more that counts them while none has ended.
        TimeoutError when none has ended in time; CorralError naming the ids of jobs deleted
        meanwhile (one that ended and was deleted between two polls would be waited on forever)."""
        ids = list(job_ids)
        selections = self._selections(ids, None)
        self._check_found(selections, ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ended_states = ",".join(sorted(TERMINAL_STATES))
        while True:
            ended = [job for s in selections for job in self._all_of({**s, "state": ended_states})]
            if ended:
                return ended
            for s in selections:
                self._check_ids_there(s, "job {} was deleted while waited on")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"none of the {len(ids)} jobs has ended after {timeout_s} s")
            time.sleep(poll_s)


def report_metrics(step: int | None = None, **values: float) -> None:
    """Inside a job: append one point to $CORRAL_OUTPUTS/metrics.jsonl, which `Client.metrics`
    (GET /jobs/{id}/metrics) reads, e.g. `report_metrics(step=3, loss=0.41, accuracy=0.88)`.
    Any program may write the same line itself: one JSON object of names to numbers per line."""
    outputs = os.environ.get("CORRAL_OUTPUTS")
    if not outputs:
        raise CorralError("CORRAL_OUTPUTS is not set: report_metrics runs inside a Corral job")
    problem = point_problem(step, dict(values))  # the server's own rules: it would skip the point
    if problem is not None:
        raise CorralError(f"report_metrics: {problem}")
    point = {"step": step, **values} if step is not None else dict(values)
    # One write of one whole line (O_APPEND): a reader never sees half of it as a line of its own.
    line = (json.dumps(point) + "\n").encode()
    fd = os.open(Path(outputs) / METRICS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
