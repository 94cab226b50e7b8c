"""A submission racing a member's removal or a user's deactivation (corral.services.submit_guard):
whichever goes first, no job of the user's outlives the change. Each side is paused at its
critical point (the removal after its live-jobs check, the submission after its job's INSERT and
access check) while the other runs from another thread; on SQLite and PostgreSQL alike."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import httpx
import pytest

from corral.db.models import Membership
from corral.services import accounts, jobs, offboard
from tests.api.conftest import SIMPLE_JOB, World

API = "/api/v1"
LIVE_JOBS = offboard.live_jobs  # the real one, whatever a test patches
PAUSE_S = 0.6  # how long the paused side waits for the other before going on


class Pause:
    """Wraps `real` so that its first call (after running, or before when `before`) signals
    `reached` and waits for `resume`."""

    def __init__(self, real: Callable[..., Any], *, before: bool = False) -> None:
        self.real, self.before = real, before
        self.reached, self.resume = threading.Event(), threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.before:
            self._hold()
        result = self.real(*args, **kwargs)
        if not self.before:
            self._hold()
        return result

    def _hold(self) -> None:
        if not self.reached.is_set():
            self.reached.set()
            assert self.resume.wait(10)


def _offboard(w: World, change: str) -> Callable[[], httpx.Response]:
    if change == "removal":
        return lambda: w.client.delete(f"{API}/groups/vision/members/alice", headers=w.as_("bob"))
    return lambda: w.client.post(f"{API}/users/alice/deactivate", headers=w.as_("admin"))


def _submit(w: World) -> httpx.Response:
    return w.client.post(f"{API}/jobs", json={**SIMPLE_JOB, "group": "vision"}, headers=w.as_("alice"))


def _race(
    first: Callable[[], httpx.Response], pause: Pause, second: Callable[[], httpx.Response]
) -> tuple[httpx.Response, httpx.Response]:
    """Run `first` until it reaches `pause`, then `second` (given PAUSE_S to finish), then let
    `first` go on; both answers."""
    with ThreadPoolExecutor(2) as pool:
        one: Future[httpx.Response] = pool.submit(first)
        assert pause.reached.wait(10), "the first request never reached its pause"
        two = pool.submit(second)
        wait([two], timeout=PAUSE_S)  # done here without the fix: it did not wait for `first`
        pause.resume.set()
        return one.result(20), two.result(20)


@pytest.mark.parametrize("change", ["removal", "deactivation"])
def test_a_submission_after_the_live_jobs_check_is_refused(
    world: World, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    pause = Pause(offboard.live_jobs)
    monkeypatch.setattr(offboard, "live_jobs", pause)
    changed, submitted = _race(_offboard(w, change), pause, lambda: _submit(w))
    assert changed.status_code in (200, 204), changed.text
    # Refused by the submission's own check (403) or, once the change committed, by the
    # credentials' (404 as for a group that does not exist, 401 deactivated): never queued.
    detail = submitted.json()["detail"]
    if change == "removal":
        refused = (403, "you are no longer a member of group 'vision', so you cannot submit jobs to it")
        assert (submitted.status_code, detail) in (refused, (404, "no group named 'vision'")), detail
    else:
        assert submitted.status_code in (401, 403) and "deactivated" in detail, detail
    assert _alice(w) == ((False, True, []) if change == "deactivation" else (True, False, []))


@pytest.mark.parametrize("change", ["removal", "deactivation"])
def test_a_change_during_a_submission_is_refused_naming_its_job(
    world: World, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    pause = Pause(jobs.record_event, before=True)  # the job is INSERTed and its access checked
    monkeypatch.setattr(jobs, "record_event", pause)
    submitted, changed = _race(lambda: _submit(w), pause, _offboard(w, change))
    assert submitted.status_code == 201, submitted.text
    job = submitted.json()["id"]
    assert changed.status_code == 409 and f"live jobs (job {job})" in changed.json()["detail"], changed.text
    assert _alice(w) == (True, True, [job])


def _alice(w: World) -> tuple[bool, bool, list[int]]:
    """Whether alice is active, whether she is in vision, and her live jobs there."""
    with w.session_factory() as db:
        user = accounts.user_by_name(db, "alice")
        member = db.get(Membership, (user.id, accounts.group_by_name(db, "vision").id)) is not None
        return user.active, member, [job for job, _ws in LIVE_JOBS(db, user.id)]


def test_two_admins_stepping_down_at_once_leave_the_group_one(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's last admin is neither removed nor made a member (93af9b6), by a count of its
    admins: two demotions at once (alice and bob, vision's two admins, each made a member) both
    counted two and both went through, leaving vision with none. The group's row is locked
    before the count, so the second waits for the first and counts one."""
    w = world
    made = w.client.post(
        f"{API}/groups/vision/members", json={"user": "alice", "role": "admin"}, headers=w.as_("admin")
    )
    assert made.status_code == 200, made.text
    pause = Pause(accounts.admin_count)
    monkeypatch.setattr(accounts, "admin_count", pause)

    def demote(name: str) -> Callable[[], httpx.Response]:
        body = {"user": name, "role": "member"}
        return lambda: w.client.post(f"{API}/groups/vision/members", json=body, headers=w.as_("admin"))

    first, second = _race(demote("alice"), pause, demote("bob"))
    assert sorted([first.status_code, second.status_code]) == [200, 409], (first.text, second.text)
    assert "they are its last admin" in (first if first.status_code == 409 else second).json()["detail"]
    with w.session_factory() as db:
        assert accounts.admin_count(db, accounts.group_by_name(db, "vision").id) == 1
