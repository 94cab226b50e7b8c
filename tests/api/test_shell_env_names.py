"""A job's variable named as one of bash's own (UID, RANDOM, ...): refused at submit naming it,
in the API's schema too; a job stored before the rule stays readable (review111 #3)."""

from __future__ import annotations

import time

import jsonschema
import pytest

from corral.api.routers.jobs import spec_body_schema
from corral.db.catalog_models import TemplateVersion
from corral.db.models import Group, Job, User
from corral.spec import RESERVED_ENV, SHELL_OWNED_ENV, STORED_SPEC, JobSpecV1, ValidationError, parse_spec
from tests.api.conftest import SIMPLE_JOB, World

API = "/api/v1"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {**SIMPLE_JOB, "env": {"UID": "7"}},
            "env name 'UID' is a shell's own variable: bash keeps it read-only",
        ),
        (
            {"name": "t", "tasks": {"main": {"command": "true", "env": {"RANDOM": "4"}}}},
            "env name 'RANDOM' is a shell's own variable: bash sets it itself, so the job would not get"
            " your value; use another name",
        ),
        (
            {**SIMPLE_JOB, "secrets": [{"name": "s", "env": "EUID"}]},
            "secret 's': env 'EUID' is a shell's own variable",
        ),
    ],
)
def test_a_new_spec_naming_a_shells_own_variable_is_refused_naming_it(
    spec: dict[str, object], words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        parse_spec(spec)
    assert JobSpecV1.model_validate(spec, context=STORED_SPEC).name == spec["name"]  # as stored: read


def test_the_schema_excludes_exactly_the_names_refused() -> None:
    schema = spec_body_schema()
    for env in (schema["properties"]["env"], schema["$defs"]["TaskV1"]["properties"]["env"]):
        assert env["propertyNames"]["not"] == {"enum": sorted(SHELL_OWNED_ENV)}
        validator = jsonschema.Draft202012Validator(env)
        assert validator.is_valid({"TRIAL": "1", "UID_": "2"}) and not validator.is_valid({"UID": "7"})
    secret_env = schema["$defs"]["SecretUseV1"]["properties"]["env"]
    assert {"enum": sorted(RESERVED_ENV | SHELL_OWNED_ENV)} in secret_env["not"]["anyOf"]


def test_a_job_stored_with_such_a_name_is_shown_and_its_resubmission_refused(world: World) -> None:
    stored = {**SIMPLE_JOB, "env": {"UID": "7", "TRIAL": "1"}}
    with world.session_factory() as db:
        now = time.time()
        job = Job(
            name="old",
            user_id=db.query(User.id).filter(User.name == "alice").scalar(),
            group_id=db.query(Group.id).filter(Group.name == "vision").scalar(),
            state="queued",
            spec=JobSpecV1.model_validate(stored, context=STORED_SPEC),
            submitted_at=now,
            updated_at=now,
        )
        db.add(job)
        db.commit()
        job_id = job.id
    with world.session_factory() as db:  # read back from its row, as dispatch and `show` read it
        assert db.get(Job, job_id).spec.env == {"UID": "7", "TRIAL": "1"}
    alice = world.as_("alice")
    shown = world.client.get(f"{API}/jobs/{job_id}", headers=alice)
    assert shown.status_code == 200, shown.text
    assert shown.json()["spec"]["env"] == {"UID": "7", "TRIAL": "1"}
    again = world.client.post(f"{API}/jobs", json=shown.json()["spec"], headers=alice)
    assert again.status_code == 422, again.text
    (err,) = again.json()["detail"]
    assert err["loc"][:2] == ["body", "env"] and "'UID' is a shell's own variable" in err["msg"]


def test_a_template_stored_with_such_a_name_is_shown_and_its_use_refused_naming_it(world: World) -> None:
    alice = world.as_("alice")
    spec = {**SIMPLE_JOB, "env": {"TRIAL": "1"}}
    assert (
        world.client.post(f"{API}/templates", json={"name": "old", "spec": spec}, headers=alice).status_code
        == 201
    )
    with world.session_factory() as db:  # as stored before the rule
        version = db.query(TemplateVersion).one()
        version.body = {**version.body, "env": {"UID": "7"}}
        db.commit()
    shown = world.client.get(f"{API}/templates/old", headers=alice)
    assert shown.status_code == 200, shown.text
    used = world.client.post(f"{API}/templates/old/use", json={"values": {}}, headers=alice)
    assert used.status_code == 422, used.text
    assert "env name 'UID' is a shell's own variable" in used.text
    new = world.client.post(
        f"{API}/templates", json={"name": "new", "spec": {**SIMPLE_JOB, "env": {"UID": "7"}}}, headers=alice
    )
    assert new.status_code == 422 and "env name 'UID' is a shell's own variable" in new.text, new.text
