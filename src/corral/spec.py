"""Job spec v1: the typed model of what a user submits (YAML or JSON), with its limits.

    name: cifar-resnet
    group: vision              # default: the submitter's default group
    priority: normal           # low | normal | high
    environment: default
    retries: 2                 # whole-job retries on failure (never after a cancel)
    max_runtime: 6h
    preemptible: true
    tasks:
      trainer:
        instances: 2           # gang-scheduled
        resources: {gpus: 4, gpu_model: A100, cpus: 16, memory: 64GiB}
        command: torchrun ... train.py
    env: {EPOCHS: "10"}
    mounts: [{source: data/cifar10}, {source: group/vision/shared, target: /mnt/shared, mode: rw}]
    secrets: [{name: wandb, env: WANDB_API_KEY}, {name: ssh_key, file: id_rsa}]
    labels: {experiment: lr-sweep, trial: "7"}   # find, wait for and cancel jobs by label
    notify: {on: [failed, succeeded], to: [email]}   # the owner's own contacts only

A single-task job may put `command` and `resources` (and `instances`) at the top level instead of
`tasks`; it becomes one task named `main`. Memory is given as "64GiB", "512MiB", "2G" or an integer
number of MiB, and is stored as MiB. `max_runtime` is "90s", "30m", "6h", "1d", "1h30m" or seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonValue

from corral.engine.isolation.root_env import SHELL_OWNED_ENV, SHELL_READONLY_ENV
from corral.scheduler.types import Priority, Resources, TaskSpec
from corral.yaml_lines import safe_load

MAX_NAME_LEN = 128
MAX_COMMAND_LEN = 16_384
MAX_INSTANCES = 64  # per job, over all tasks
MAX_TASKS = 16
MAX_GPUS_PER_INSTANCE = 64
MAX_CPUS_PER_INSTANCE = 1024  # a task's or a workspace's cores
MAX_ENV_BYTES = 64 * 1024
MAX_ENV_VARS = 256
MAX_RETRIES = 20
MAX_SPEC_BYTES = 256 * 1024
MAX_DURATION_S = 3650 * 86400.0  # ten years; a longer one was stored as "1e+23s", then unreadable
MAX_LABELS = 16
MAX_LABEL_KEY_LEN = 63
MAX_LABEL_VALUE_LEN = 128

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GPU_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SECRET_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# A plain file name under /run/secrets: no '/', not '.', '..' or a hidden file.
SECRET_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
MAX_SECRETS = 32
# Labels (`labels: {experiment: e1, trial: "7"}`): what a job is found by (`corral ls -l k=v`), so
# keys and values are plain words that need no quoting in a URL query, a shell or `k=v` (no '=',
# no ',', no blanks).
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9._/:@+-]{1,128}$")
# A label selector as the API's schemas say it: NAME=VALUE, or NAME (the label with any value)
LABEL_SELECTOR = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}(=[A-Za-z0-9._/:@+-]{1,128})?$"
# Variables Corral sets itself: a secret may not silently replace them.
RESERVED_ENV = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "CUDA_VISIBLE_DEVICES", "PATH", "HOME", "USER"}
)
# Variables bash keeps as its own (SHELL_READONLY_ENV, SHELL_OWNED_ENV: defined where the job's
# variables are put back, engine/isolation/root_env.py, which says why): a new spec may not name
# them; a spec already stored is read as it was (STORED_SPEC), and its job runs without them,
# saying so in its log.
# Validation context of a spec read back from the database (db/jsontypes.py): a job or template
# stored before a rule was added stays readable (dispatch, `corral show`, retries).
STORED_SPEC = {"stored": True}


def _is_stored(info: ValidationInfo) -> bool:
    return isinstance(info.context, dict) and info.context.get("stored") is True


def shell_owned_env_error(name: str) -> str | None:
    """Why `name` may not be a job variable's name, or None when it may."""
    if name not in SHELL_OWNED_ENV:
        return None
    if name in SHELL_READONLY_ENV:
        why = "bash keeps it read-only and would stop before the job's command"
    else:
        why = "bash sets it itself, so the job would not get your value"
    return f"{name!r} is a shell's own variable: {why}; use another name"


_MEMORY_UNITS_MIB = {
    "": 1.0 / (1024 * 1024),  # bare number with no unit inside a string: bytes
    "b": 1.0 / (1024 * 1024),
    "k": 1.0 / 1024, "ki": 1.0 / 1024, "kb": 1.0 / 1024, "kib": 1.0 / 1024,
    "m": 1.0, "mi": 1.0, "mb": 1.0, "mib": 1.0,
    "g": 1024.0, "gi": 1024.0, "gb": 1024.0, "gib": 1024.0,
    "t": 1024.0**2, "ti": 1024.0**2, "tb": 1024.0**2, "tib": 1024.0**2,
}  # fmt: skip
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])", re.IGNORECASE)
_DURATION_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_memory_mib(value: Any) -> int:
    """ "64GiB" -> 65536; "512MiB" -> 512; 2048 (an int) -> 2048 MiB."""
    if isinstance(value, bool):
        raise ValueError("memory must be a size such as '512MiB' or '64GiB'")
    if isinstance(value, int | float):
        mib = float(value)
    elif isinstance(value, str):
        match = _MEMORY_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _MEMORY_UNITS_MIB:
            raise ValueError(f"memory {value!r} is not a size such as '512MiB' or '64GiB'")
        mib = float(match.group(1)) * _MEMORY_UNITS_MIB[unit]
    else:
        raise ValueError("memory must be a size such as '512MiB' or '64GiB'")
    if mib < 1:
        raise ValueError(f"memory {value!r} is less than 1 MiB")
    if mib > 64 * 1024 * 1024:
        raise ValueError(f"memory {value!r} is more than 64 TiB")
    return int(mib)


def parse_duration_s(value: Any) -> float:
    """ "6h" -> 21600; "1h30m" -> 5400; 90 -> 90 seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration must look like '90s', '30m' or '6h'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        parts = _DURATION_RE.findall(text)
        if not parts or "".join(n + u for n, u in parts).lower() != text.lower():
            raise ValueError(f"{value!r} is not a duration such as '90s', '30m', '6h' or '1d'")
        seconds = sum(float(n) * _DURATION_S[u.lower()] for n, u in parts)
    else:
        raise ValueError("a duration must look like '90s', '30m' or '6h'")
    if seconds <= 0:
        raise ValueError("a duration must be more than zero")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be at most {MAX_DURATION_S / 86400:.0f} days")
    return seconds


def format_seconds(seconds: float) -> str:
    """A duration's stored form: plain decimal seconds ("1000000s", "5400.5s"), never an exponent
    (`{:g}` wrote 1,000,000 s as "1e+06s", which the parser then refused: a job whose spec could
    not be read back)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"


def duration_text(seconds: float) -> str:
    """A duration exactly, as people write one and parse_duration_s reads it back: 18000 -> "5h",
    5400 -> "1h30m", 90061 -> "1d1h1m1s"; a fraction stays on the seconds."""
    whole, fraction = divmod(seconds, 1)
    left, parts = int(whole), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    if left or fraction or not parts:
        parts.append(format_seconds(left + fraction))
    return "".join(parts)


def _check_gpu_model(value: str | None) -> str | None:
    if value is None:
        return None
    models = [m.strip() for m in value.split("|")]
    if not models or any(not GPU_MODEL_RE.match(m) for m in models):
        raise ValueError(f"gpu_model {value!r} must be a model name or alternatives like 'A100|H100'")
    return "|".join(models)


MemoryMiB = Annotated[int, BeforeValidator(parse_memory_mib)]


class _Strict(BaseModel):
    # Frozen: a stored spec is parsed once per distinct text and the instance is shared by every
    # row that holds it (corral.db.jsontypes), so nobody may change it in place.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)


class ResourcesV1(_Strict):
    gpus: int = Field(0, ge=0, le=MAX_GPUS_PER_INSTANCE)
    gpu_model: str | None = Field(None, max_length=256)
    cpus: float = Field(1.0, gt=0, le=MAX_CPUS_PER_INSTANCE)
    memory: MemoryMiB = Field(1024, description="MiB; accepts '512MiB', '64GiB' on input")

    @field_validator("gpu_model")
    @classmethod
    def _gpu_model(cls, value: str | None) -> str | None:
        return _check_gpu_model(value)

    def to_scheduler(self) -> Resources:
        return Resources(gpus=self.gpus, gpu_model=self.gpu_model, cpus=self.cpus, memory_mib=self.memory)


class TaskV1(_Strict):
    instances: int = Field(1, ge=1, le=MAX_INSTANCES)
    resources: ResourcesV1 = Field(default_factory=ResourcesV1)
    command: str = Field(min_length=1, max_length=MAX_COMMAND_LEN)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return check_env(value, stored=_is_stored(info))


class MountV1(_Strict):
    """`{source: group/vision/sub, target: /mnt/x, mode: ro}`: one mount served by corral.storage
    (sources: home, group/<g>[/sub], data/<name>[@v], ...). The old forms are read as the new:
    `{dataset: X}` is `{source: data/X}`, `{group_storage: G}` is `{source: group/G}`, and
    `read_only: false` is `mode: rw` (docs/storage.md)."""

    source: str = Field(min_length=1, max_length=256)
    target: str | None = Field(None, max_length=256)
    mode: Literal["ro", "rw"] = "ro"

    @model_validator(mode="before")
    @classmethod
    def _legacy_forms(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "source" in data:
            return data
        legacy = {k: data[k] for k in ("dataset", "group_storage") if k in data}
        if len(legacy) != 1:
            raise ValueError(
                "a mount is {source: ..., target: ..., mode: ro|rw}, e.g. {source: group/vision}"
            )
        rest = {k: v for k, v in data.items() if k not in ("dataset", "group_storage", "read_only")}
        ((kind, name),) = legacy.items()
        if not isinstance(name, str):
            raise ValueError(f"'{kind}' names a {'dataset' if kind == 'dataset' else 'group'} as text")
        prefix = "data" if kind == "dataset" else "group"
        mode = "ro" if data.get("read_only", True) else "rw"
        return {"source": f"{prefix}/{name}", "mode": mode, **rest}


class SecretUseV1(_Strict):
    """One secret the job uses (corral.services.secrets), by name: given to every instance as the
    environment variable `env`, as the file /run/secrets/<file> (read-only, mode 0400, owned by
    the job's uid), or both. `scope`: whose secret; unset, the submitter's own when they have one
    of that name, else the job's group's. The value never appears in the spec."""

    # What _check below accepts, said in the schema (where _check says what is wrong in words):
    # `env` or `file` given, env a variable name Corral does not set itself.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["env"], "properties": {"env": {"type": "string"}}},
                {"required": ["file"], "properties": {"file": {"type": "string"}}},
            ]
        }
    )

    name: str = Field(max_length=64, pattern=SECRET_NAME_RE)
    env: str | None = Field(
        None,
        max_length=128,
        json_schema_extra={
            "pattern": ENV_NAME_RE.pattern,
            "not": {
                "type": "string",
                "anyOf": [
                    {"pattern": "^CORRAL_"},
                    {"enum": list[JsonValue](sorted(RESERVED_ENV | SHELL_OWNED_ENV))},
                ],
            },
        },
    )
    file: str | None = Field(None, max_length=128, json_schema_extra={"pattern": SECRET_FILE_RE.pattern})
    scope: Literal["user", "group"] | None = None

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> SecretUseV1:
        if self.env is None and self.file is None:
            raise ValueError(f"secret {self.name!r}: say how the job gets it: 'env', 'file' or both")
        if self.env is not None:
            if not ENV_NAME_RE.fullmatch(self.env):
                raise ValueError(
                    f"secret {self.name!r}: env {self.env!r} must be letters, digits and '_' "
                    "and not start with a digit"
                )
            if self.env.startswith("CORRAL_") or self.env in RESERVED_ENV:
                raise ValueError(f"secret {self.name!r}: env {self.env!r} is set by Corral itself")
            shell_owned = None if _is_stored(info) else shell_owned_env_error(self.env)
            if shell_owned:
                raise ValueError(f"secret {self.name!r}: env {shell_owned}")
        if self.file is not None and not SECRET_FILE_RE.match(self.file):
            raise ValueError(
                f"secret {self.name!r}: file {self.file!r} must be a plain file name (letters, digits, "
                "'.', '_', '-'; no '/', not starting with '.')"
            )
        return self


def check_labels(value: Any) -> dict[str, str]:
    """A spec's `labels`, each value as text: a whole number or a decimal is taken as its text
    (`trial: 7` is "7", as a tool that numbers its trials sends it); anything else but text, a bad
    key or value, or more than MAX_LABELS labels is refused naming the label and the rule."""
    if not isinstance(value, dict):
        raise ValueError("labels are a mapping of names to values, e.g. {experiment: e1, trial: '7'}")
    if len(value) > MAX_LABELS:
        raise ValueError(f"the job has {len(value)} labels; at most {MAX_LABELS} are allowed")
    labels: dict[str, str] = {}
    for key, raw in value.items():
        if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
            raise ValueError(
                f"label name {key!r} must be 1-{MAX_LABEL_KEY_LEN} letters, digits, '.', '_', '-' "
                "or '/', starting with a letter or digit"
            )
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise ValueError(
                f'label {key!r}: its value {raw!r} must be text or a number (quote it: {key}: "...")'
            )
        text = raw if isinstance(raw, str) else str(raw)
        if not LABEL_VALUE_RE.match(text):
            raise ValueError(
                f"label {key!r}: value {text!r} must be 1-{MAX_LABEL_VALUE_LEN} letters, digits or "
                "'.', '_', '-', '/', ':', '@', '+' (no blanks, '=' or ',')"
            )
        labels[key] = text
    return labels


def parse_label_selector(text: str) -> tuple[str, str | None]:
    """ "experiment=e1" -> ("experiment", "e1"); "experiment" -> ("experiment", None): any job
    with that label. A bad name or value raises ValueError naming it."""
    key, sep, value = text.strip().partition("=")
    key = key.strip()
    if not LABEL_KEY_RE.match(key):
        raise ValueError(
            f"label selector {text!r}: give NAME=VALUE or NAME, the name 1-{MAX_LABEL_KEY_LEN} "
            "letters, digits, '.', '_', '-' or '/'"
        )
    if not sep:
        return key, None
    value = value.strip()
    if not LABEL_VALUE_RE.match(value):
        raise ValueError(
            f"label selector {text!r}: the value must be 1-{MAX_LABEL_VALUE_LEN} letters, digits or "
            "'.', '_', '-', '/', ':', '@', '+'"
        )
    return key, value


def check_env(value: dict[str, str], *, stored: bool = False) -> dict[str, str]:
    """A spec's `env`; a stored one (`stored`) may still name a shell's own variable."""
    if len(value) > MAX_ENV_VARS:
        raise ValueError(f"env has {len(value)} variables; at most {MAX_ENV_VARS} are allowed")
    for key in value:
        if not ENV_NAME_RE.fullmatch(key):
            raise ValueError(f"env name {key!r} must be letters, digits and '_' and not start with a digit")
        shell_owned = None if stored else shell_owned_env_error(key)
        if shell_owned:
            raise ValueError(f"env name {shell_owned}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
    if size > MAX_ENV_BYTES:
        raise ValueError(f"env is {size} bytes; at most {MAX_ENV_BYTES} bytes are allowed")
    return value


class IdleGpuV1(_Strict):
    """The job's own idle-GPU policy: warn the owner when its GPUs stay below `below_percent`
    utilization for `for`, then after `grace` stop or requeue it (see corral.monitor.idle)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True, frozen=True)

    below_percent: float = Field(ge=0, le=100)
    for_: str = Field(alias="for")
    grace: str | None = None
    action: Literal["warn", "stop", "requeue"] | None = None

    @field_validator("for_", "grace")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration_s(value)  # raises with a plain sentence on a bad duration
        return value


# Job notifications (corral.services.job_notify): the events a job may tell its owner of, and
# the other words read (case-insensitively): groups, and Slurm's --mail-type words (BEGIN, END,
# FAIL, REQUEUE, ALL), so a Slurm user's habit works as it reads.
NOTIFY_EVENTS = ("started", "succeeded", "failed", "cancelled", "requeued")
NOTIFY_GROUPS = {
    "end": ("succeeded", "failed", "cancelled"),
    "all": NOTIFY_EVENTS,
    "begin": ("started",),
    "fail": ("failed",),
    "requeue": ("requeued",),
}
NOTIFY_KINDS = ("email", "webhook", "slack")  # the kinds of the owner's contacts (`corral contact`)


def _any_case_words(*groups: Iterable[str]) -> str:
    """A JSON Schema pattern for one of the words, in any case, blanks around it allowed."""
    words = [w for group in groups for w in group]
    spelled = (
        "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in w) for w in words
    )
    return r"^\s*(" + "|".join(spelled) + r")\s*$"


class NotifyV1(_Strict):
    """Tell the job's owner when it starts, ends or is requeued, at their own contacts only
    (`to`: which kinds of them; empty: all). No addresses here: a spec cannot mail or POST to
    anywhere its owner has not registered (corral.services.job_notify, docs/operations.md).
    `on: []` (or `notify: false` in a job spec): tell nothing, not even the owner's default."""

    on: tuple[str, ...] = Field(
        ("end",),
        max_length=len(NOTIFY_EVENTS) + len(NOTIFY_GROUPS),
        # in the schema only: the words, any case (a client's generator then sends words the
        # validator takes); the validator below refuses others naming them
        json_schema_extra={
            "items": {"type": "string", "pattern": _any_case_words(NOTIFY_EVENTS, NOTIFY_GROUPS)}
        },
    )
    to: tuple[Literal["email", "webhook", "slack"], ...] = Field((), max_length=len(NOTIFY_KINDS))

    @field_validator("on", mode="before")
    @classmethod
    def _words(cls, value: Any) -> Any:
        """A single word is a list of one; words are read in lower case ("FAIL" is "fail")."""
        words = [value] if isinstance(value, str) else value
        if not isinstance(words, list | tuple):
            return value
        return tuple(w.strip().lower() if isinstance(w, str) else w for w in words)

    @field_validator("on")
    @classmethod
    def _events(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Every event named, group words expanded, in one fixed order (the stored form)."""
        wanted: set[str] = set()
        for word in value:
            if word in NOTIFY_GROUPS:
                wanted.update(NOTIFY_GROUPS[word])
            elif word in NOTIFY_EVENTS:
                wanted.add(word)
            else:
                known = ", ".join([*NOTIFY_EVENTS, *NOTIFY_GROUPS])
                raise ValueError(f"{word!r} is not a notification event; use some of {known}")
        return tuple(e for e in NOTIFY_EVENTS if e in wanted)

    @field_validator("to")
    @classmethod
    def _kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(k for k in NOTIFY_KINDS if k in value)


DEFAULT_STOP_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class TaskView:
    role: str
    instances: int
    resources: Resources
    command: str
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpecView:
    """What the control loops read of a stored spec: the tasks in rank order with their
    resources, command and env, the job's env, runtime limit, environment and stop grace."""

    tasks: tuple[TaskView, ...]
    env: Mapping[str, str]
    max_runtime_s: float | None
    environment: str
    stop_grace_s: float

    @property
    def num_instances(self) -> int:
        return sum(t.instances for t in self.tasks)


class JobSpecV1(_Strict):
    version: Literal[1] = 1
    name: str = Field(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_RE)
    group: str | None = Field(None, max_length=64)
    priority: Literal["low", "normal", "high"] = "normal"
    environment: str = Field("default", min_length=1, max_length=256)
    retries: int = Field(0, ge=0, le=MAX_RETRIES)
    max_runtime: str | None = None
    preemptible: bool = True
    stop_grace: str | None = None  # SIGTERM -> SIGKILL grace on cancel/preemption, e.g. "30s"
    tasks: dict[str, TaskV1] = Field(min_length=1, max_length=MAX_TASKS)
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[MountV1] = Field(default_factory=list, max_length=32)
    code: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # a `--code` snapshot (corral.storage.code)
    idle_gpu: IdleGpuV1 | None = None
    # What to do when the job is suspected hung (corral.diagnosis.watch); None: the group's or
    # the server's policy (CORRAL_DIAG_GROUP_ON_HANG, CORRAL_DIAG_ON_HANG).
    on_hang: Literal["notify", "kill", "requeue"] | None = None
    secrets: list[SecretUseV1] = Field(default_factory=list, max_length=MAX_SECRETS)
    # None: a batch job. "workspace": the job of an interactive workspace (corral.services.workspaces
    # builds it; POST /jobs refuses it). Unset in every stored spec but those, so nothing changes.
    kind: Literal["workspace"] | None = None
    # What the job is found by (GET /jobs?label=k=v, `corral ls -l`, cancel and wait by label):
    # stored here and, for the filters, in the job_labels table (services/jobs.py).
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> dict[str, str]:
        return check_labels({} if value is None else value)

    # Tell the owner when the job starts, ends or is requeued (NotifyV1); None: as the owner's
    # default says (filled in at submit); `on: []`, which `notify: false` means: never.
    notify: NotifyV1 | None = None

    @field_validator("notify", mode="before")
    @classmethod
    def _no_notify(cls, value: Any) -> Any:
        """`notify: false`: an explicit "tell nothing", which the owner's default does not replace."""
        return {"on": []} if value is False else value

    @property
    def environment_version(self) -> str | None:
        """The catalogue environment as pinned at submit ("name@3"); None for the server's own."""
        return self.environment if "@" in self.environment else None

    @model_validator(mode="before")
    @classmethod
    def _single_task_shorthand(cls, data: Any) -> Any:
        """`command:` (+ `resources:`, `instances:`) at the top level means one task named main."""
        if isinstance(data, dict) and "tasks" not in data and "command" in data:
            data = dict(data)
            task = {k: data.pop(k) for k in ("command", "resources", "instances") if k in data}
            data["tasks"] = {"main": task}
        if isinstance(data, dict) and isinstance(data.get("priority"), str):
            data = {**data, "priority": data["priority"].strip().lower()}
        return data

    @field_validator("max_runtime", "stop_grace", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        seconds = parse_duration_s(value)
        # Stored as one number and unit ("90m", "5400s"): the loops' spec reader reads that form.
        if isinstance(value, str) and len(_DURATION_RE.findall(value)) == 1:
            return value.strip()
        return format_seconds(seconds)

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, value: dict[str, TaskV1]) -> dict[str, TaskV1]:
        for role in value:
            if not re.match(NAME_RE, role) or len(role) > 64:
                raise ValueError(f"task name {role!r} must be up to 64 letters, digits, '.', '_' or '-'")
        total = sum(t.instances for t in value.values())
        if total > MAX_INSTANCES:
            raise ValueError(
                f"the job has {total} instances over all tasks; at most {MAX_INSTANCES} are allowed"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return check_env(value, stored=_is_stored(info))

    @model_validator(mode="after")
    def _secret_targets(self) -> JobSpecV1:
        """Each variable and file is given by one secret, and never also by `env`: which value
        would win is not something a job should have to guess."""
        envs = [s.env for s in self.secrets if s.env is not None]
        files = [s.file for s in self.secrets if s.file is not None]
        for kind, names in (("env variable", envs), ("file", files)):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"secrets: {kind} {twice[0]!r} is given by more than one secret")
        plain = set(self.env).union(*(t.env for t in self.tasks.values()))
        clash = sorted(plain.intersection(envs))
        if clash:
            raise ValueError(f"secrets: env {clash[0]!r} is also set in 'env'; keep one of them")
        return self

    @property
    def max_runtime_s(self) -> float | None:
        return None if self.max_runtime is None else parse_duration_s(self.max_runtime)

    @property
    def priority_value(self) -> Priority:
        return Priority.parse(self.priority)

    @property
    def total_gpus(self) -> int:
        return sum(t.instances * t.resources.gpus for t in self.tasks.values())

    @cached_property
    def view(self) -> SpecView:
        """Computed once per instance; a stored spec's instance is shared by all its rows."""
        tasks = tuple(
            TaskView(
                role=role,
                instances=task.instances,
                resources=task.resources.to_scheduler(),
                command=task.command,
                env=dict(task.env),
            )
            for role, task in self.tasks.items()  # dict order is spec order is rank order
        )
        grace = parse_duration_s(self.stop_grace) if self.stop_grace else DEFAULT_STOP_GRACE_S
        return SpecView(
            tasks=tasks,
            env=dict(self.env),
            max_runtime_s=self.max_runtime_s,
            environment=self.environment,
            stop_grace_s=grace,
        )

    def model_copy(self, *, update: Mapping[str, object] | None = None, deep: bool = False) -> JobSpecV1:
        """A copy with `update` applied, without the cached `view` and stored JSON of the original
        (pydantic copies the instance dict, where cached properties live)."""
        copied = super().model_copy(update=update, deep=deep)
        for cached in ("view", "_stored"):
            copied.__dict__.pop(cached, None)
        return copied

    @cached_property
    def _stored(self) -> dict[str, object]:
        return self.model_dump(mode="json", exclude_none=True)

    def stored(self) -> Mapping[str, object]:
        """The JSON stored in `Job.spec` (and returned by the API): no null fields. Computed once
        per instance and shared: read-only."""
        return self._stored

    def task_specs(self) -> tuple[TaskSpec, ...]:
        """The scheduler's view of this job's tasks, in spec order (rank order for launches)."""
        return tuple(
            TaskSpec(role=role, instances=task.instances, resources=task.resources.to_scheduler())
            for role, task in self.tasks.items()
        )


class SpecError(ValueError):
    """A spec that is not YAML/JSON at all, or not a mapping (field errors use ValidationError)."""


def load_spec_text(text: str) -> dict[str, Any]:
    """Parse YAML (JSON is YAML too) into a mapping, with a plain error when it is not one."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise SpecError(f"the spec is larger than {MAX_SPEC_BYTES // 1024} KiB")
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SpecError(f"the spec is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
        raise SpecError("the spec must be a mapping of fields such as 'name' and 'tasks'")
    return data


def parse_spec(data: dict[str, Any] | str) -> JobSpecV1:
    """Validate a spec given as a mapping or YAML text. Raises SpecError or ValidationError."""
    if isinstance(data, str):
        data = load_spec_text(data)
    return JobSpecV1.model_validate(data)


__all__ = [
    "SHELL_OWNED_ENV",  # root_env's, named here too: what a spec may not name
    "SHELL_READONLY_ENV",
    "JobSpecV1",
    "MountV1",
    "ResourcesV1",
    "SecretUseV1",
    "SpecError",
    "SpecView",
    "TaskV1",
    "TaskView",
    "ValidationError",
    "check_labels",
    "load_spec_text",
    "parse_duration_s",
    "parse_label_selector",
    "parse_memory_mib",
    "parse_spec",
]
