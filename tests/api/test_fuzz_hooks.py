"""The fuzz hooks' rule for repeatable query parameters (tests/fuzz_hooks.py): an ST201 is dropped
only when the query as sent is a valid one for every mutated parameter, each an array parameter;
an invalid value the server accepted, or a scalar parameter, stays a failure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import schemathesis
from schemathesis.core.parameters import ParameterLocation

from tests.api.conftest import World
from tests.fuzz_hooks import _query_array_sent_valid

ST201 = SimpleNamespace(code="ST201")


def _case(world: World, *mutated: str) -> Any:
    operation = schemathesis.openapi.from_dict(world.client.get("/openapi.json").json())["/api/v1/jobs"][
        "GET"
    ]
    mutations = [
        SimpleNamespace(parameter=name, parameter_location=ParameterLocation.QUERY) for name in mutated
    ]
    return SimpleNamespace(
        meta=SimpleNamespace(phase=SimpleNamespace(data=SimpleNamespace(mutations=mutations))),
        operation=operation,
    )


def _sent(query: str) -> Any:
    return SimpleNamespace(request=SimpleNamespace(url=f"http://127.0.0.1/api/v1/jobs?{query}"))


def test_a_scalar_sent_for_an_array_parameter_is_dropped_only_when_the_wire_form_is_valid(
    world: World,
) -> None:
    labels = _case(world, "label")
    # `false` generated as the invalid (non-array) value: on the wire the valid array ["false"]
    assert _query_array_sent_valid(ST201, labels, _sent("label=false"))
    assert _query_array_sent_valid(ST201, labels, _sent("label=a&label=b%3Dc"))
    # an invalid selector as sent stays a failure, as does any other check's
    assert not _query_array_sent_valid(ST201, labels, _sent("label=%00"))
    assert not _query_array_sent_valid(ST201, labels, _sent("label=a&label=%00"))
    assert not _query_array_sent_valid(SimpleNamespace(code="ST202"), labels, _sent("label=false"))
    # a parameter the request did not carry, a scalar parameter, or one of two mutations not covered
    assert not _query_array_sent_valid(ST201, labels, _sent("user=a"))
    assert not _query_array_sent_valid(ST201, _case(world, "user"), _sent("user=a"))
    assert not _query_array_sent_valid(ST201, _case(world, "label", "user"), _sent("label=a&user=b"))
