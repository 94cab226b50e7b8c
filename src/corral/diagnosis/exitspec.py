"""The exit-spec: what an ended attempt left behind -> reason, category, message, fix, retry policy.

The table ships as `corral/data/exit_spec.yaml` (its comments describe the format); an admin file
(`CORRAL_DIAG_EXIT_SPEC_FILE`) extends or overrides it by reason code. Regular expressions are RE2
(`google-re2`): matching is linear in the log's length whatever the pattern, so no rule can make
diagnosis hang on a pathological log, and patterns RE2 cannot run in linear time (backreferences,
lookaround) are refused when the file is loaded, with their line.

A file that does not parse is refused with its path and line (`ExitSpecError`); the loop that
reloads it keeps the previous table (`ExitSpecCache`).
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

import re2
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.yaml_lines import line_of, safe_load

log = logging.getLogger("corral.diagnosis")
MAX_PATTERN_CHARS = 1000
EVENTS = frozenset(
    {
        "oom", "timeout", "signal", "exit_code", "launch_failed", "node_lost", "lost", "stopped",
        "preempted", "gpu_error", "gpu_lost", "hang", "status_unreadable",
    }
)  # fmt: skip


class Category(StrEnum):
    USER = "user"
    PLATFORM = "platform"
    HARDWARE = "hardware"
    TRANSIENT = "transient"
    PREEMPTED = "preempted"

    @property
    def own_fault(self) -> bool:
        """A failure the job caused: counted against its `retries:`; the others use the
        platform-loss budget."""
        return self is Category.USER


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryPolicy(_Strict):
    policy: Literal["never", "up_to", "always"]
    limit: int | None = Field(default=None, ge=0, le=100)
    backoff_s: float = Field(default=0.0, ge=0, le=86400)
    backoff_factor: float = Field(default=2.0, ge=1, le=10)
    max_backoff_s: float = Field(default=3600.0, ge=0, le=86400)

    def model_post_init(self, _context: object) -> None:
        if self.policy == "up_to" and self.limit is None:
            raise ValueError("policy up_to needs a limit")
        if self.policy != "up_to" and self.limit is not None:
            raise ValueError(f"limit only goes with policy up_to, not {self.policy}")

    @property
    def cap(self) -> int | None:
        """Retries this policy allows at most (None: no cap of its own)."""
        return 0 if self.policy == "never" else self.limit

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        if self.backoff_s <= 0:
            return 0.0
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor ** max(0, retry - 1))


class ExitRule(_Strict):
    reason: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    category: Category
    message: str = Field(min_length=1, max_length=300)
    fix: str = Field(min_length=1, max_length=500)
    retry: RetryPolicy
    match: Literal["all", "any"] = "all"
    events: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    signals: tuple[int, ...] = ()
    log: tuple[str, ...] = ()

    @field_validator("events")
    @classmethod
    def _known_events(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - EVENTS)
        if unknown:
            raise ValueError(f"unknown event(s) {', '.join(unknown)}; known: {', '.join(sorted(EVENTS))}")
        return value

    @field_validator("log")
    @classmethod
    def _linear_regexes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if len(pattern) > MAX_PATTERN_CHARS:
                raise ValueError(f"a log pattern is longer than {MAX_PATTERN_CHARS} characters")
            try:
                re2.compile(pattern)
            except re2.error as exc:
                raise ValueError(f"RE2 cannot compile {pattern!r}: {exc}") from None
        return value

    def model_post_init(self, _context: object) -> None:
        if not (self.events or self.exit_codes or self.signals or self.log):
            raise ValueError(f"rule {self.reason} has no condition (events, exit_codes, signals or log)")


class ExitSpecFile(_Strict):
    version: Literal[1] = 1
    rules: tuple[ExitRule, ...] = Field(max_length=500)


class ExitSpecError(ValueError):
    """A refused exit-spec file: the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What an ended attempt left behind."""

    events: frozenset[str]  # engine reason codes and Corral's own events (see EVENTS)
    exit_code: int | None = None
    signal: int | None = None
    log_tail: str = ""  # the end of the failing rank's log, decoded (invalid UTF-8 replaced)


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: str
    category: Category
    message: str
    fix: str
    retry: RetryPolicy
    evidence: str = ""  # the log line that matched, if a log pattern decided


UNCLASSIFIED = Verdict(
    reason="exit_code",
    category=Category.USER,
    message="The attempt ended badly and no exit-spec rule explains it.",
    fix="See the end of the log.",
    retry=RetryPolicy(policy="always"),
)


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: ExitRule
    regex: re2._Regexp | None


class ExitSpec:
    """A loaded, compiled table. `classify` is pure and bounded: one RE2 search per log rule."""

    def __init__(self, rules: Sequence[ExitRule]) -> None:
        self.rules = tuple(rules)
        self._compiled = [
            _Compiled(r, re2.compile("|".join(f"(?:{p})" for p in r.log)) if r.log else None)
            for r in self.rules
        ]

    def classify(self, facts: Facts) -> Verdict:
        for c in self._compiled:
            evidence = _matches(c, facts)
            if evidence is not None:
                r = c.rule
                return Verdict(r.reason, r.category, r.message, r.fix, r.retry, evidence)
        return UNCLASSIFIED

    def by_reason(self, reason: str) -> ExitRule | None:
        return next((r for r in self.rules if r.reason == reason), None)


def _matches(c: _Compiled, facts: Facts) -> str | None:
    """ "" or the matched log line when the rule applies; None when it does not."""
    rule = c.rule
    checks: list[bool] = []
    if rule.events:
        checks.append(bool(facts.events & set(rule.events)))
    if rule.exit_codes:
        checks.append(facts.exit_code in rule.exit_codes)
    if rule.signals:
        checks.append(facts.signal in rule.signals)
    evidence = ""
    if c.regex is not None:
        found = c.regex.search(facts.log_tail) if facts.log_tail else None
        checks.append(found is not None)
        if found is not None:
            evidence = _line_around(facts.log_tail, found.start(), found.end())
    ok = any(checks) if rule.match == "any" else all(checks)
    return evidence if ok else None


def _line_around(text: str, start: int, end: int) -> str:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    return text[line_start : line_end if line_end >= 0 else len(text)].strip()[:300]


# -- loading -------------------------------------------------------------------------------------


def shipped_text() -> str:
    return importlib.resources.files("corral.data").joinpath("exit_spec.yaml").read_text()


def parse_exit_spec(text: str, source: str) -> ExitSpecFile:
    """Validate one file's text; ExitSpecError names `source` and the line of what is wrong."""
    try:
        root = yaml.compose(text)
        data = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ExitSpecError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ExitSpecError(f"{source}:1: an exit-spec file is a mapping with `rules:`")
    try:
        return ExitSpecFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        raise ExitSpecError(f"{source}:{line_of(root, loc)}: {field}: {message}") from None


def merge_rules(shipped: Sequence[ExitRule], admin: Sequence[ExitRule]) -> list[ExitRule]:
    """Admin rules override shipped ones with the same reason (in the shipped one's place); new
    reasons come first, in the admin file's order, so they are tried before the shipped table."""
    by_reason = {r.reason: r for r in admin}
    merged = [by_reason.pop(r.reason, r) for r in shipped]
    new = [r for r in admin if r.reason in by_reason]
    return new + merged


def load_exit_spec(admin_file: Path | None = None) -> ExitSpec:
    shipped = parse_exit_spec(shipped_text(), "exit_spec.yaml (shipped)").rules
    if admin_file is None:
        return ExitSpec(shipped)
    try:
        text = admin_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ExitSpecError(f"{admin_file}: no such exit-spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExitSpecError(f"{admin_file}: cannot read the exit-spec file: {exc}") from None
    return ExitSpec(merge_rules(shipped, parse_exit_spec(text, str(admin_file)).rules))


class ExitSpecCache:
    """The active table, reloaded when the admin file changes; a file that does not parse is
    logged and the previous table stays active: the shipped one when no table of the file ever
    was (a server started with a bad file)."""

    def __init__(self, admin_file: Path | None) -> None:
        self.admin_file = admin_file
        self._stamp: tuple[float, int] | None = None
        self._spec: ExitSpec | None = None
        self.last_error: str | None = None

    def get(self) -> ExitSpec:
        stamp = self._file_stamp()
        if self._spec is not None and stamp == self._stamp:
            return self._spec
        try:
            spec = load_exit_spec(self.admin_file)
        except ExitSpecError as exc:
            self.last_error, self._stamp = str(exc), stamp  # logged once per change of the file
            if self._spec is None:
                # Raising here left every caller without a table: the reconcile loop could then
                # record no attempt's end at all (any failure in a tick failed the whole tick),
                # and GET /jobs/{id} answered 500, until the file was fixed.
                log.error("using the shipped exit-spec: %s", exc)
                self._spec = load_exit_spec(None)
                return self._spec
            log.error("keeping the previous exit-spec: %s", exc)
            return self._spec
        self._spec, self._stamp, self.last_error = spec, stamp, None
        return spec

    def _file_stamp(self) -> tuple[float, int] | None:
        if self.admin_file is None:
            return None
        try:
            st = self.admin_file.stat()
        except OSError:
            return None
        return (st.st_mtime, st.st_size)


_CACHES: dict[Path | None, ExitSpecCache] = {}
_CACHES_LOCK = threading.Lock()


def exit_spec_cache(admin_file: Path | None) -> ExitSpecCache:
    """The process's one cache of the table of `admin_file` (None: the shipped table alone), shared
    by the reconcile, dispatch and node loops (server.reconcile.active_exit_spec) and GET /jobs/{id}
    (its platform-loss cap): one load per change of the file, one log of a file that does not
    parse."""
    with _CACHES_LOCK:
        found = _CACHES.get(admin_file)
        if found is None:
            found = _CACHES[admin_file] = ExitSpecCache(admin_file)
        return found


def markdown_table(rules: Sequence[ExitRule]) -> str:
    """The table as docs/diagnosis.md shows it (tests/diagnosis/test_exitspec.py keeps them equal)."""
    lines = [
        "| reason | category | when | retry | message | fix |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rules:
        when = []
        if r.events:
            when.append("event " + " or ".join(r.events))
        if r.exit_codes:
            when.append("exit code " + " or ".join(map(str, r.exit_codes)))
        if r.signals:
            when.append("signal " + " or ".join(map(str, r.signals)))
        if r.log:
            when.append("log matches " + " or ".join(f"`{p}`" for p in r.log))
        joined = (" or " if r.match == "any" else " and ").join(when)
        retry = r.retry.policy.replace("_", " ") + (f" {r.retry.limit}" if r.retry.limit is not None else "")
        if r.retry.backoff_s:
            retry += f", backoff {r.retry.backoff_s:g} s x{r.retry.backoff_factor:g}"
        cells = [f"`{r.reason}`", r.category.value, joined, retry, r.message, r.fix]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m corral.diagnosis.exitspec: the docs table
    print(markdown_table(load_exit_spec().rules), end="")
