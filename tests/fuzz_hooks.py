"""Schemathesis hooks for the API fuzz runs (tests/api/test_fuzz.py, bench/fuzz_api.py), loaded by
the `schemathesis` CLI through SCHEMATHESIS_HOOKS=tests.fuzz_hooks. Configured by environment:

- FUZZ_PROTECTED_TOKEN_IDS: ids of the API tokens the fuzzers authenticate with. A generated
  `DELETE /api/v1/tokens/{id}` naming one is sent for an id that does not exist instead: revoking
  the token in use would turn every later request into a 401 and end the run's meaning (the
  operation is still fuzzed, and tokens the run creates itself are revoked through the links).
- The escalation policy the schema's example page names (tests/fuzz_run.py makes it) is not
  deleted: a generated `DELETE /oncall/policies/example-policy` (the name is captured from
  listings) is sent for a policy that does not exist, so the example page stays valid all run.
- Schema examples (the create operations' `examples`, names starting "example-") are sent with
  a name of their own each time (`example-team-<pid>-<n>`): an example is valid once, and a
  taken name would make every later use a 409, leaving the stateful phase no created resource
  to follow the links from.
- FUZZ_STATS_FILE: where to write, at exit, the responses seen per operation and status, the
  4xx answers without a readable JSON `detail`, and the failures accepted below.

Accepted exceptions (`ACCEPTED`): failures that are right answers the schema cannot express, each
matched on its check code, operation and the answer's text, and each with why. Everything else
fails the run. docs/security.md lists them too.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import schemathesis

TOKENS_PATH = "/api/v1/tokens/{token_id}"
NO_SUCH_TOKEN = 2**31 - 1  # a valid id (corral.api.deps.MAX_ROW_ID) no run gets near
EXAMPLE_PREFIX = "example-"  # the names in the create operations' schema examples
POLICY_PATH = "/api/v1/oncall/policies/{name}"
EXAMPLE_POLICY = "example-policy"  # tests/fuzz_run.py makes it: the schema's example page names it
NO_SUCH_POLICY = "no-such-policy"


@dataclass(frozen=True)
class Accepted:
    code: str  # schemathesis failure code (ST202: schema-valid request rejected ...)
    operation: str  # "GET /api/v1/usage"; ANY_OPERATION: every operation
    answer: str  # a piece of the response body that identifies the case ("": any)
    why: str
    message: str = ""  # a piece of schemathesis's own message on it ("": any)


ANY_OPERATION = "*"
BODY_TOO_LARGE = "the request body is larger than"  # corral.api.limits' 413

ACCEPTED: tuple[Accepted, ...] = (
    Accepted(
        "ST202",
        "PATCH /api/v1/jobs/{job_id}/labels",
        "labels; at most 16 are allowed",
        "a patch that would leave the job more than 16 labels: a relation with the labels it "
        "already carries (the schema bounds the patch)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/jobs",
        "is also set in 'env'",
        "a secret's variable may not also be set in `env` (a relation between two fields)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/environments",
        "needs the group it is shared with",
        "visibility 'group' needs `group`: a relation of two fields (as for templates' share)",
    ),
    Accepted(
        "ST302",
        "POST /api/v1/templates/{name}/use",
        "no model named",
        "the 404 names a model the generated body asks to mount (`models`), not the template just "
        "published: that one exists (the link feeds its name and version)",
    ),
    Accepted(
        "ST302",
        "POST /api/v1/templates/{name}/use",
        "has no version",
        "the 404 names the version the body asks for, not the template just published (which exists, "
        "and whose name the link fed): schemathesis applies a link's body (UseTemplate's `version`) "
        "only on some draws and generates it on the others",
    ),
    # The request size limit (corral.api.limits), before any route.
    Accepted(
        "ST202",
        ANY_OPERATION,
        BODY_TOO_LARGE,
        "the body limit (CORRAL_API_MAX_BODY_BYTES, 1 MiB) counts bytes of the encoded request, and "
        "JSON escapes a character in up to 6 of them; a schema's maxLength counts characters, so a "
        "long enough text of valid characters can still be too large to send",
    ),
    Accepted(
        "ST201",
        ANY_OPERATION,
        BODY_TOO_LARGE,
        "413 is a refusal (the body was not read past the limit, nothing was done); schemathesis "
        "counts only 400, 422 and the like as refusals of invalid data",
    ),
    Accepted(
        "ST201",
        "GET /api/v1/jobs",
        "",
        "`state` is a repeatable query parameter (an array): a string generated as the invalid "
        "value is sent as `state=...`, which is the same request as the valid array of that one "
        "string; the query string cannot tell them apart",
        message="parameter `state` in query - violates `anyOf`",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/jobs/metrics",
        "points; at most",
        "tail x limit is at most 100,000 points a page (corral.services.job_metrics.MANY_MAX_POINTS): "
        "a product of two parameters, which JSON Schema bounds only one by one; the refusal says "
        "which to lower",
    ),
    *(
        Accepted("ST202", operation, answer, why)
        for operation in ("POST /api/v1/jobs/hold", "POST /api/v1/jobs/release", "POST /api/v1/jobs/cancel")
        for answer, why in (
            (
                "give user or all_users, not both",
                "`user` and `all_users` each choose whose jobs; together they contradict: a "
                "relation of two fields of the body",
            ),
            ("no user named", "whether a user name exists is stored state (as for GET /jobs's filter)"),
        )
    ),
    Accepted(
        "ST202",
        "GET /api/v1/jobs",
        "job ids given; at most",
        "`id` is repeatable and each value holds up to 1000 ids (its pattern says so); the limit is "
        "on all of them together (corral.services.jobs.MAX_IDS), a sum no JSON schema can state",
    ),
    *(
        Accepted(
            "ST105",
            operation,
            "Invalid HTTP request received.",
            "`id` values hold up to 1000 ids each (12,000 characters, repeatable): generated with "
            "non-ASCII text, percent-encoded, the request line passes the HTTP server's limit "
            "(h11's 16 KiB for an incomplete request), and uvicorn refuses it with its plain-text "
            "400 before the app sees it; no schema of the app's can describe that limit",
        )
        for operation in ("GET /api/v1/jobs", "GET /api/v1/jobs/metrics")
    ),
    # Catalogues (corral.catalog, docs/catalogues.md).
    Accepted(
        "ST202",
        "POST /api/v1/templates",
        "template spec: ",
        "a template's spec is YAML text or an object with `${...}` references; whether it renders to a "
        "valid job spec is found by rendering it, which no JSON schema can describe",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/templates",
        "'spec' holds a NUL character",
        "a template's spec may be a free-form object; the schema's no-NUL pattern covers strings it "
        "names, not the keys and values nested anywhere in such an object (that would need a "
        "recursive schema); the 422 names the field (seen: a NUL in a key of the spec)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/templates",
        "cannot be a template (each job made from it would be refused)",
        "`from_job` names a stored job; whether it can be a template depends on that job (a "
        "workspace's job is started by `corral ws start`, not submitted): state, not shape",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/templates/{name}/use",
        "parameter '",
        "a value's type, range and choices are those of the stored template's parameters",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/templates/{name}/use",
        "is not a valid job spec",
        "whether the values render a valid job spec depends on the stored template",
    ),
    *(
        Accepted(
            "ST202",
            operation,
            "needs a group",
            "visibility 'group' needs a group: one given in the body or the one stored with the entry",
        )
        for operation in (
            "POST /api/v1/templates",
            "POST /api/v1/templates/{name}/share",
            "POST /api/v1/models/{name}/share",
        )
    ),
    # On-call (corral.api.routers.oncall): relations between fields of one body.
    Accepted(
        "ST202",
        "PUT /api/v1/oncall/schedules/{name}",
        "restrict_",
        "a layer's restrict_from and restrict_to come together and must differ: a relation of two fields",
    ),
    *(
        Accepted(
            "ST202",
            operation,
            answer,
            "a user or schedule the body names must exist (stored state): refused naming the field",
        )
        for operation in (
            "PUT /api/v1/oncall/schedules/{name}",
            "POST /api/v1/oncall/schedules/{name}/overrides",
            "PUT /api/v1/oncall/policies/{name}",
        )
        for answer in ("no user named", "no on-call schedule named")
    ),
    Accepted(
        "ST202",
        "POST /api/v1/oncall/schedules/{name}/overrides",
        "",
        "an override's end must be after its start and within a year of it: a relation of two fields",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/users/{name}/contacts",
        "",
        "a contact's address must be an email address for kind email and a URL for the others",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/usage",
        "must be before 'until'",
        "since < until relates two parameters; JSON Schema bounds each alone",
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/groups/{name}/quota",
        "must not be less than",
        "max >= guaranteed (GPUs, CPUs, memory) relates two fields, and a field left out keeps its stored "
        "value, which the schema cannot see",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/groups",
        "must not be less than",
        "max >= guaranteed relates two fields of the body",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/jobs",
        "can never run",
        "whether a job can ever fit depends on the cluster's nodes and the group's quota, not on the spec",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/jobs",
        "instances over all tasks",
        "the cap on instances is over the sum of all tasks' instances; the schema bounds each task",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/jobs",
        "no user named",
        "whether a user name exists is stored state (an admin's filter on an unknown name is refused "
        "naming it; others get no job, as for a name they may not see)",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/jobs/metrics",
        "no user named",
        "whether a user name exists is stored state (as for GET /jobs's filter)",
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/users/{name}/job-notify",
        "a default notify needs at least one event in 'on'",
        "the body's `notify` is the job spec's NotifyV1, whose empty `on` is a job's way to opt out "
        "of its owner's default; a default that hears nothing is said by clearing it (null): one "
        "model, two rules by where it is used",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/jobs",
        "no group named",
        "whether a group name exists is stored state (refused for an admin, as for a user name)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/tokens",
        "CORRAL_TOKEN_MAX_LIFETIME_DAYS",
        "the longest token lifetime is the server's setting; the schema gives the hard bound (10 years)",
    ),
    Accepted(
        "ST302",
        "POST /api/v1/groups/{name}/members",
        "no user named",
        "the 404 is for the user the body names, not for the group just created (which exists)",
    ),
    Accepted(
        "ST302",
        "PUT /api/v1/users/{name}/default-group",
        "no group named",
        "the 404 is for the group the body names, not for the user just created (which exists)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/ssh-keys",
        "the SSH public key is damaged",
        "whether a key's bytes are a whole key of the type it names is found by parsing them, which "
        "no JSON schema can describe (the pattern checks the type and that the rest is base64)",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/jobs/{job_id}/logs",
        "for this attempt",
        "which ranks and attempts a job has depends on the job, not on the request's shape",
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/users/{name}/password",
        "current password is wrong or missing",
        "whether the current password is needed (and right) depends on the stored account",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/jobs",
        "is more than 64 TiB",
        "a size's pattern cannot bound its magnitude (digits times a unit)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/jobs",
        "a duration must be at most",
        "a duration's pattern cannot bound its magnitude (a sum of numbers times units)",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/audit",
        "until must be later than since",
        "since < until relates two parameters; JSON Schema bounds each alone",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/chaos/gpus/{node}/{index}",
        "flap_down_s must be shorter than flap_period_s",
        "down < period relates two fields of the body",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/jobs",
        "is given by more than one secret",
        "two secrets may not set one environment variable: uniqueness of a field across a list's "
        "items, which JSON Schema cannot state",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/jobs",
        "of that name (see `corral secret ls`)",
        "a secret the spec names must have been set before (state; the 422 is the same whether it "
        "exists for someone else or not at all, so it cannot be a 404 that would tell them apart)",
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/datasets/uploads/{upload_id}/chunk",
        "bytes",
        "a file path's limits are the filesystem's, in bytes of UTF-8 (1024 a path, 255 a part); "
        "JSON Schema counts characters (the schema bounds the path at 1024 of them)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/datasets/uploads/{upload_id}/files",
        "bytes",
        "a file path's limits are the filesystem's, in bytes of UTF-8 (1024 a path, 255 a part); "
        "JSON Schema counts characters (the schema bounds the path at 1024 of them)",
    ),
    *(
        Accepted(
            "ST202",
            operation,
            "is not a time",
            "since/until take an age, unix seconds or an ISO time; a pattern for all three in the "
            "schema would replace this message, which says what to write, with a regex",
        )
        for operation in ("GET /api/v1/audit", "GET /api/v1/admin/sim-export", "GET /api/v1/usage")
    ),
    *(
        Accepted(
            "ST202",
            route,
            "is out of range",
            "unix seconds past 1e11 or below 0 ('1e999', '-5') have the shape of a number; as for 'is not "
            "a time', the forms `since`/`until` take are a grammar the refusal names, not a pattern",
        )
        for route in ("GET /api/v1/usage", "GET /api/v1/audit", "GET /api/v1/admin/sim-export")
    ),
    Accepted(
        "ST202",
        "GET /api/v1/audit",
        "is not one the audit log records",
        "`target` is KIND or KIND:ID with KIND one of the kinds the log records (services.audit."
        "TARGET_KINDS); as for 'is not a time', a pattern of them in the schema would replace this "
        "refusal, which lists the kinds, with a regex",
    ),
    Accepted(
        "ST202",
        "GET /api/v1/admin/sim-export",
        "is not in the past",
        "`since` must be before the server's clock at the request: a relation to the time, not a shape",
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/code/blobs/{sha}",
        "",
        "a blob's bytes must hash to the sha256 in its path, and a chunk must start where the stored "
        "part ends: relations between the body, the path and earlier requests",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/code/snapshots",
        "",
        "a manifest may name only blobs uploaded before (409 names them) and paths that are not both "
        "a file and a directory: state and relations between lines the schema cannot state",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/workspaces",
        "chooses the model of the workspace's GPUs, but it asks for none",
        "a relation between two fields (a gpu_model needs gpus > 0), which a JSON schema's per-field "
        "constraints cannot state",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/workspaces",
        "can never run",
        "whether a workspace's job can ever fit depends on the cluster's nodes and the group's quota",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/workspaces",
        "maximum",
        "the longest idle timeout is the group's policy (or the server's setting), stored state",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/workspaces",
        "is more than 64 TiB",
        "a size's pattern cannot bound its magnitude (digits times a unit)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/workspaces",
        "an idle timeout must be at least",
        "a duration's pattern cannot bound its magnitude (at least 1 s: '0.5s' has the shape)",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/workspaces",
        "a duration must be at most",
        "a duration's pattern cannot bound its magnitude (a sum of numbers times units)",
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/workspaces/policies/{group}",
        "",
        "default <= max relates two fields; a duration's pattern cannot bound its magnitude",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/environments",
        '"loc":["body","source"]',
        "a source is a requirements list or a pyproject.toml: a grammar (TOML, requirement lines "
        "without URLs or paths) that no JSON schema states; the refusal says what is wrong in it",
    ),
    *(
        Accepted(
            "ST202",
            operation,
            answer,
            "an environment the spec names must exist, be readable by the caller and have a ready "
            "version (stored state; its shape, NAME or NAME@VERSION, the schema states)",
        )
        for operation in ("POST /api/v1/jobs", "POST /api/v1/workspaces")
        for answer in (
            "does not exist (see",
            "has no ready version",
            "has no version",
            ", not ready",
            "not a catalogue environment",  # default@N: the server's own has no versions
        )
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/remediation/rules",
        "rules refused, the active version stays",
        "the rules are YAML in the remediation rules language (docs/operations.md): a grammar that "
        "no JSON schema states; the refusal names the line and what is wrong",
    ),
    Accepted(
        "ST202",
        "POST /api/v1/workspaces/{name}/start",
        "can never run",
        "whether a workspace's job can ever fit depends on the cluster's nodes and the group's quota",
    ),
    Accepted(
        "ST202",
        "PUT /api/v1/oncall/policies/{name}",
        "name exactly one of schedule or user",
        "a step names a schedule or a user, exactly one: a relation of two fields of each item",
    ),
    Accepted(
        "ST201",
        "POST /api/v1/workspaces",
        "",
        "like a job spec, sizes and durations are read in more forms than the schema's patterns name",
    ),
    Accepted(
        "ST201",
        "POST /api/v1/jobs",
        "",
        "the spec parser is lenient on purpose, as with YAML written by hand: it strips blanks around "
        "strings, lower-cases the priority and reads sizes and durations in more forms ('2000000b', "
        "'1h 30m') than the schema's patterns name; what it accepts it stores normalized",
    ),
)

_responses: Counter[str] = Counter()
# The stateful phase's answers apart: whether its scenarios got the created resources (a link's
# source status) that the links it is meant to follow start from.
_stateful_responses: Counter[str] = Counter()
_unreadable: Counter[str] = Counter()
_accepted: Counter[str] = Counter()


def _protected() -> set[int]:
    raw = os.environ.get("FUZZ_PROTECTED_TOKEN_IDS", "")
    return {int(v) for v in raw.split(",") if v.strip()}


def _as_id(value: Any) -> int | None:
    """The id the server would read from a path parameter ("02", " 2", 2 ...), or None."""
    try:
        return int(str(value).strip())
    except ValueError:
        return None


_example_uses: Counter[str] = Counter()


def _fresh_example_name(case: Any) -> None:
    body = case.body
    name = body.get("name") if isinstance(body, dict) else None
    if case.method.upper() == "POST" and isinstance(name, str) and name.startswith(EXAMPLE_PREFIX):
        _example_uses[name] += 1  # a copy: the example itself is the schema's, drawn again later
        case.body = {**body, "name": f"{name}-{os.getpid()}-{_example_uses[name]}"}


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.method.upper() == "DELETE" and case.path == TOKENS_PATH:
        params = case.path_parameters or {}
        if _as_id(params.get("token_id")) in _protected():
            params["token_id"] = NO_SUCH_TOKEN
    if case.method.upper() == "DELETE" and case.path == POLICY_PATH:
        params = case.path_parameters or {}
        if str(params.get("name", "")).strip() == EXAMPLE_POLICY:
            params["name"] = NO_SUCH_POLICY
    _fresh_example_name(case)


def _readable_error(response: Any) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    detail = body.get("detail") if isinstance(body, dict) else None
    return (isinstance(detail, str) and bool(detail.strip())) or (isinstance(detail, list) and bool(detail))


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    # The schema's operation; probes with a method it does not declare count apart.
    label = f"{case.method.upper()} {case.path}"
    if case.method.upper() != case.operation.method.upper():
        label = "undeclared methods"
    _responses[f"{label} {response.status_code}"] += 1
    meta = getattr(case, "meta", None)
    if meta is not None and str(meta.phase.name) == "stateful":
        _stateful_responses[f"{label} {response.status_code}"] += 1
    if (
        400 <= response.status_code < 500
        and not _readable_error(response)
        and not _plain_accepted(label, response)
    ):
        _unreadable[f"{label} {response.status_code}"] += 1


def _plain_accepted(label: str, response: Any) -> bool:
    """A plain-text 4xx that an accepted case names by its answer (uvicorn's own 400 for an
    over-long request line, given before the app can answer in JSON): known, and said why above."""
    if response.status_code != 400:  # only the HTTP server's own refusal of a request line
        return False
    text = response.text or ""
    return any(
        a.answer
        and a.answer in text
        and a.operation in (label, ANY_OPERATION)
        and not text.lstrip().startswith("{")
        for a in ACCEPTED
    )


def _query_array_sent_valid(failure: Any, case: Any, response: Any) -> bool:
    """An ST201 whose every mutation is of a repeatable (array) query parameter and whose request,
    as sent, is a valid one: a scalar generated as an array parameter's invalid value (`false`,
    `0`, a string) goes on the wire as `name=false`, the very bytes of the valid one-item array
    ["false"], which the server rightly accepts (schemathesis 4.32 allows for the other way round:
    an array sent for a scalar). Judged on the query actually sent, against the parameter's own
    schema, so an invalid value the server accepts is still a failure."""
    meta = getattr(case, "meta", None)
    mutations = getattr(getattr(getattr(meta, "phase", None), "data", None), "mutations", None)
    request = getattr(response, "request", None)
    if failure.code != "ST201" or not mutations or request is None:
        return False
    sent = parse_qs(urlsplit(str(request.url)).query, keep_blank_values=True)
    for mutation in mutations:
        location = getattr(mutation.parameter_location, "name", "")
        param = case.operation.query.get(mutation.parameter) if mutation.parameter else None
        if location != "QUERY" or param is None or param.name not in sent:
            return False
        schema = param.validation_schema
        branches = [schema, *schema.get("anyOf", [])] if isinstance(schema, dict) else []
        if not any(isinstance(b, dict) and b.get("type") == "array" for b in branches):
            return False
        if not param.get_validator().is_valid(sent[param.name]):
            return False
    return True


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """False drops the failure: only the accepted exceptions above."""
    label = f"{case.method.upper()} {case.path}"
    text = response.text if response is not None else ""
    if _query_array_sent_valid(failure, case, response):
        _accepted[f"ST201 {label}: an array query parameter sent as a valid array"] += 1
        return False
    for accepted in ACCEPTED:
        operation = accepted.operation in (label, ANY_OPERATION)
        said = accepted.message in str(getattr(failure, "message", ""))
        if failure.code == accepted.code and operation and accepted.answer in text and said:
            _accepted[f"{accepted.code} {label}: {accepted.answer}"] += 1
            return False
    # Schemathesis's summary of a stateful failure names no request: say which one it was (on
    # stderr, which tests/fuzz_run.py keeps with the run's output).
    body = repr(getattr(case, "body", None))[:400]
    print(
        f"FUZZ FAILURE {failure.code} {label} -> {getattr(response, 'status_code', None)}: "
        f"{text[:400]!r}; query {getattr(case, 'query', None)!r:.300}; body {body}",
        file=sys.stderr,
    )
    return True


@atexit.register
def _write_stats() -> None:
    path = os.environ.get("FUZZ_STATS_FILE")
    if path:
        stats = {
            "responses": _responses,
            "stateful_responses": _stateful_responses,
            "unreadable_4xx": _unreadable,
            "accepted": _accepted,
        }
        with open(path, "w") as out:
            json.dump(stats, out)
