"""SGLang 0.5.23: the Bole plug-in and the loaders of SGLang's own kernels (docs/design.md §6).

The plug-in, which runs inside SGLang's processes:
- `plugin`: the entry point (`activate`), who may run it (version, process role, Ray) and
  the AROUND hooks' bodies;
- `plan`: whether a pool gets Bole's factor arena, and its size;
- `pool`: the MambaPool subclass that allocates the arena instead of snapshots;
- `factors`: the arena's tensors and the kernel calls of the verify and the commit;
- `hooks`: the data list of the functions the plug-in hooks (AROUND), with the parameter
  names read from 0.5.23's source, and an `ast` check of them against a given source.

The loaders, for benchmarks and tests against SGLang's kernels:
- `source`: find SGLang's source (installed package, unpacked wheel, or wheel file) without
  importing it; unpack a wheel's kernel folders.
- `isolation`: import single SGLang modules with stub parent packages in ``sys.modules``.
- `kernels`: SGLang's GDN Triton verify / conv / copy-back kernels, loaded alone.
- `triton_interpreter`: the interpreter fix that lets SGLang's conv kernel run on CPU.

Nothing here imports torch, triton or sglang at module import time; the facts these
modules rely on are written down in docs/sglang-0.5.23.md.
"""

from __future__ import annotations

from bole_cli.sglang.baseline_kernels import SGLangKernels, load_sglang_kernels
from bole_cli.sglang.source import SGLANG_VERSION, SGLangSource, find_sglang_source

__all__ = [
    "SGLANG_VERSION",
    "SGLangKernels",
    "SGLangSource",
    "find_sglang_source",
    "load_sglang_kernels",
]
