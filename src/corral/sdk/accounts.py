"""Groups and quotas, users, tokens, the audit log and secrets for jobs."""

from __future__ import annotations

import base64
from typing import Any

from corral.sdk.base import KEEP, BaseClient, Keep, seg


class AccountsApi(BaseClient):
    """Who may do what: groups, users, tokens; the admin audit log; secrets."""

    def groups(self) -> list[dict[str, Any]]:
        return self.request("GET", "/groups")

    def create_group(self, name: str, **fields: Any) -> dict[str, Any]:
        return self.request("POST", "/groups", json={"name": name, **fields})

    def group(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/groups/{seg(name)}")

    def set_quota(
        self,
        group: str,
        *,
        gpu_model: str = "*",
        guaranteed: int | None = None,
        max_gpus: int | Keep | None = KEEP,
        **group_fields: Any,
    ) -> dict[str, Any]:
        """Change only what is passed. The GPU quota of `gpu_model` changes when `guaranteed` or
        `max_gpus` is passed (`max_gpus=None`: no limit); the rest keeps its value. Group-wide
        fields: user_max_gpus, weight, borrowing, cpus_guaranteed, cpus_max,
        memory_guaranteed_mib, memory_max_mib (None clears the limits: no per-user cap, no max)."""
        body: dict[str, Any] = dict(group_fields)
        if guaranteed is not None or not isinstance(max_gpus, Keep):
            body["gpu_model"] = gpu_model
            if guaranteed is not None:
                body["guaranteed"] = guaranteed
            if not isinstance(max_gpus, Keep):
                body["max"] = max_gpus
        return self.request("PUT", f"/groups/{seg(group)}/quota", json=body)

    def remove_quota(self, group: str, gpu_model: str) -> dict[str, Any]:
        """Remove the group's GPU quota row of `gpu_model` ("*" included; 404 when it has none);
        returns the group."""
        return self.request("DELETE", f"/groups/{seg(group)}/quota", params={"gpu_model": gpu_model})

    def add_member(self, group: str, user: str, role: str | None = None) -> dict[str, Any]:
        """Add `user` to `group` (as a member unless `role`), or set their role there; without
        `role` an existing member keeps theirs."""
        body = {"user": user} if role is None else {"user": user, "role": role}
        return self.request("POST", f"/groups/{seg(group)}/members", json=body)

    def remove_member(self, group: str, user: str, *, cancel_jobs: bool = False) -> None:
        """Take `user` out of `group`; refused (409, naming them) while they have live jobs in
        it, unless `cancel_jobs` cancels those first."""
        params = {"cancel_jobs": "true"} if cancel_jobs else None
        self.request("DELETE", f"/groups/{seg(group)}/members/{seg(user)}", params=params)

    # users and tokens
    def users(self) -> list[dict[str, Any]]:
        return self.request("GET", "/users")

    def create_user(
        self,
        name: str,
        *,
        password: str | None = None,
        is_admin: bool = False,
        groups: list[str] | None = None,
        default_group: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "name": name,
            "password": password,
            "is_admin": is_admin,
            "groups": groups or [],
            "default_group": default_group,
        }
        return self.request("POST", "/users", json=body)

    def deactivate_user(self, name: str, *, cancel_jobs: bool = False) -> dict[str, Any]:
        """No more logins, tokens or SSH keys for `name`, and their open sessions end; refused
        (409, naming them) while they have live jobs, unless `cancel_jobs` cancels those first."""
        params = {"cancel_jobs": "true"} if cancel_jobs else None
        return self.request("POST", f"/users/{seg(name)}/deactivate", params=params)

    def activate_user(self, name: str) -> dict[str, Any]:
        return self.request("POST", f"/users/{seg(name)}/activate")

    def set_default_group(self, user: str, group: str) -> dict[str, Any]:
        return self.request("PUT", f"/users/{seg(user)}/default-group", json={"group": group})

    def set_password(self, user: str, password: str, *, current_password: str | None = None) -> None:
        body = {"password": password, "current_password": current_password}
        self.request("PUT", f"/users/{seg(user)}/password", json=body)

    def tokens(self, *, user: str | None = None, all_users: bool = False) -> list[dict[str, Any]]:
        """Your tokens; admins: `user`'s, or everyone's with `all_users`."""
        params: dict[str, Any] = {"user": user} if user else {}
        if all_users:
            params["all"] = "true"
        return self.request("GET", "/tokens", params=params or None)

    def create_token(
        self, name: str = "cli", *, user: str | None = None, expires_in_days: float | None = None
    ) -> dict[str, Any]:
        return self.request(
            "POST", "/tokens", json={"name": name, "user": user, "expires_in_days": expires_in_days}
        )

    def revoke_token(self, token_id: int) -> None:
        self.request("DELETE", f"/tokens/{seg(token_id)}")

    # --- admin audit log (admins) ---------------------------------------------------------------

    def audit(
        self,
        *,
        actor: str | None = None,
        action: str | None = None,
        target: str | None = None,
        since: str | float | None = None,
        until: str | float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> dict[str, Any]:
        """One page of the audit log, newest first: {"items", "total", "limit", "offset"}.
        `action` is a dotted prefix ("group" matches "group.quota.set"); `target` is "KIND" or
        "KIND:ID"; `since`/`until` are ages ("7d", "12h"), unix seconds or ISO times."""
        filters = {"actor": actor, "action": action, "target": target, "since": since, "until": until}
        params: dict[str, Any] = {k: str(v) for k, v in filters.items() if v is not None}
        return self.request("GET", "/audit", params={**params, "limit": limit, "offset": offset})

    # --- secrets for jobs (`corral secret`; values are write-only: nothing returns one) -----------
    def secrets(self, *, group: str | None = None) -> list[dict[str, Any]]:
        """Your secrets and your groups' (or only `group`'s): names, scope and times."""
        return self.request("GET", "/secrets", params={"group": group} if group else None)

    def set_secret(self, name: str, value: str | bytes, *, group: str | None = None) -> dict[str, Any]:
        """Create or replace your secret `name` (or `group`'s, as its admin). Bytes that are not
        UTF-8 travel as base64."""
        body: dict[str, str]
        if isinstance(value, bytes):
            try:
                body = {"value": value.decode()}
            except UnicodeDecodeError:
                body = {"value_base64": base64.b64encode(value).decode()}
        else:
            body = {"value": value}
        params = {"group": group} if group else None
        return self.request("PUT", f"/secrets/{seg(name)}", json=body, params=params)

    def delete_secret(self, name: str, *, group: str | None = None) -> None:
        params = {"group": group} if group else None
        self.request("DELETE", f"/secrets/{seg(name)}", params=params)
