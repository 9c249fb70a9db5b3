"""sm_90's tf32 in Triton's interpreter, for the precision tests: experiments/tf32_emulation.py's
truncating dot patched in for the duration of a `with` block (the interpreter computes a tf32
dot in float32, so without it every precision looks exact on the CPU)."""

from __future__ import annotations

import contextlib

from experiment_modules import experiment_module


@contextlib.contextmanager
def emulated_tf32():
    import triton.runtime.interpreter as interp

    builder = interp.InterpreterBuilder
    plain = builder.create_dot
    builder.create_dot = experiment_module("tf32_emulation").truncating_dot(plain)
    try:
        yield
    finally:
        builder.create_dot = plain
