"""Import single SGLang modules without SGLang's top-level ``__init__`` (docs/design.md §6).

SGLang's ``sglang/__init__.py`` imports its whole server stack (transformers patches, the
frontend, FlashInfer, ...). Its Triton kernel modules need almost none of that, so
`isolated_sglang` registers lightweight parent packages in ``sys.modules`` (their
``__path__`` points into the real package) plus stubs for the few helpers they import
(``is_cuda``, ``get_device_sm``, ``is_arch_support_pdl``, ...). The stubs answer from torch
the way SGLang's own helpers do, so on a GPU the kernels pick the same launch configuration
as inside SGLang (e.g. BV=4 for the SM90 tree verify).

Afterwards ``sys.modules`` is restored: the stub ``sglang`` never leaks, and a later real
``import sglang`` works. torch is imported only when the stubs are built.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib
import importlib.machinery
import os
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

# SGLang's utils helpers (srt/utils and srt/utils/common provide the same ones); the last four
# are the gated RMSNorm module's (fla/layernorm_gated.py)
_UTILS = ("is_cpu", "is_npu", "is_xpu", "is_cuda", "is_hip", "get_device_sm", "is_gfx95_supported",
          "is_sm90_supported", "get_device_core_count", "torch_release",
          "cdiv", "next_power_of_2", "cpu_has_amx_support", "device_context")
# Stubbed helper modules -> the names they provide (see `_helper_functions`).
_STUB_MODULES = {
    "sglang.srt.utils": _UTILS,
    "sglang.srt.utils.common": _UTILS,
    "sglang.kernels.jit.utils": ("is_arch_support_pdl",),
    # the gated RMSNorm's module asks these of the serving stack
    "sglang.srt.batch_invariant_ops": ("is_batch_invariant_mode_enabled",),
    "sglang.srt.model_executor.cuda_graph_config": ("Backend", "Phase", "check_cuda_graph_backend"),
}


def live_sglang() -> Optional[types.ModuleType]:
    """The real ``sglang`` package when this process imported it (inside SGLang), else None;
    a Bole stub does not count."""
    real = sys.modules.get("sglang")
    if real is None or getattr(real, "__bole_stub__", False):
        return None
    return real


def _helper_functions() -> dict[str, Any]:
    """Torch-answered stand-ins for the SGLang helpers the kernel modules import."""

    import torch

    @functools.lru_cache(maxsize=1)
    def is_cuda() -> bool:
        return bool(torch.cuda.is_available() and torch.version.cuda is not None)

    @functools.lru_cache(maxsize=1)
    def is_hip() -> bool:
        return torch.version.hip is not None

    def is_cpu() -> bool:  # SGLang's is_cpu() means "the CPU engine (sgl_kernel)": never here
        return False

    def is_npu() -> bool:
        return False

    def is_xpu() -> bool:
        return False

    @functools.lru_cache(maxsize=1)
    def get_device_sm() -> int:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return major * 10 + minor
        return 0

    @functools.lru_cache(maxsize=1)
    def is_sm90_supported() -> bool:
        if not is_cuda():
            return False
        cuda = tuple(int(x) for x in torch.version.cuda.split(".")[:2])
        return get_device_sm() // 10 == 9 and cuda >= (12, 3)

    @functools.lru_cache(maxsize=1)
    def is_gfx95_supported() -> bool:
        if torch.version.hip:
            return "gfx95" in torch.cuda.get_device_properties(0).gcnArchName
        return False

    def get_device_core_count(device_id: int = 0) -> int:
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(device_id).multi_processor_count
        return 0

    @functools.lru_cache(maxsize=1)
    def is_arch_support_pdl() -> bool:
        # SGLang: not ROCm/MUSA and the CUDA arch major >= 9. Programmatic dependent
        # launch makes no sense under Triton's interpreter, so it is off there.
        if os.environ.get("TRITON_INTERPRET") == "1" or is_hip() or not is_cuda():
            return False
        return torch.cuda.get_device_capability()[0] >= 9

    def is_batch_invariant_mode_enabled() -> bool:  # SGLang's default serving mode
        return False

    class Phase(enum.Enum):
        PREFILL = "prefill"
        DECODE = "decode"

    class Backend(enum.Enum):
        FULL = "full"
        TC_PIECEWISE = "tc_piecewise"

    def check_cuda_graph_backend(phase, backend) -> bool:  # a decode under a full CUDA graph
        return False

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    def next_power_of_2(n: int) -> int:
        return 1 << (int(n) - 1).bit_length() if n > 1 else 1

    def cpu_has_amx_support() -> bool:  # the CPU engine's path: never here
        return False

    def device_context(device):
        return torch.cuda.device(device) if getattr(device, "type", None) == "cuda" else contextlib.nullcontext()

    release = tuple(int(x) for x in re.findall(r"\d+", torch.__version__.split("+")[0])[:3])
    return {
        "is_cuda": is_cuda, "is_hip": is_hip, "is_cpu": is_cpu, "is_npu": is_npu,
        "is_xpu": is_xpu, "get_device_sm": get_device_sm,
        "is_sm90_supported": is_sm90_supported, "is_gfx95_supported": is_gfx95_supported,
        "get_device_core_count": get_device_core_count,
        "is_arch_support_pdl": is_arch_support_pdl, "torch_release": release,
        "is_batch_invariant_mode_enabled": is_batch_invariant_mode_enabled, "Phase": Phase, "Backend": Backend,
        "check_cuda_graph_backend": check_cuda_graph_backend, "cdiv": cdiv, "next_power_of_2": next_power_of_2,
        "cpu_has_amx_support": cpu_has_amx_support, "device_context": device_context,
    }


def _stub_module(name: str, attrs: Mapping[str, Any], path: Optional[list[str]]) -> types.ModuleType:
    mod = types.ModuleType(name, f"Bole stand-in for {name} (standalone kernel load)")
    mod.__bole_stub__ = True
    is_pkg = path is not None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=is_pkg)
    if is_pkg:
        spec.submodule_search_locations = list(path)
        mod.__path__ = list(path)
    mod.__spec__ = spec
    mod.__package__ = name if is_pkg else name.rpartition(".")[0]
    for key, value in attrs.items():
        setattr(mod, key, value)

    def __getattr__(attr: str):  # noqa: N807 - module-level __getattr__
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AttributeError(
            f"Bole's standalone SGLang loader does not provide {name}.{attr}; the SGLang "
            "kernel module needs a helper not stubbed in bole_cli/sglang/isolation.py"
        )

    mod.__getattr__ = __getattr__
    return mod


@contextlib.contextmanager
def isolated_sglang(root: Path, module_names: tuple[str, ...]) -> Iterator[None]:
    """Install stub parent packages (folders under `root`, the directory holding
    ``sglang/``) and helpers so `module_names` and the modules they import can be
    imported alone; restore sys.modules after."""
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for key in saved:
        del sys.modules[key]
    try:
        helpers = _helper_functions()
        for name, provided in _STUB_MODULES.items():
            attrs = {k: helpers[k] for k in provided}
            is_pkg = name in ("sglang.srt.utils",)
            sys.modules[name] = _stub_module(name, attrs, [] if is_pkg else None)
        packages: set[str] = set()
        for mod_name in (*module_names, *_STUB_MODULES):
            parts = mod_name.split(".")
            for i in range(1, len(parts)):
                packages.add(".".join(parts[:i]))
        for pkg in sorted(packages, key=lambda p: p.count(".")):
            if pkg in sys.modules:
                continue
            folder = root.joinpath(*pkg.split("."))
            sys.modules[pkg] = _stub_module(pkg, {}, [str(folder)])
        for name in sorted(packages | set(_STUB_MODULES), key=lambda p: p.count(".")):
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, sys.modules[name])
        importlib.invalidate_caches()
        with warnings.catch_warnings():  # fla's utils warn "no Triton here" under the interpreter: not news
            if os.environ.get("TRITON_INTERPRET") == "1":  # as SGLang's own check above reads it
                warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
            yield
    finally:
        for key in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[key]
        sys.modules.update(saved)
