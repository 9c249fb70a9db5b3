"""Fixes to Triton's interpreter so SGLang's kernels run on CPU (docs/sglang-0.5.23.md,
"Running on CPU").

Each is process-wide (or per module) and idempotent, and does what the compiled GPU code
does; `bole_cli.sglang.baseline_kernels.load_sglang_kernels` applies them under ``TRITON_INTERPRET=1``.
triton and numpy are imported only when one applies.
"""

from __future__ import annotations

import os


def fix_triton_interpreter_masks() -> bool:
    """Make Triton's interpreter accept integer-typed load/store masks (idempotent).

    Triton 3.9's interpreter combines an int1 *scalar* with an int1 *block* (e.g.
    ``(slot < n_lines) & (idx < len)[:, None]``) into an int32/int64 numpy array, and
    its C++ load/store then fails with "ValueError: mask has unsupported dtype". SGLang's
    causal_conv1d_update kernel hits this on CPU (docs/sglang-0.5.23.md). The fix casts such masks to bool (nonzero = True), which is what the GPU does. Returns
    True when the interpreter is patched (now or before); False when not interpreting.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "__bole_mask_fix__", False):
        return True
    load, store = builder.create_masked_load, builder.create_masked_store

    def _as_bool(mask):
        if mask is not None and getattr(mask.data, "dtype", None) is not None and mask.data.dtype != np.bool_:
            return interpreter.TensorHandle(mask.data != 0, mask.dtype)
        return mask

    # the trailing arguments differ between Triton releases (3.6 passes one more): pass them on
    def create_masked_load(self, ptrs, mask, *rest):
        return load(self, ptrs, _as_bool(mask), *rest)

    def create_masked_store(self, ptrs, value, mask, *rest):
        return store(self, ptrs, value, _as_bool(mask), *rest)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    builder.__bole_mask_fix__ = True
    return True


def fix_interpreted_loop_counters(module) -> bool:
    """Give a kernel module's plain ``for t in range(n)`` loops Triton scalars, as compiled
    code has (idempotent; only under ``TRITON_INTERPRET=1``).

    The interpreter runs such a loop with Python ints, so a counter method such as
    ``t.to(tl.int64)`` (ReplaySSM's fold; docs/sglang-0.5.23.md) raises
    AttributeError on CPU. The module-level ``range`` installed here yields int32 Triton
    scalars instead; only the module's own functions see it.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if getattr(module, "__bole_range_fix__", False):
        return True
    import builtins

    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    def scalar_range(*args):
        for i in builtins.range(*(int(a) for a in args)):
            yield tl.core.tensor(interpreter.TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)

    module.range = scalar_range
    module.__bole_range_fix__ = True
    return True


def fix_interpreted_bf16_dot() -> bool:
    """Make Triton's interpreter compute ``tl.dot`` of bfloat16 operands as the GPU does
    (products accumulated in float32) instead of multiplying their raw uint16 bits
    (idempotent; only under ``TRITON_INTERPRET=1``).

    The interpreter stores bfloat16 as uint16, and its dot hands those integers to
    numpy's matmul, so every bf16 ``tl.dot`` returns garbage on CPU. SGLang's ReplaySSM
    circular ring keeps its records in the activation dtype and materialises them with
    bf16 dots (docs/sglang-0.5.23.md, "ReplaySSM"). The fix upcasts bf16 operands to
    float32 first; other dtypes are untouched. Returns True when the interpreter is
    patched (now or before).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "__bole_bf16_dot_fix__", False):
        return True
    dot = builder.create_dot

    def _upcast(x):
        if x.dtype.scalar == tl.bfloat16:
            data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return interpreter.TensorHandle(data.reshape(x.data.shape), tl.float32)
        return x

    def create_dot(self, a, b, d, *rest):
        return dot(self, _upcast(a), _upcast(b), d, *rest)

    builder.create_dot = create_dot
    builder.__bole_bf16_dot_fix__ = True
    return True


def fix_interpreted_math_aliases(module) -> bool:
    """Let a kernel module's module-level aliases of Triton's math builtins (fla's
    ``exp = tl.exp``, which SGLang's packed decode imports) run under the interpreter, as they
    compile on the GPU (idempotent; only under ``TRITON_INTERPRET=1``).

    The interpreter swaps the builtins a kernel reaches through ``tl`` for its own while a
    kernel runs, but a name bound to the builtin at import keeps the compiled-only version,
    which raises "Did you forget to add @triton.jit?". Each such alias is rebound to a plain
    function that looks the builtin up on ``tl`` when called (an interpreted kernel is plain
    Python); only the module's own functions see it.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if getattr(module, "__bole_math_fix__", False):
        return True
    import triton.language as tl

    for name in ("exp", "exp2", "log", "log2"):
        builtin = getattr(tl, name, None)
        if builtin is not None and getattr(module, name, None) is builtin:
            setattr(module, name, lambda *args, _name=name, **kwargs: getattr(tl, _name)(*args, **kwargs))
    module.__bole_math_fix__ = True
    return True


INTERPRETED_SM_COUNT = 132  # an H100's or H200's SMs: the launch the norm picks for them


def fix_interpreted_sm_count(module) -> bool:
    """Let a kernel module that sizes its launch by the GPU's SM count (the gated RMSNorm's
    ``_get_sm_count``, which asks CUDA) launch under the interpreter, with an H100's or
    H200's count (idempotent; only under ``TRITON_INTERPRET=1``). The count only sets how
    many rows a program takes; each row's arithmetic is the same."""
    if os.environ.get("TRITON_INTERPRET") != "1" or not hasattr(module, "_get_sm_count"):
        return False
    module._get_sm_count = lambda device: INTERPRETED_SM_COUNT
    return True
