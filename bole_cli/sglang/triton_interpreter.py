"""A fix to Triton's interpreter so SGLang's conv kernel runs on CPU (docs/sglang-0.5.23.md).

Process-wide and idempotent; `bole_cli.sglang.kernels.load_sglang_kernels` applies it under
``TRITON_INTERPRET=1``. triton and numpy are imported only when it applies.
"""

from __future__ import annotations

import os


def fix_triton_interpreter_masks() -> bool:
    """Make Triton's interpreter accept integer-typed load/store masks (idempotent).

    Triton 3.9's interpreter combines an int1 *scalar* with an int1 *block* (e.g.
    ``(slot < n_lines) & (idx < len)[:, None]``) into an int32/int64 numpy array, and
    its C++ load/store then fails with "ValueError: mask has unsupported dtype". SGLang's
    causal_conv1d_update kernel (causal_conv1d_triton.py:752-757) hits this on CPU. The
    fix casts such masks to bool (nonzero = True), which is what the GPU does. Returns
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
    ``t.to(tl.int64)`` (ReplaySSM's fold, gdn_replayssm_spec_fold.py:105) raises
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
