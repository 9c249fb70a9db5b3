"""experiments/ scripts imported as modules by the tests (they are scripts, not a package):
one loader, registered in sys.modules while it runs (dataclasses look their module up there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def experiment_module(name: str):
    """experiments/<name>.py, freshly executed."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module
