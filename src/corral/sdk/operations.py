"""Operations: on-call schedules, escalation policies, pages and contacts; incidents and remediation rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.sdk.base import BaseClient, seg
from corral.sdk.errors import ApiError


class OperationsApi(BaseClient):
    """On-call, paging, incidents and remediation (docs/operations.md)."""

    # --- on-call, escalation and pages (`corral oncall`; docs/operations.md) --------------------
    def on_call_now(self, schedule: str | None = None) -> list[dict[str, Any]]:
        """Who is on call now per schedule (or for `schedule`), until when, and who is next."""
        return self.request("GET", "/oncall/now", params={"schedule": schedule} if schedule else None)

    def schedules(self) -> list[dict[str, Any]]:
        return self.request("GET", "/oncall/schedules")

    def schedule(self, name: str, *, days: float = 7.0) -> dict[str, Any]:
        return self.request("GET", f"/oncall/schedules/{seg(name)}", params={"days": days})

    def put_schedule(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a schedule: {time_zone, description, fallback_user, layers: [...]}.
        The answer's `warnings` name its gaps in the next 14 days."""
        return self.request("PUT", f"/oncall/schedules/{seg(name)}", json=dict(definition))

    def delete_schedule(self, name: str) -> None:
        self.request("DELETE", f"/oncall/schedules/{seg(name)}")

    def add_override(self, schedule: str, user: str, start: float, end: float) -> dict[str, Any]:
        body = {"user": user, "start": start, "end": end}
        return self.request("POST", f"/oncall/schedules/{seg(schedule)}/overrides", json=body)

    def remove_override(self, schedule: str, override_id: int) -> None:
        self.request("DELETE", f"/oncall/schedules/{seg(schedule)}/overrides/{seg(override_id)}")

    def rotate_schedule_feed(self, name: str) -> dict[str, Any]:
        """A new calendar subscription URL for the schedule (admins): `{ical_feed}`, a path; the
        old URL is refused from now on."""
        return self.request("POST", f"/oncall/schedules/{seg(name)}/feed/rotate")

    def schedule_ical(self, name: str) -> str:
        """The schedule's iCalendar feed (text)."""
        response = self._http.get(f"/oncall/schedules/{seg(name)}/ical")
        if not response.is_success:
            self.request("GET", f"/oncall/schedules/{seg(name)}")  # raises the named error
            raise ApiError(response.text, response.status_code, response.text)
        return response.text

    def policies(self) -> list[dict[str, Any]]:
        return self.request("GET", "/oncall/policies")

    def put_policy(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an escalation policy: {steps: [{schedule|user, wait_minutes}], repeat}."""
        return self.request("PUT", f"/oncall/policies/{seg(name)}", json=dict(definition))

    def delete_policy(self, name: str) -> None:
        self.request("DELETE", f"/oncall/policies/{seg(name)}")

    def pages(self, *, state: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit} | ({"state": state} if state else {})
        return self.request("GET", "/oncall/pages", params=params)

    def page(self, policy: str, subject: str, body: str = "", *, key: str | None = None) -> dict[str, Any]:
        """Page through `policy` by hand (admins), e.g. to test the set-up."""
        data = {"policy": policy, "subject": subject, "body": body} | ({"key": key} if key else {})
        return self.request("POST", "/oncall/pages", json=data)

    def ack_page(self, page_id: int) -> dict[str, Any]:
        return self.request("POST", f"/oncall/pages/{seg(page_id)}/ack")

    def cancel_page(self, page_id: int) -> dict[str, Any]:
        return self.request("POST", f"/oncall/pages/{seg(page_id)}/cancel")

    def contacts(self, user: str) -> dict[str, Any]:
        return self.request("GET", f"/users/{seg(user)}/contacts")

    def set_email(self, user: str, email: str | None) -> dict[str, Any]:
        return self.request("PUT", f"/users/{seg(user)}/email", json={"email": email})

    def add_contact(self, user: str, kind: str, address: str) -> dict[str, Any]:
        """kind: email | webhook (generic JSON) | slack (Slack/Mattermost incoming webhook)."""
        return self.request("POST", f"/users/{seg(user)}/contacts", json={"kind": kind, "address": address})

    def remove_contact(self, user: str, contact_id: int) -> None:
        self.request("DELETE", f"/users/{seg(user)}/contacts/{seg(contact_id)}")

    # --- incidents and remediation rules (admins; corral.services.incidents / .remediation) ------
    def incidents(self, **filters: Any) -> dict[str, Any]:
        """Incidents, newest first: filters state, severity, node, open, flapping (True: only
        flapping ones, False: only the others), limit, offset."""
        params = {k: v for k, v in filters.items() if v is not None}
        return self.request("GET", "/incidents", params=params)

    def incident(self, incident_id: int) -> dict[str, Any]:
        return self.request("GET", f"/incidents/{seg(incident_id)}")

    def incident_action(self, incident_id: int, action: str, **body: Any) -> dict[str, Any]:
        """ack | comment (text=) | mitigate (note=) | resolve (note=) | close."""
        return self.request("POST", f"/incidents/{seg(incident_id)}/{seg(action)}", json=body)

    def edit_incident(self, incident_id: int, **changes: Any) -> dict[str, Any]:
        return self.request("PATCH", f"/incidents/{seg(incident_id)}", json=changes)

    def write_postmortem(self, incident_id: int, **postmortem: Any) -> dict[str, Any]:
        """summary, impact, root_cause, action_items=[{what, owner, due: YYYY-MM-DD}]."""
        path = f"/incidents/{seg(incident_id)}/postmortem"
        return self.request("PUT", path, json=postmortem)

    def remediation_rules(self, version: int | None = None) -> dict[str, Any]:
        path = "/remediation/rules" if version is None else f"/remediation/rules/{seg(version)}"
        return self.request("GET", path)

    def apply_remediation_rules(self, text: str) -> dict[str, Any]:
        return self.request("PUT", "/remediation/rules", json={"text": text})

    def remediation_history(self) -> list[dict[str, Any]]:
        return self.request("GET", "/remediation/rules/history")["items"]

    def remediation_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.request("GET", "/remediation/runs", params={"limit": limit})["items"]
