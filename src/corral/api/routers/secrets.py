"""Secrets for jobs (corral.services.secrets): set, list, delete. Values are write-only: no
answer ever carries one."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from corral.api.deps import DB, NO_NUL_TEXT, CurrentUser, fast_json
from corral.api.schemas import RequestBody
from corral.services import secrets as svc
from corral.services.errors import Invalid
from corral.spec import SECRET_NAME_RE

router = APIRouter(tags=["secrets"])
GroupQuery = Query(
    None,
    min_length=1,
    max_length=64,
    pattern=NO_NUL_TEXT,
    description="a group's secret instead of your own (set/delete: its admins)",
)


BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
SecretName = Annotated[str, Path(pattern=SECRET_NAME_RE)]


class SecretIn(RequestBody):
    """The value as text (`value`) or as base64 (`value_base64`, for bytes that are not UTF-8)."""

    NUL_ALLOWED = frozenset({"value"})  # stored encrypted: a file secret may hold any bytes
    # Exactly one of the two, as the schema says too.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["value"]}, {"required": ["value_base64"]}],
            "examples": [{"value": "an API key"}],
        },
    )

    # The constraints sit on the string itself: on the union they would reach None (a TypeError)
    # and the pattern would drop out of the schema.
    value: Annotated[str, Field(min_length=1, max_length=svc.MAX_VALUE_BYTES)] | SkipJsonSchema[None] = None
    value_base64: (
        Annotated[
            str, Field(min_length=4, max_length=svc.MAX_VALUE_BYTES * 4 // 3 + 4, pattern=BASE64_PATTERN)
        ]
        | SkipJsonSchema[None]
    ) = None

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        # The schema types both as strings; an explicit null would otherwise reach the length and
        # pattern checks of `str | None` and fail inside pydantic (a 500), not as a bad field.
        if isinstance(data, dict):
            for key in ("value", "value_base64"):
                if key in data and data[key] is None:
                    raise ValueError(f"{key!r} is null: leave it out, or give a string")
        return data

    @model_validator(mode="after")
    def _one(self) -> SecretIn:
        if (self.value is None) == (self.value_base64 is None):
            raise ValueError("give exactly one of 'value' or 'value_base64'")
        return self

    def payload(self) -> bytes:
        if self.value is not None:
            return self.value.encode()
        try:
            return base64.b64decode(self.value_base64 or "", validate=True)
        except (binascii.Error, ValueError):
            raise Invalid("value_base64 is not base64", ("body", "value_base64"))


class SecretOut(BaseModel):
    name: str
    scope: Literal["user", "group"]
    group: str | None
    created_at: float
    updated_at: float
    updated_by: str


@router.get("/secrets", response_model=list[SecretOut])
def list_secrets(db: DB, principal: CurrentUser, group: str | None = GroupQuery) -> Any:
    """Your secrets and those of your groups: names, scope and times, never values."""
    return fast_json(svc.list_secrets(db, principal, group))


@router.put(
    "/secrets/{name}",
    response_model=SecretOut,
    responses={201: {"model": SecretOut, "description": "created"}},
)
def set_secret(
    name: SecretName,
    body: SecretIn,
    request: Request,
    db: DB,
    principal: CurrentUser,
    group: str | None = GroupQuery,
) -> Any:
    """Create (201) or replace (200) a secret. The answer never repeats the value."""
    box = svc.box_for(request.app.state.settings)
    view, created = svc.set_secret(db, principal, box, name, body.payload(), group)
    return fast_json(view, status_code=201 if created else 200)


@router.delete("/secrets/{name}", status_code=204)
def delete_secret(
    name: SecretName, db: DB, principal: CurrentUser, group: str | None = GroupQuery
) -> Response:
    svc.delete_secret(db, principal, name, group)
    return Response(status_code=204)
