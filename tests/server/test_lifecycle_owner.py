"""services/lifecycle.py is the only writer of Job.state, Attempt.state, Node.state and Gpu.health.

Read statically: every module under src/ is parsed with `ast` and each write of those columns
outside the lifecycle module is reported: `x.state = ...` (also in tuple targets and augmented
assignments), `setattr(x, "state", ...)`, `update(...).values(state=...)` (keyword or dict) and
raw SQL `UPDATE jobs SET state`. `x` is resolved inside its function (annotation, assignment,
loop over a query) to a mapped model; a write on another model (e.g. AlertNotification.state)
passes, a write on an owned model or on something the test cannot resolve fails: write through
services.lifecycle or annotate the variable.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from corral.db.base import Base
from corral.db.tables import import_all

import_all()  # every mapped model, so that a write on another model's `state` resolves and passes

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"
OWNER = SRC / "services" / "lifecycle.py"
OWNED = {"Job": "state", "Attempt": "state", "Node": "state", "Gpu": "health"}
GUARDED = set(OWNED.values())  # attribute names whose writes are checked
MODELS = {mapper.class_.__name__ for mapper in Base.registry.mappers}
assert {"AlertNotification", "Page", *OWNED} <= MODELS, sorted(MODELS)
RAW_UPDATE = re.compile(r"\bUPDATE\s+\"?(jobs|attempts|nodes|gpus)\"?\s+SET\b[^;]*\b(state|health)\b", re.I)


@dataclass(frozen=True)
class Write:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _models_in(node: ast.AST | None) -> set[str]:
    """Mapped model class names mentioned in an expression (`Job`, `select(Node)`, `GpuRow` alias
    resolution is the caller's: imports `as` are mapped in `aliases`)."""
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class _Scope:
    """Where each name of one function (or module) was bound: annotations, assignments, loops."""

    def __init__(self, body: ast.AST, aliases: dict[str, str]) -> None:
        self.aliases = aliases
        self.bindings: dict[str, list[ast.AST]] = {}
        if isinstance(body, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in [*body.args.posonlyargs, *body.args.args, *body.args.kwonlyargs]:
                if arg.annotation is not None:
                    self.bindings.setdefault(arg.arg, []).append(arg.annotation)
        for node in ast.walk(body):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(target, node.value)
            elif isinstance(node, ast.AnnAssign):
                self._bind(node.target, node.annotation)
            elif isinstance(node, ast.For | ast.comprehension):
                self._bind(node.target, node.iter)
            elif isinstance(node, ast.NamedExpr):
                self._bind(node.target, node.value)

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.bindings.setdefault(target.id, []).append(value)
        elif isinstance(target, ast.Tuple):
            for element in target.elts:  # unpacking: every element may be any of the values
                self._bind(element, value)

    def models_of(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found: set[str] = set()
        for value in self.bindings.get(name, []):
            for ident in _models_in(value):
                model = self.aliases.get(ident, ident)
                if model in MODELS:
                    found.add(model)
                elif ident in self.bindings and ident not in seen and ident != name:
                    found |= self.models_of(ident, seen | {name})
        return found


def _aliases(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out[alias.asname or alias.name] = alias.name
    return out


def _attribute_writes(node: ast.AST) -> list[ast.Attribute]:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    flat: list[ast.AST] = []
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets.extend(target.elts)
        else:
            flat.append(target)
    return [t for t in flat if isinstance(t, ast.Attribute) and t.attr in GUARDED]


def _owned_by_receiver(scope: _Scope, receiver: ast.AST, attr: str) -> str | None:
    """Why a write of `receiver.<attr>` is an owned column (None: it is another model's)."""
    if isinstance(receiver, ast.Name):
        models = scope.models_of(receiver.id)
        owned = {m for m in models if OWNED.get(m) == attr}
        if owned:
            return f"{receiver.id}.{attr} on {'/'.join(sorted(owned))}"
        if models:
            return None  # another mapped model (e.g. AlertNotification.state)
        return f"{receiver.id}.{attr} (type not known here)"
    if isinstance(receiver, ast.Attribute) and receiver.attr == "state":
        return None  # app.state.x / request.app.state (Starlette's state bag): attr is not `state`
    return f"{ast.unparse(receiver)}.{attr} (type not known here)"


def _values_writes(call: ast.Call) -> set[str]:
    keys = {kw.arg for kw in call.keywords if kw.arg in GUARDED}
    for arg in call.args:
        if isinstance(arg, ast.Dict):
            keys |= {k.value for k in arg.keys if isinstance(k, ast.Constant) and k.value in GUARDED}
    return keys


def _update_root(call: ast.Call) -> ast.Call | None:
    """The `update(...)` call at the root of a `.where(...).values(...)` chain, if any."""
    node: ast.AST = call.func
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "update":
                return node
            node = node.func
        else:
            return None


def _update_is_owned(scope: _Scope, root: ast.Call) -> bool:
    if not root.args:
        return True
    table = root.args[0]
    names = {scope.aliases.get(n, n) for n in _models_in(table)}
    models = {n for n in names if n in MODELS} | {m for n in names for m in scope.models_of(n)}
    # A table the test cannot name (e.g. a `Table` variable) is reported: be explicit instead.
    return bool(models & set(OWNED)) if models else True


def writes_in(source: str, path: str) -> list[Write]:
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found: list[Write] = []
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for body in [tree, *functions]:
        scope = _Scope(body, aliases)
        nodes = ast.walk(body) if body is not tree else _module_level(tree)
        for node in nodes:
            for target in _attribute_writes(node):
                why = _owned_by_receiver(scope, target.value, target.attr)
                if why:
                    found.append(Write(path, target.lineno, f"assigns {why}"))
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2:
                attr = node.args[1]
                if isinstance(attr, ast.Constant) and attr.value in GUARDED:
                    why = _owned_by_receiver(scope, node.args[0], str(attr.value))
                    if why:
                        found.append(Write(path, node.lineno, f"setattr {why}"))
            if isinstance(func, ast.Attribute) and func.attr == "values" and (keys := _values_writes(node)):
                root = _update_root(node)
                if root is not None and _update_is_owned(scope, root):
                    found.append(
                        Write(path, node.lineno, f"update(...).values({', '.join(sorted(keys))}=...)")
                    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and RAW_UPDATE.search(node.value):
            found.append(Write(path, node.lineno, "raw SQL UPDATE of a lifecycle column"))
    return sorted(set(found), key=lambda w: w.line)


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """Module-level statements only (function bodies are checked with their own scope)."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def test_no_module_but_lifecycle_writes_job_attempt_node_or_gpu_state() -> None:
    offenders = [
        str(w)
        for path in sorted(SRC.rglob("*.py"))
        if path != OWNER
        for w in writes_in(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert offenders == [], "write these through corral.services.lifecycle:\n" + "\n".join(offenders)


def test_the_check_finds_each_kind_of_write_and_passes_other_models() -> None:
    bad = """
from corral.db.models import Job, Node, Gpu as GpuRow
from sqlalchemy import update

def a(session, job_id):
    job = session.get(Job, job_id)
    job.state = "running"

def b(node: Node, why):
    node.state, node.message = "down", why

def c(session):
    for gpu in session.scalars(select(GpuRow)):
        gpu.health = "lost"

def d(session, jobs):
    session.execute(update(Job).where(Job.id == 1).values(state="failed"))
    session.execute(update(Job).values({"state": "failed"}))

def e(row, value):
    row.state = value
    setattr(row, "state", value)

RAW = "UPDATE jobs SET state = 'queued' WHERE id = 1"
"""
    lines = sorted(w.line for w in writes_in(bad, "bad.py"))
    assert lines == [7, 10, 14, 17, 18, 21, 22, 24], [str(w) for w in writes_in(bad, "bad.py")]
    fine = """
from corral.monitor.models import AlertNotification
from sqlalchemy import update

def deliver(session):
    due = session.scalars(select(AlertNotification)).all()
    for note in due:
        note.state = "sent"

def failure(note: AlertNotification):
    note.state = "failing"

def bag(app, request):
    app.state.settings = 1
    request.app.state.monitor_config = 2

def clear(session):
    session.execute(update(AlertNotification).values(state="given_up"))
"""
    assert writes_in(fine, "fine.py") == []
