"""Template parameters: their declaration, the coercion of given values, and rendering a
template's spec with them. Pure: no database.

    parameters:
      lr: {type: float, default: 0.01, min: 0, max: 1, description: learning rate}
      gpus: {type: int, default: 1, min: 1, max: 8}
      opt: {type: choice, choices: [sgd, adam], default: adam}
      amp: {type: bool, default: false}
      tag: {type: string, default: run}
    name: train-${tag}
    command: python train.py --lr ${lr} --opt ${opt}
    resources: {gpus: "${gpus}"}

A string that is exactly `${name}` becomes the value itself (an int stays an int, so
`gpus: ${gpus}` is a number for the spec); `${name}` inside a longer string is replaced by the
value's text (a bool as `true`/`false`). `$${` writes a literal `${`. Every reference must name a
declared parameter; a value of the wrong type or out of range is refused naming the parameter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from corral.spec import JobSpecV1

ParamType = Literal["string", "int", "float", "bool", "choice"]
PARAM_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
REF_RE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
MAX_PARAMETERS = 64
MAX_STRING = 4096
Value = str | int | float | bool


class ParameterError(ValueError):
    """A parameter or value that cannot be used; `name` is the parameter (None: the template)."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class Parameter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: ParamType = "string"
    default: Value | None = None
    description: str = Field("", max_length=1024)
    min: float | None = None
    max: float | None = None
    choices: list[str | int | float] | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _check(self) -> Parameter:
        if self.type == "choice" and not self.choices:
            raise ValueError("a 'choice' parameter lists its 'choices'")
        if self.type != "choice" and self.choices is not None:
            raise ValueError("only a 'choice' parameter has 'choices'")
        if self.type not in ("int", "float") and (self.min is not None or self.max is not None):
            raise ValueError("only 'int' and 'float' parameters have 'min' and 'max'")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is more than max {self.max}")
        return self


def parse_parameters(raw: Any) -> dict[str, Parameter]:
    """The `parameters:` mapping, checked; ParameterError naming the parameter."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParameterError("'parameters' must be a mapping of name to {type, default, ...}")
    if len(raw) > MAX_PARAMETERS:
        raise ParameterError(f"a template has at most {MAX_PARAMETERS} parameters")
    params: dict[str, Parameter] = {}
    for name, decl in raw.items():
        if not isinstance(name, str) or not PARAM_NAME_RE.match(name):
            raise ParameterError(f"parameter name {name!r} must be letters, digits and '_'", str(name))
        try:
            param = Parameter.model_validate(decl if isinstance(decl, dict) else _bare(decl))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ParameterError(
                f"parameter {name!r}: {where + ': ' if where else ''}{first['msg']}", name
            ) from None
        if param.default is not None:
            coerce(name, param, param.default)  # a default must itself be valid
        params[name] = param
    return params


def _bare(default: Any) -> dict[str, Any]:
    """`lr: 0.1` is short for `lr: {type: float, default: 0.1}` (the type from the value)."""
    kind = {bool: "bool", int: "int", float: "float"}.get(type(default), "string")
    return {"type": kind, "default": default}


def coerce(name: str, param: Parameter, value: Any) -> Value:
    """`value` (typed, or text from `--set name=text`) as the parameter's type, in range."""
    out: Value
    if param.type == "bool":
        out = _as_bool(name, value)
    elif param.type == "int":
        out = _as_int(name, value)
    elif param.type == "float":
        out = _as_float(name, value)
    elif param.type == "choice":
        choices = param.choices or []
        found = [c for c in choices if str(c) == str(value) and not isinstance(value, bool)]
        if not found:
            raise ParameterError(
                f"parameter {name!r}: {value!r} is not one of {', '.join(str(c) for c in choices)}", name
            )
        out = found[0]
    else:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ParameterError(f"parameter {name!r}: expected text, got {value!r}", name)
        out = str(value)
        if len(out) > MAX_STRING:
            raise ParameterError(f"parameter {name!r}: longer than {MAX_STRING} characters", name)
    if isinstance(out, int | float) and not isinstance(out, bool):
        if param.min is not None and out < param.min:
            raise ParameterError(f"parameter {name!r}: {out} is less than the minimum {param.min:g}", name)
        if param.max is not None and out > param.max:
            raise ParameterError(f"parameter {name!r}: {out} is more than the maximum {param.max:g}", name)
    return out


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, str | int) else ""
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ParameterError(f"parameter {name!r}: expected true or false, got {value!r}", name)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,18}\s*", value):
        return int(value)
    raise ParameterError(f"parameter {name!r}: expected an integer, got {value!r}", name)


def _as_float(name: str, value: Any) -> float:
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise ParameterError(f"parameter {name!r}: expected a number, got {value!r}", name)
    return number


def resolve_values(params: Mapping[str, Parameter], given: Mapping[str, Any]) -> dict[str, Value]:
    """Every parameter's value: the given one (coerced) or its default; refuses unknown names and
    missing values without a default."""
    unknown = sorted(set(given) - set(params))
    if unknown:
        known = ", ".join(params) or "none"
        raise ParameterError(f"unknown parameter {unknown[0]!r} (the template has: {known})", unknown[0])
    values: dict[str, Value] = {}
    for name, param in params.items():
        if name in given:
            values[name] = coerce(name, param, given[name])
        elif param.default is not None:
            values[name] = coerce(name, param, param.default)
        else:
            raise ParameterError(f"parameter {name!r} has no default; give it a value", name)
    return values


def _text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _substitute(text: str, values: Mapping[str, Value], declared: set[str]) -> Any:
    whole = REF_RE.fullmatch(text)
    if whole and whole.group(1) is not None:
        ref = whole.group(1).strip()
        if ref not in declared:
            raise ParameterError(f"'${{{ref}}}' names no declared parameter", ref)
        return values[ref]

    def one(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "${"
        ref = match.group(1).strip()
        if ref not in declared:
            raise ParameterError(f"'${{{ref}}}' names no declared parameter", ref)
        return _text(values[ref])

    return REF_RE.sub(one, text)


def _walk(node: Any, values: Mapping[str, Value], declared: set[str]) -> Any:
    if isinstance(node, str):
        return _substitute(node, values, declared)
    if isinstance(node, list):
        return [_walk(item, values, declared) for item in node]
    if isinstance(node, dict):
        return {
            _walk(k, values, declared) if isinstance(k, str) else k: _walk(v, values, declared)
            for k, v in node.items()
        }
    return node


def split_body(body: Mapping[str, Any]) -> tuple[dict[str, Parameter], dict[str, Any]]:
    """A template body -> (its parameters, the spec part with `${...}` references)."""
    spec = {k: v for k, v in body.items() if k != "parameters"}
    return parse_parameters(body.get("parameters")), spec


def render(body: Mapping[str, Any], given: Mapping[str, Any]) -> JobSpecV1:
    """The job spec of a template body with the given values. Raises ParameterError (a value,
    naming the parameter) or pydantic's ValidationError (the rendered spec)."""
    params, spec = split_body(body)
    values = resolve_values(params, given)
    return JobSpecV1.model_validate(_walk(spec, values, set(params)))


def sample_values(params: Mapping[str, Parameter]) -> dict[str, Value]:
    """Values to check a template with at publish: each default, else the smallest valid one."""
    out: dict[str, Value] = {}
    for name, p in params.items():
        if p.default is not None:
            continue
        if p.type == "choice":
            out[name] = (p.choices or [""])[0]
        elif p.type in ("int", "float"):
            low = p.min if p.min is not None else min(1.0, p.max) if p.max is not None else 1.0
            out[name] = math.ceil(low) if p.type == "int" else low
        elif p.type == "bool":
            out[name] = False
        else:
            out[name] = "x"
    return out


def describe(params: Mapping[str, Parameter]) -> list[dict[str, Any]]:
    """The parameters as the API shows them (what the portal builds its form from)."""
    return [{"name": name, **p.model_dump(exclude_none=True)} for name, p in params.items()]
