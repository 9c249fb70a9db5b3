"""Bench variants as text edits of a kernel module's source: the variant is the shipped (or
a kept) kernel plus a few (old, new) replacements, so nothing is copied and an edit that no
longer applies fails loudly instead of timing stale code."""

import importlib.util
import inspect
import os
import tempfile

_TMP = tempfile.mkdtemp(prefix="bole-variants-")


def load_variant(module, edits: list, name: str):
    """A copy of `module`'s source with (old, new) text edits applied, imported."""
    src = inspect.getsource(module)
    for old, new in edits:
        assert old in src, (name, old)
        src = src.replace(old, new)
    path = os.path.join(_TMP, f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
