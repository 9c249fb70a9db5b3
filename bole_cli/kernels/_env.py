"""Pick Triton's interpreter on machines without CUDA, before triton is first imported.

Triton reads TRITON_INTERPRET once, at import; setting it afterwards has no effect. CI and
CPU-only users run the very same kernels on CPU tensors this way (docs/design.md §3).
"""

from __future__ import annotations

import os
import sys


def ensure_triton_backend() -> None:
    if "triton" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
