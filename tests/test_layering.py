"""The house rules of bole_cli's imports, read from the source (docs/design.md §7).

Imports flow one way: commands -> library -> kernels. No module imports another that
(directly or through others) imports it back; the kernels import nothing of the tuner,
the benches, the runtime, the SGLang plug-in or the commands; no library module imports a
command. Every import statement counts, including those inside functions (a lazy import
is still a dependency). `from pkg import name` is an edge to `pkg.name` when that is a
module, else to `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bole_cli"

KERNELS = "bole_cli.kernels"
KERNELS_MAY_NOT_IMPORT = ("bole_cli.tuning", "bole_cli.bench", "bole_cli.runtime", "bole_cli.sglang",
                          "bole_cli.commands", "bole_cli.cli")
COMMAND_LAYER = ("bole_cli.commands", "bole_cli.cli", "bole_cli.__main__")
COMMAND_MODULE_MAX_LINES = 250


def _within(name: str, prefixes) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    mods = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _targets(module: str, is_package: bool, node: ast.AST, mods: dict) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        return {_nearest(n, mods) for n in names if _nearest(n, mods)}
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        target = sub if sub in mods else _nearest(source, mods)
        if target:
            out.add(target)
    return out


def _nearest(name: str, mods: dict):
    """The module that `import name` loads last: name itself, or its nearest listed parent."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in mods:
            return candidate
        parts.pop()
    return None


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    mods = module_files(root)
    graph = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(name, path.name == "__init__.py", node, mods)
        edges.discard(name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _within(module, KERNELS) and _within(target, KERNELS_MAY_NOT_IMPORT):
                found.append(f"{module} -> {target}: kernels import no tuning, bench, runtime, "
                             "sglang or command code")
            if not _within(module, COMMAND_LAYER) and _within(target, COMMAND_LAYER):
                found.append(f"{module} -> {target}: a library module imports a command")
    return found


def test_no_import_cycles():
    assert import_cycles(import_graph()) == []


def test_imports_flow_one_way():
    assert layering_violations(import_graph()) == []


def test_command_modules_are_thin():
    fat = {p.name: n for p in (PACKAGE / "commands").glob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > COMMAND_MODULE_MAX_LINES}
    assert fat == {}


# The checks above must be able to fail: the same functions on small made-up trees.

def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "bole_cli" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "bole_cli"


def test_a_cycle_through_a_lazy_import_is_found(tmp_path):
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "kernels/__init__.py": "",
        "kernels/configs.py": "def f():\n    from bole_cli.tuning import tables\n",
        "tuning/__init__.py": "",
        "tuning/tables.py": "from bole_cli.kernels.configs import f\n",
    })
    graph = import_graph(pkg)
    assert graph["bole_cli.kernels.configs"] == {"bole_cli.tuning.tables"}
    assert import_cycles(graph) == [["bole_cli.kernels.configs", "bole_cli.tuning.tables"]]
    assert any("kernels import no tuning" in v for v in layering_violations(graph))


def test_from_package_import_submodule_is_an_edge_to_the_submodule(tmp_path):
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "runtime/__init__.py": "from bole_cli.runtime.model import M\n",
        "runtime/model.py": "from bole_cli.runtime import ops\nclass M: ...\n",
        "runtime/ops.py": "from . import model as _m\n",
    })
    graph = import_graph(pkg)
    assert graph["bole_cli.runtime.model"] == {"bole_cli.runtime.ops"}
    assert graph["bole_cli.runtime.ops"] == {"bole_cli.runtime.model"}  # relative import resolved
    assert import_cycles(graph) == [["bole_cli.runtime.model", "bole_cli.runtime.ops"]]


@pytest.mark.parametrize("importer", ["bole_cli.memory", "bole_cli.sglang.plan"])
def test_a_library_module_importing_a_command_is_found(tmp_path, importer):
    rel = importer.replace("bole_cli.", "").replace(".", "/") + ".py"
    files = {"__init__.py": "", "commands/__init__.py": "", "commands/serve.py": "X = 1\n",
             rel: "from bole_cli.commands.serve import X\n"}
    if "/" in rel:
        files[rel.split("/")[0] + "/__init__.py"] = ""
    graph = import_graph(_write(tmp_path, files))
    assert layering_violations(graph) == [
        f"{importer} -> bole_cli.commands.serve: a library module imports a command"]
