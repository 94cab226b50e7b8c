"""The remediation rules file: what Corral does by itself when an alert or event matches.

Versioned in the database (`remediation_rule_versions`, the highest version is active); applied
by admins (`corral rules apply FILE`, PUT /api/v1/remediation/rules). A file that does not parse,
or names an unknown action, is refused with its line and reason and the active version stays.
With no version applied the shipped DEFAULT_RULES are active. See docs/operations.md.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from corral.services.errors import Invalid
from corral.services.incident_flapping import DEFAULT_FLAP, FlapPolicy
from corral.yaml_lines import check_unique_names, error_loc, line_of, safe_load

ACTIONS = (
    "incident",  # open or join an incident: {severity, title, key}
    "cordon",  # no new jobs on the node
    "drain",  # cordon, and preempt its running jobs (each gets its stop grace)
    "quarantine_gpu",  # the one GPU out of placement (lost, when it fell off the bus)
    "requeue_jobs",  # stop the jobs on the GPU (or node) and retry them elsewhere
    "stop_job",  # cancel the job the alert names (e.g. an idle one)
    "notify_owner",  # a line on the job's events for its owner
)
REMOVING = frozenset({"cordon", "drain", "quarantine_gpu"})  # count against the blast-radius guard
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
SEVERITIES = ("SEV1", "SEV2", "SEV3", "SEV4")


class RulesError(ValueError):
    """A refused rules file: `line` (1-based) and the reason."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


def duration_s(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration (e.g. 90, 30s, 10m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


Duration = Annotated[float, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    """What a rule matches: every given part must hold. `name`: alert or event names; `labels`:
    exact label values; `severity`: the alert's `severity` label; `source`: alertmanager |
    corral | event."""

    name: tuple[str, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    severity: tuple[str, ...] = ()
    source: tuple[Literal["alertmanager", "corral", "event"], ...] = ()

    @field_validator("name", "severity", "source", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class RateLimit(_Strict):
    max: int = Field(ge=1)
    per: Duration = 3600.0

    @field_validator("per", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return duration_s(value)


class Action(_Strict):
    kind: str
    severity: str = ""  # incident: SEVn ('' = from the severity map)
    title: str = ""  # incident: a template over the labels, e.g. "GPU {gpu} on {node}"
    key: str = ""  # incident: the grouping key template ('' = the alert's fingerprint)
    message: str = ""  # notify_owner

    @field_validator("severity")
    @classmethod
    def _severity(cls, value: str) -> str:
        # Checked here, not when an alert fires: open_or_update would refuse it then, inside the
        # transaction that records the alert, and every alert the rule matches would fail.
        if value and value.upper() not in SEVERITIES:
            raise ValueError(f"unknown severity {value!r}; known: {', '.join(SEVERITIES)}")
        return value.upper()


class Rule(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    match: Match
    actions: tuple[Action, ...] = Field(min_length=1)
    dry_run: bool = False
    rate_limit: RateLimit | None = None
    description: str = ""

    @field_validator("actions", mode="before")
    @classmethod
    def _actions(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise ValueError("actions must be a list")
        return [_action(item) for item in value]


def _action(item: Any) -> dict[str, Any]:
    params: Any
    if isinstance(item, str):
        kind, params = item, {}
    elif isinstance(item, dict) and len(item) == 1:
        ((kind, params),) = item.items()
        params = params or {}
        if not isinstance(params, dict):
            raise ValueError(f"the parameters of action {kind!r} must be a mapping")
    else:
        raise ValueError("an action is a name (cordon) or one name with parameters ({incident: {...}})")
    if kind not in ACTIONS:
        raise ValueError(f"unknown action {kind!r}; known: {', '.join(ACTIONS)}")
    return {"kind": kind, **params}


class SeverityMap(_Strict):
    """Alerts without a severity from their rule: first entry whose labels all match wins."""

    labels: dict[str, str]
    sev: Literal["SEV1", "SEV2", "SEV3", "SEV4"]


class Guard(_Strict):
    """The blast-radius guard: automatic removals within `window` stop at `max_fraction` of the
    cluster: cordons and drains of its nodes, never below `min_removals` nodes; quarantines of
    its GPUs, never below `min_gpu_removals` GPUs. The GPU floor is 2 so that a small cluster
    (the one-node demo's 4 GPUs, where 10 % is none) quarantines a second faulty GPU by itself;
    a third within the window is held for a human; from 20 GPUs up the default 10 % is the
    limit, as before."""

    max_fraction: float = Field(0.10, gt=0, le=1)
    window: Duration = 3600.0
    min_removals: int = Field(1, ge=0)
    min_gpu_removals: int = Field(2, ge=0)

    @field_validator("window", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return duration_s(value)

    @field_validator("min_removals", "min_gpu_removals", mode="before")
    @classmethod
    def _count(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic took True for 1 and 2.0 for 2, and said of "two" only that it was no integer
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not whole or value < 0:
            unit = "GPUs" if info.field_name == "min_gpu_removals" else "nodes"
            raise ValueError(
                f"{value!r} is not a number of {unit}: give a whole number, 0 or more "
                f"(0: no automatic removal beyond max_fraction of the cluster's {unit})"
            )
        return value

    def limit(self, total: int, floor: int) -> int:
        """How many of the cluster's `total` nodes (or GPUs) rules may remove within the window."""
        return max(floor, int(self.max_fraction * total))


class Flapping(_Strict):
    """An incident reopened `reopens` times within `within` is flapping: it pages once, and its
    further reopens page nobody until it stays resolved, or open, for `quiet`."""

    reopens: int = Field(DEFAULT_FLAP.reopens, ge=1)
    within: Duration = DEFAULT_FLAP.within_s
    quiet: Duration = DEFAULT_FLAP.quiet_s

    @field_validator("within", "quiet", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return duration_s(value)


class IncidentRules(_Strict):
    """How incidents reopen and when that is flapping (corral.services.incident_flapping.FlapPolicy)."""

    reopen_window: Duration = DEFAULT_FLAP.reopen_window_s  # fires again within it: reopens
    flapping: Flapping = Flapping()

    @field_validator("reopen_window", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return duration_s(value)

    def flap_policy(self) -> FlapPolicy:
        return FlapPolicy(
            reopen_window_s=self.reopen_window, reopens=self.flapping.reopens,
            within_s=self.flapping.within, quiet_s=self.flapping.quiet,
        )  # fmt: skip


class RuleSet(_Strict):
    version: Literal[1] = 1  # the file format
    dry_run: bool = False  # every rule only records what it would do
    guard: Guard = Guard()
    incidents: IncidentRules = IncidentRules()
    severity_map: tuple[SeverityMap, ...] = ()
    rules: tuple[Rule, ...] = ()

    @field_validator("rules")
    @classmethod
    def _unique(cls, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
        check_unique_names([rule.name for rule in rules], "rules")
        return rules

    def severity_for(self, labels: dict[str, str]) -> str:
        for entry in self.severity_map:
            if all(labels.get(k) == v for k, v in entry.labels.items()):
                return entry.sev
        return "SEV3"


def parse_rules(text: str) -> RuleSet:
    """Parse and validate a rules file; RulesError names the line and the reason."""
    try:
        root = yaml.compose(text)
        data = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise RulesError(mark.line + 1 if mark else 1, f"not valid YAML: {getattr(exc, 'problem', exc)}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RulesError(1, "the rules file must be a mapping (version:, rules:, ...)")
    try:
        return RuleSet.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = error_loc(err)
        where = ".".join(str(p) for p in loc) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        raise RulesError(line_of(root, loc), f"{where}: {message}") from None


def parse_or_invalid(text: str) -> RuleSet:
    try:
        return parse_rules(text)
    except RulesError as exc:
        raise Invalid(f"rules refused, the active version stays: {exc}", ("body", "text")) from None


DEFAULT_RULES = """\
# Corral's shipped remediation rules (docs/operations.md#remediation-rules).
version: 1
dry_run: false
guard: {max_fraction: 0.10, window: 1h, min_removals: 1, min_gpu_removals: 2}
incidents:
  reopen_window: 15m     # a fault firing again within this long after resolving reopens its incident
  flapping: {reopens: 3, within: 1h, quiet: 30m}  # page once, then not until quiet for 30m
severity_map:            # alerts whose rule gives no severity
  - {labels: {severity: critical}, sev: SEV2}
  - {labels: {severity: warning}, sev: SEV3}
  - {labels: {severity: info}, sev: SEV4}
rules:
  - name: gpu-fault
    description: uncorrectable ECC error, Xid or a GPU off the bus
    match:
      name: [GpuFault, CorralGpuEccErrors, CorralGpuLost]  # Xids: via GpuFault (no application Xids)
    actions:
      - quarantine_gpu
      - requeue_jobs
      - incident: {severity: SEV2, key: "gpu/{node}/{gpu}", title: "{summary}"}  # it names the GPU
  - name: node-lost
    match: {name: CorralNodeLost}
    actions:
      - requeue_jobs
      - incident: {severity: SEV2, key: "node/{node}", title: "node {node} lost: {summary}"}
  - name: node-failing-jobs
    match: {name: CorralNodeFailingJobs}
    actions:
      - incident: {severity: SEV3, key: "node-failing/{node}", title: "{summary}"}
  - name: gpu-overheating
    match: {name: CorralGpuOverheating}
    actions:
      - incident: {severity: SEV3, key: "gpu-hot/{node}/{gpu}", title: "GPU {gpu} on {node} overheating"}
  - name: alertmanager
    description: every Alertmanager alert is an incident, by its severity label
    match: {source: alertmanager}
    actions: [incident]
"""
