"""The shape of the code (docs/architecture.md, "Layout"): imports go only downward, and no two
modules import each other, directly or through others. Read from the source with `ast` (module-level
imports only: a function-level import is how a module defers an optional or heavy dependency)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# The lower layers: libraries and services that any process may use. They must not reach up into
# the server's loops, the monitoring process parts, the API, the portal, the CLI or the loop-level
# diagnosis watch (which themselves may import anything below).
LOW = (
    "corral.scheduler",
    "corral.sim",
    "corral.db",
    "corral.engine",
    "corral.storage",
    "corral.datasets",
    "corral.catalog",
    "corral.services",
    "corral.spec",
    "corral.domain",
    "corral.config",
)
# Background loops that a capability plugs into the server (server/runner.py EXTRA_LOOP_MODULES)
# live beside its library but belong to the server's layer.
HIGH = (
    "corral.server",
    "corral.monitor",
    "corral.api",
    "corral.web",
    "corral.cli",
    "corral.diagnosis",
    "corral.datasets.loops",
)
# The scheduler is a pure library shared by the live loop and the simulator: nothing of the
# database, engines or services.
PURE_SCHEDULER_MAY_IMPORT = ("corral.scheduler", "corral.domain", "corral.words")


def modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "corral").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports_of(path: Path, known: dict[str, Path]) -> Iterator[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            named = [s for s in subs if s in known]  # `from pkg import module`
            if named:
                yield from named
            elif node.module in known:
                yield node.module


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {t for t in imports_of(path, known) if t != name} for name, path in known.items()}


def test_low_layers_never_import_high_ones() -> None:
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a.startswith(LOW) and not a.startswith(HIGH)
        for b in targets
        if b.startswith(HIGH)
    )
    assert upward == [], "imports that go up a layer:\n" + "\n".join(upward)


def test_scheduler_is_a_pure_library() -> None:
    impure = sorted(
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a.startswith("corral.scheduler")
        for b in targets
        if not b.startswith(PURE_SCHEDULER_MAY_IMPORT)
    )
    assert impure == [], "the scheduler imports outside itself:\n" + "\n".join(impure)


def test_no_import_cycles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert cycles == [], f"modules that import each other: {cycles}"


def test_the_cli_starts_without_the_database_layer() -> None:
    """Every `corral` command pays for what cli/main imports; SQLAlchemy and the ORM models cost
    about a second of start-up on a 2-core machine and no client command needs them."""
    import subprocess
    import sys

    probe = (
        "import sys, corral.cli.main; "
        "print(sorted(m for m in sys.modules if m.startswith(('sqlalchemy', 'corral.db'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
