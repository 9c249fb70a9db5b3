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

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, _as_bool(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, _as_bool(mask), cache_policy)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    builder.__bole_mask_fix__ = True
    return True
