"""Monitoring settings (CORRAL_MONITOR_* environment variables) and the monitor config file
(`<home>/monitor.yml` by default): notification channels, retry policy, the admin idle-GPU rule
and health-check thresholds.

The file is validated when the server starts; a bad file is refused with its path and the line of
the offending value (`MonitorConfigError`), so a typo never silently disables notifications.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from corral.config import FileVariablesSettings, Settings
from corral.yaml_lines import check_unique_names, error_loc, line_of, safe_load

log = logging.getLogger("corral.monitor.config")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from `90`, `"90s"`, `"15m"`, `"1h"`, `"1.5d"`. Not YAML's `.inf` or `.nan` (nor
    digits past a float's range): an endless window or hold would never end, and NaN compares
    false with everything."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '15m' or '1h', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
        if seconds < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"expected a duration such as '30s', '15m' or '1h', got {value!r}")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be a finite number of seconds, got {value!r}")
    return seconds


class MonitorSettings(FileVariablesSettings):
    """Tunables of the monitoring loops; shorter values are for tests. Like every setting, each
    can be read from a file: CORRAL_MONITOR_WEBHOOK_TOKEN_FILE=/path."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_MONITOR_", extra="ignore")

    # GPU readings from NVML / the virtual provider. 5 s: a fault reaches its incident and its first
    # page within 10 s (docs/operations.md).
    sample_interval_s: float = 5.0
    health_interval_s: float = 10.0  # node heartbeats, job OOMs
    delivery_interval_s: float = 2.0  # notification channel sends
    idle_interval_s: float = 60.0  # idle-GPU policy
    webhook_token: str | None = None  # shared secret for POST /api/v1/alerts/webhook
    config_file: Path | None = None  # default: <home>/monitor.yml (optional file)


def webhook_token_path(settings: Settings) -> Path:
    return settings.home / "alert_webhook_token"


def webhook_token(settings: Settings, monitor: MonitorSettings | None = None) -> str | None:
    """The webhook's shared secret: CORRAL_MONITOR_WEBHOOK_TOKEN, else `<home>/alert_webhook_token`
    (the file Alertmanager's `credentials_file` can point at). None: the webhook refuses everyone."""
    monitor = monitor or MonitorSettings()
    if monitor.webhook_token:
        return monitor.webhook_token.strip()
    path = webhook_token_path(settings)
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return token or None


def generate_webhook_token(settings: Settings) -> Path | None:
    """`corral up --demo`: a random webhook secret in `<home>/alert_webhook_token` (0600, made
    once with O_EXCL) when none is configured, so the demo starts with a working webhook and
    without the start-up warning. A production server never calls this: there a missing secret
    stays a warning and a webhook that refuses everyone. Returns the file written, else None."""
    if webhook_token(settings) is not None:
        return None
    path = webhook_token_path(settings)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # an empty file someone made: theirs to fill; the warning says so
        return None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


Duration = Annotated[float, Field(ge=0)]


# The longest SMTP `timeout:` of an email channel. It bounds each SMTP operation, and a whole send
# has SMTP_SEND_OPERATIONS of them as its deadline (connect, greeting, EHLO, STARTTLS, EHLO, AUTH,
# MAIL, RCPT, DATA, the message, QUIT, one spare; EmailChannel.send_deadline_s): a send claimed at
# the end of a delivery pass's claim budget must end before its claim expires
# (corral.monitor.claiming: SENDING_RETRY_S - SEND_BUDGET_S = 240 s), or another server sends it
# too (review110 #5)
SMTP_TIMEOUT_MAX_S = 20.0
SMTP_SEND_OPERATIONS = 12


def _more_than_zero(timeout: float) -> float:
    """A channel's timeout: 0 is no wait at all (smtplib refuses a non-blocking socket, a
    webhook's request could never be answered), so every send of the channel would fail."""
    if timeout <= 0:
        raise ValueError("must be more than 0 s: it is how long the channel waits for its server")
    return timeout


class EmailChannel(_Strict):
    name: str = Field(min_length=1, max_length=64)
    type: Literal["email"]
    smtp_host: str = Field(min_length=1)
    smtp_port: int = Field(default=25, ge=1, le=65535)
    sender: str = Field(alias="from", min_length=3)
    to: list[str] = Field(min_length=1)
    username: str | None = None
    password: str | None = None
    starttls: bool = False
    timeout: Duration = 10.0

    _durations = field_validator("timeout", mode="before")(parse_duration)

    @field_validator("timeout")
    @classmethod
    def _within_a_claim(cls, value: float) -> float:
        _more_than_zero(value)
        if value > SMTP_TIMEOUT_MAX_S:
            raise ValueError(
                f"{value:g} s is longer than {SMTP_TIMEOUT_MAX_S:g} s: it bounds each SMTP operation, "
                f"and a send of up to {SMTP_SEND_OPERATIONS} operations must end before its claim "
                "expires (or another server sends the message too)"
            )
        return value

    @property
    def send_deadline_s(self) -> float:
        """The most one send may take, whatever the server does: `timeout` bounds each socket
        operation only, and a server answering a line at a time, each within it, would otherwise
        hold a send open past its message's claim (corral.monitor.channels.SmtpDeadline)."""
        return self.timeout * SMTP_SEND_OPERATIONS


class WebhookChannel(_Strict):
    name: str = Field(min_length=1, max_length=64)
    type: Literal["webhook"]
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: Duration = 10.0

    _durations = field_validator("timeout", mode="before")(parse_duration)
    _positive = field_validator("timeout")(_more_than_zero)


Channel = Annotated[EmailChannel | WebhookChannel, Field(discriminator="type")]


class RetryPolicy(_Strict):
    initial_backoff: Duration = 5.0
    max_backoff: Duration = 300.0
    max_attempts: int = Field(default=12, ge=1)

    _durations = field_validator("initial_backoff", "max_backoff", mode="before")(parse_duration)

    def backoff_s(self, attempts: int) -> float:
        """Delay after the `attempts`-th failure: doubling from initial_backoff, capped."""
        return float(min(self.max_backoff, self.initial_backoff * (2 ** max(0, attempts - 1))))


class IdleGpuRule(_Strict):
    """Also the shape of a job's own `idle_gpu:` policy (there `grace` and `action` are optional)."""

    below_percent: float = Field(default=10.0, ge=0, le=100)
    for_s: Duration = Field(default=3600.0, alias="for")
    grace: Duration = 900.0  # between warning the owner and acting
    action: Literal["warn", "stop", "requeue"] = "warn"

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    _durations = field_validator("for_s", "grace", mode="before")(parse_duration)


class HealthRules(_Strict):
    node_lost_after: Duration = 60.0  # heartbeat age that counts as a lost node
    gpu_temperature_c: float = Field(default=90.0, gt=0)
    xid_alert_hold: Duration = 600.0  # an Xid is an event: its alert stays firing this long
    oom_alert_hold: Duration = 3600.0
    # Send Corral's own health alerts to the channels. With Prometheus + Alertmanager deployed the
    # same fault also arrives through the webhook; set false to be told once.
    notify: bool = True

    _durations = field_validator("node_lost_after", "xid_alert_hold", "oom_alert_hold", mode="before")(
        parse_duration
    )


class AnomalyRules(_Strict):
    """The anomaly detector's time scales (corral.monitor.anomaly.DetectorConfig; docs/anomaly.md).
    The defaults suit the 5 s sampling interval; tests shorten them with the interval."""

    window: Duration = 3600.0  # readings kept per GPU
    recent: Duration = 300.0  # compared against the older part of the window
    trend: Duration = 900.0  # the temperature trend is fitted over this long
    settle: Duration = 240.0  # after a load change the temperature is not judged for this long
    baseline_refresh: Duration = 60.0
    ecc_window: Duration = 1800.0
    min_baseline: int = Field(default=12, ge=3)  # readings per load level before it is judged
    temperature_limit_c: float = Field(default=90.0, gt=0)  # where the trend is projected to

    _durations = field_validator(
        "window", "recent", "trend", "settle", "baseline_refresh", "ecc_window", mode="before"
    )(parse_duration)

    @model_validator(mode="after")
    def _recent_inside_window(self) -> AnomalyRules:
        if not 0 < self.recent < self.window:
            raise ValueError(
                f"anomaly.recent ({self.recent:g} s) must be > 0 and shorter than anomaly.window"
            )
        return self


class MonitorConfig(_Strict):
    channels: list[Channel] = Field(default_factory=list)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    idle_gpu: IdleGpuRule | None = None  # the admin rule; None = only jobs' own policies apply
    health: HealthRules = Field(default_factory=HealthRules)
    anomaly: AnomalyRules = Field(default_factory=AnomalyRules)

    @field_validator("channels")
    @classmethod
    def _unique_names(
        cls, channels: list[EmailChannel | WebhookChannel]
    ) -> list[EmailChannel | WebhookChannel]:
        check_unique_names([channel.name for channel in channels], "channels")
        return channels


class MonitorConfigError(ValueError):
    """A refused monitor config: the message names the file and line."""


def config_path(settings: Settings, monitor: MonitorSettings | None = None) -> Path:
    monitor = monitor or MonitorSettings()
    return monitor.config_file or settings.home / "monitor.yml"


def load_monitor_config(path: Path) -> MonitorConfig:
    """Parse and validate `path`; a missing file means the defaults (no channels)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return MonitorConfig()
    except OSError as exc:
        raise MonitorConfigError(f"{path}: cannot read the monitor config: {exc}") from exc
    try:
        root = yaml.compose(text)
        data = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise MonitorConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if data is None:
        return MonitorConfig()
    if not isinstance(data, dict):
        raise MonitorConfigError(f"{path}:1: the monitor config must be a mapping (channels:, retry:, ...)")
    try:
        return MonitorConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = error_loc(err)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc += ("type",)  # point at the `type:` line, the value that chose no model
        line = line_of(root, loc)
        field = ".".join(str(p) for p in loc) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        raise MonitorConfigError(f"{path}:{line}: {field}: {message}") from exc


class MonitorConfigSource:
    """The monitor config file, reloaded when it changes (modification time or size).

    The server holds ONE of these (corral.monitor.loops.config_source) for the loops and the HTTP
    routes alike, so a channel added while the server runs is used by the Alertmanager webhook as
    soon as by the delivery loop. A bad edit keeps the last good config and is logged once; the
    first load raises instead (start-up refuses a bad file).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()  # loops and request threads ask at the same time
        self._stamp: tuple[int, int] | None = None
        self._config: MonitorConfig | None = None

    def current(self) -> MonitorConfig:
        try:
            stat = self.path.stat()
            stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None  # no file: the defaults
        with self._lock:
            if self._config is not None and stamp == self._stamp:
                return self._config
            try:
                config = load_monitor_config(self.path)
            except MonitorConfigError as exc:
                if self._config is None:
                    raise
                self._stamp = stamp  # this bad version is reported once, not at every call
                log.error("keeping the previous monitor config: %s", exc)
                return self._config
            self._stamp, self._config = stamp, config
            return config
