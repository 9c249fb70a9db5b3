"""The house rules of bole_cli's imports, read from the source (docs/design.md §7).

Imports flow one way: commands -> library -> kernels. No module imports another that
(directly or through others) imports it back; the kernels import nothing of the tuner,
the benches, the runtime, the SGLang plug-in or the commands; no library module imports a
command. Every import statement counts, including those inside functions (a lazy import
is still a dependency). `from pkg import name` is an edge to `pkg.name` when that is a
module, else to `pkg`.

One file, one job: Triton kernels (`@triton.jit` and its companions) only in
bole_cli/kernels/; no module of the SGLang plug-in over 400 lines; every SGLang name the
plug-in hooks or reads is a row of the one table, `bole_cli/sglang/targets.py`.
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


# ----------------------------------------------------------------- one file, one job

SGLANG_PACKAGE = "bole_cli.sglang"
MODULE_MAX_LINES = 400  # the plug-in's and the kernels' modules (one file, one job)
TRITON_DECORATORS = ("jit", "autotune", "heuristics")
# The loaders of SGLang's own kernels read SGLang's source as files, not as names to hook.
SGLANG_LOADERS = ("bole_cli.sglang.source", "bole_cli.sglang.isolation", "bole_cli.sglang.baseline_kernels",
                  "bole_cli.sglang.triton_interpreter")
TABLE_MODULE = "bole_cli.sglang.targets"
# The version gate reads the version before any name can be checked against that version.
UNCHECKED_SGLANG_NAMES = ("sglang.version.__version__",)


def _parsed(root: Path):
    for name, path in sorted(module_files(root).items()):
        yield name, path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def triton_kernels_outside_kernels(root: Path = PACKAGE) -> list[str]:
    """module:function for each Triton kernel (jit, autotune, heuristics) outside kernels/."""
    found = []
    for name, _, tree in _parsed(root):
        if _within(name, KERNELS):
            continue
        from_triton = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and n.module == "triton" for a in n.names}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                dotted = ast.unparse(dec.func if isinstance(dec, ast.Call) else dec)
                if (dotted.startswith("triton.") and dotted.split(".")[-1] in TRITON_DECORATORS
                        or dotted in from_triton):
                    found.append(f"{name}:{node.name}")
                    break
    return found


def long_modules(root: Path = PACKAGE) -> dict[str, int]:
    """Modules of the plug-in and of the kernels over MODULE_MAX_LINES lines."""
    mods = module_files(root)
    return {name: n for name, path in sorted(mods.items()) if (_within(name, SGLANG_PACKAGE) or _within(name, KERNELS))
            and (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_MAX_LINES}


def kernels_launched_elsewhere(root: Path = PACKAGE) -> list[str]:
    """Launches (``kernel[grid](...)``) of a kernel imported from another module: each kernel
    file holds its kernel and its launcher, so a launch names a kernel of its own module."""
    found = []
    for name, _, tree in _parsed(root):
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in imported):
                found.append(f"{name}: launches {node.func.value.id}")
    return found


def sglang_names_outside_the_table(table, root: Path = PACKAGE) -> list[str]:
    """What the plug-in hooks or reads of SGLang that is not a row of the one table (`table`:
    rows with .target, .use, .function): HookTarget rows built elsewhere, `from sglang...
    import` names, keys read from SGLang's module globals (``sglang_globals[...]``), and AROUND
    hooks (``_around_*`` in the hooks module) that no "around" row names, or rows naming none."""
    listed = {row.target for row in table}
    around = {row.function for row in table if row.use == "around"}

    def known(dotted: str) -> bool:
        return (dotted in UNCHECKED_SGLANG_NAMES or dotted in listed
                or any(t.startswith(dotted + ".") for t in listed))

    found, defined = [], set()
    for name, _, tree in _parsed(root):
        if not _within(name, SGLANG_PACKAGE) or _within(name, SGLANG_LOADERS):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "HookTarget" and name != TABLE_MODULE):
                found.append(f"{name}: a HookTarget row outside {TABLE_MODULE}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sglang":
                found += [f"{name}: {node.module}.{a.name} is not in the table" for a in node.names
                          if not known(f"{node.module}.{a.name}")]
            elif isinstance(node, ast.Subscript) or (isinstance(node, ast.Call)
                                                     and isinstance(node.func, ast.Attribute)
                                                     and node.func.attr == "get"):
                owner = node.value if isinstance(node, ast.Subscript) else node.func.value
                key = node.slice if isinstance(node, ast.Subscript) else (node.args or [None])[0]
                if (isinstance(owner, ast.Name) and owner.id == "sglang_globals"
                        and isinstance(key, ast.Constant) and isinstance(key.value, str)
                        and not any(t.endswith("." + key.value) for t in listed)):
                    found.append(f"{name}: SGLang's global {key.value} is not in the table")
            elif (isinstance(node, ast.FunctionDef) and name == f"{SGLANG_PACKAGE}.hooks"
                  and node.name.startswith("_around_")):
                defined.add(node.name)
                if node.name not in around:
                    found.append(f"{name}: {node.name} hooks nothing listed in the table")
    found += [f"{TABLE_MODULE}: {fn} is not a hook in {SGLANG_PACKAGE}.hooks"
              for fn in sorted(around - defined)]
    return found


def test_triton_kernels_live_in_kernels():
    assert triton_kernels_outside_kernels() == []


def test_plugin_and_kernel_modules_are_short():
    assert long_modules() == {}


def test_each_kernel_is_launched_by_its_own_file():
    assert kernels_launched_elsewhere() == []


def test_every_sglang_name_the_plugin_uses_is_in_the_one_table():
    from bole_cli.sglang.targets import SGLANG_TARGETS

    assert sglang_names_outside_the_table(SGLANG_TARGETS) == []


def test_one_job_rules_find_violations(tmp_path):
    from types import SimpleNamespace as Row

    pkg = _write(tmp_path, {
        "__init__.py": "",
        "kernels/__init__.py": "",
        "kernels/ok.py": "import triton\n@triton.jit\ndef _k(x):\n    pass\ndef launch():\n    _k[(1,)](0)\n",
        "kernels/other.py": "from bole_cli.kernels.ok import _k\ndef launch():\n    _k[(1,)](0)\n",
        "kernels/long.py": "x = 1\n" * (MODULE_MAX_LINES + 1),
        "sglang/__init__.py": "",
        "sglang/factors.py": ("import triton\nfrom triton import jit\n@triton.jit\ndef _a(x):\n    pass\n"
                              "@jit\ndef _b(x):\n    pass\n@triton.autotune(configs=[], key=[])\n"
                              "@triton.jit\ndef _c(x):\n    pass\n"),
        "sglang/plugin.py": "x = 1\n" * (MODULE_MAX_LINES + 1),
        "sglang/targets.py": "HookTarget('sglang.a.f', 'around', (), '', '_around_f')\n",
        "sglang/hooks.py": ("def _around_f(original):\n    from sglang.a import f, g\n"
                            "def _around_h(original, sglang_globals):\n"
                            "    return sglang_globals['get_spec'], sglang_globals.get('f')\n"
                            "HookTarget('sglang.b.g', 'call', (), '')\n"),
        "sglang/baseline_kernels.py": "from sglang.anything import x\n",  # a loader: not checked
    })
    assert triton_kernels_outside_kernels(pkg) == ["bole_cli.sglang.factors:_a", "bole_cli.sglang.factors:_b",
                                                   "bole_cli.sglang.factors:_c"]
    assert long_modules(pkg) == {"bole_cli.kernels.long": MODULE_MAX_LINES + 1,
                                 "bole_cli.sglang.plugin": MODULE_MAX_LINES + 1}
    assert kernels_launched_elsewhere(pkg) == ["bole_cli.kernels.other: launches _k"]
    table = [Row(target="sglang.a.f", use="around", function="_around_f"),
             Row(target="sglang.c.k", use="around", function="_around_k")]
    assert sorted(sglang_names_outside_the_table(table, pkg)) == sorted([
        "bole_cli.sglang.hooks: sglang.a.g is not in the table",
        "bole_cli.sglang.hooks: _around_h hooks nothing listed in the table",
        "bole_cli.sglang.hooks: SGLang's global get_spec is not in the table",
        "bole_cli.sglang.hooks: a HookTarget row outside bole_cli.sglang.targets",
        "bole_cli.sglang.targets: _around_k is not a hook in bole_cli.sglang.hooks",
    ])
