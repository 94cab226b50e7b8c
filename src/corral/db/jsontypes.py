"""Column types that turn the JSON Corral stores into its typed models, and back.

The one place where stored JSON is parsed: a row's `Job.spec` is a `JobSpecV1`, its
`Job.diagnosis` a `JobDiagnosis`, an `Attempt.placement` a tuple of `InstancePlacement`. The JSON
in the database is the same as before these types existed (same keys, no null spec fields), so
no migration is needed and rows written by an older server read back.

Binding also accepts the JSON shape itself (a dict or list as older code and fixtures write it):
it is validated through the same model first, so nothing unvalidated is ever stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import TypeAdapter
from sqlalchemy import JSON
from sqlalchemy.types import TypeDecorator

from corral.domain import (
    InstancePlacement,
    InstancePlacementJSON,
    JobDiagnosis,
    JobDiagnosisJSON,
    Placement,
    diagnosis_to_json,
    placement_to_json,
)
from corral.spec import STORED_SPEC, JobSpecV1

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

# A stored spec changes only in its labels (services/job_labels.py: a new JSON text, a new entry
# here) and the schedule loop reads every queued job's spec each cycle:
# one parsed (frozen) instance per distinct JSON text, so a tick costs a dict lookup per job,
# as the loops' spec reader did before the column was typed.
_SPEC_CACHE_MAX = 8192
_specs: dict[str, JobSpecV1] = {}
_PLACEMENT = TypeAdapter(tuple[InstancePlacement, ...])
_DIAGNOSIS = TypeAdapter(JobDiagnosis)

# JSON edge: what the JSON column hands over or takes, before it is a model.
StoredJSON = dict[str, object] | list[object]


def _spec_from_json(stored: StoredJSON) -> JobSpecV1:
    key = json.dumps(stored)  # key order kept: task order is rank order
    spec = _specs.get(key)
    if spec is None:
        spec = JobSpecV1.model_validate_json(key, context=STORED_SPEC)
        if len(_specs) >= _SPEC_CACHE_MAX:
            _specs.clear()
        _specs[key] = spec
    return spec


class JobSpecColumn(TypeDecorator[JobSpecV1]):
    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: JobSpecV1 | None, dialect: Dialect) -> Mapping[str, object] | None:
        if value is None:
            return None
        if not isinstance(value, JobSpecV1):  # the stored shape, from a fixture or older code
            value = JobSpecV1.model_validate(value, context=STORED_SPEC)
        return value.stored()

    def process_result_value(self, value: StoredJSON | None, dialect: Dialect) -> JobSpecV1 | None:
        return None if value is None else _spec_from_json(value)


class PlacementColumn(TypeDecorator[Placement]):
    impl = JSON
    cache_ok = True

    def process_bind_param(
        self, value: Sequence[InstancePlacement] | None, dialect: Dialect
    ) -> list[InstancePlacementJSON] | None:
        if value is None:
            return None
        if not all(isinstance(p, InstancePlacement) for p in value):
            value = _PLACEMENT.validate_python(value)
        return placement_to_json(tuple(value))

    def process_result_value(self, value: StoredJSON | None, dialect: Dialect) -> Placement | None:
        return None if value is None else _PLACEMENT.validate_python(value)


class DiagnosisColumn(TypeDecorator[JobDiagnosis]):
    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: JobDiagnosis | None, dialect: Dialect) -> JobDiagnosisJSON | None:
        if value is None:
            return None
        if not isinstance(value, JobDiagnosis):
            value = _DIAGNOSIS.validate_python(value)
        return diagnosis_to_json(value)

    def process_result_value(self, value: StoredJSON | None, dialect: Dialect) -> JobDiagnosis | None:
        return None if value is None else _DIAGNOSIS.validate_python(value)
