"""Where in a YAML text a pydantic error points: the config files Corral validates (monitor config,
remediation rules, exit-spec) name the line of what they refuse."""

from __future__ import annotations

from collections.abc import Sequence

import yaml


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
