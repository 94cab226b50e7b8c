"""YAML as Corral reads what people write: `safe_load` (PyYAML's safe loader, but a date it cannot
make is a YAMLError naming its line, like any other error), and `line_of`, where in a YAML text a
pydantic error points: the config files Corral validates (monitor config, remediation rules,
exit-spec) name the line of what they refuse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml
from pydantic_core import ErrorDetails, PydanticCustomError


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a timestamp it cannot construct (`2026-13-02`, hour 25)
    raises a ConstructorError with the node's position instead of a bare ValueError, which every
    caller catching `yaml.YAMLError` missed (a 500, or a traceback in the CLI)."""

    def construct_yaml_timestamp(self, node: yaml.Node) -> Any:
        try:
            return super().construct_yaml_timestamp(node)  # type: ignore[arg-type]
        except ValueError as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} is not a valid date or time ({exc})", node.start_mark
            ) from None


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, raising only `yaml.YAMLError` for a text it cannot read."""
    return yaml.load(text, Loader=_Loader)


def line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int:
    """The 1-based line of the deepest YAML node on pydantic's error path `loc` (from
    `yaml.compose`). A part with no node of its own (a missing key, or a union's tag such as
    "webhook") keeps its parent's line and the walk goes on with the next part."""
    line = 1 if node is None else node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        if child is None:
            continue
        node, line = child, child.start_mark.line + 1
    return line


def check_unique_names(names: Sequence[str], what: str) -> None:
    """Raise a pydantic error for the first name seen twice, carrying its index, so that
    `error_loc` points at that item's `name:` line rather than at the list's."""
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise PydanticCustomError(
                "duplicate_name", f"two {what} are named {{name}}", {"name": repr(name), "index": index}
            )
        seen.add(name)


def error_loc(err: ErrorDetails) -> tuple[int | str, ...]:
    """Pydantic's error path, down to the duplicate's own `name` for `check_unique_names`."""
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    if err["type"] == "duplicate_name" and "index" in ctx:
        loc += (int(ctx["index"]), "name")
    return loc
