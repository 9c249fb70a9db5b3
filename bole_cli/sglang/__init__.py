"""SGLang 0.5.23 integration helpers (docs/design.md §6).

- `compat`: find SGLang's source (installed package, unpacked wheel, or wheel file) and load
  its GDN Triton verify / conv / copy-back kernels alone, without SGLang's heavy `__init__`.
- `hooks`: the data list of functions the Bole plug-in replaces, with the parameter names
  read from 0.5.23's source, and an `ast` check of them against a given SGLang source.

Nothing here imports torch, triton or sglang at module import time; the facts these
modules rely on are written down in docs/sglang-0.5.23.md.
"""

from __future__ import annotations

from bole_cli.sglang.compat import (
    SGLANG_VERSION,
    SGLangKernels,
    SGLangSource,
    find_sglang_source,
    load_sglang_kernels,
)

__all__ = [
    "SGLANG_VERSION",
    "SGLangKernels",
    "SGLangSource",
    "find_sglang_source",
    "load_sglang_kernels",
]
