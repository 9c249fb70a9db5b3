"""Run single SGLang 0.5.23 functions from its source (wheel or install) with stubbed globals.

The plug-in's tests execute SGLang's own code where it can run without a GPU or a server:
`sglang_defs` compiles chosen top-level functions, classes, constants or ``Class.method``
bodies of one SGLang file into a namespace the test fills with stand-ins for their globals;
`install_modules` puts stub modules (and their parent packages) into ``sys.modules``, so
``pkgutil.resolve_name`` (SGLang's HookRegistry) and function-level imports find them.
"""

from __future__ import annotations

import __future__
import ast
import sys
import types
from typing import Any, Iterable


_TREES: dict[tuple[str, str], ast.Module] = {}


def sglang_defs(source: Any, relpath: str, names: Iterable[str], namespace: dict) -> dict:
    """Compile `names` of SGLang's `relpath` into `namespace` (returned). A name is a
    top-level def / class / assignment, or ``Class.method`` (bound under ``method``)."""
    key = (source.describe(), relpath)
    if key not in _TREES:
        _TREES[key] = ast.parse(source.read_text(relpath), filename=relpath)
    tree = _TREES[key]
    nodes = []
    for name in names:
        head, _, member = name.partition(".")
        body = tree.body
        if member:
            cls = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == head)
            body, head = cls.body, member
        nodes.append(next(n for n in body if _defines(n, head)))
    code = compile(ast.Module(nodes, []), relpath, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - SGLang's own source, the point of these tests
    return namespace


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    return isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name


def install_modules(monkeypatch, modules: dict[str, dict]) -> dict[str, types.ModuleType]:
    """sys.modules[name] = a module holding `attrs`, with stub parents, for the test only."""
    made: dict[str, types.ModuleType] = {}
    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in made:
                mod = types.ModuleType(parent)
                mod.__path__ = []  # a package
                made[parent] = mod
                monkeypatch.setitem(sys.modules, parent, mod)
        mod = made.get(name) or types.ModuleType(name)
        mod.__dict__.update(attrs)
        made[name] = mod
        monkeypatch.setitem(sys.modules, name, mod)
    for name, mod in made.items():  # parents hold their children as attributes
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(made[parent], child, mod)
    return made
