"""sm_90's tf32 in Triton's interpreter, for the precision tests: experiments/tf32_emulation.py's
truncating dot patched in for the duration of a `with` block (the interpreter computes a tf32
dot in float32, so without it every precision looks exact on the CPU)."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path


@contextlib.contextmanager
def emulated_tf32():
    import triton.runtime.interpreter as interp

    path = Path(__file__).resolve().parents[1] / "experiments" / "tf32_emulation.py"
    spec = importlib.util.spec_from_file_location("tf32_emulation", path)
    emulation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(emulation)
    builder = interp.InterpreterBuilder
    plain = builder.create_dot
    builder.create_dot = emulation.truncating_dot(plain)
    try:
        yield
    finally:
        builder.create_dot = plain
