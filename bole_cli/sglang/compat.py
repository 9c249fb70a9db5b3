"""Find SGLang 0.5.23's source and load its GDN Triton kernels alone.

SGLang's top-level ``sglang/__init__.py`` imports its whole server stack (transformers
patches, the frontend, FlashInfer, ...). Its Triton kernel modules need almost none of
that, so `load_sglang_kernels` imports them with lightweight parent packages registered in
``sys.modules`` (their ``__path__`` points into the real package) plus stubs for the few
helpers they import (``is_cuda``, ``get_device_sm``, ``is_arch_support_pdl``, ...). The
stubs answer from torch the way SGLang's own helpers do, so on a GPU the kernels pick the
same launch configuration as inside SGLang (e.g. BV=4 for the SM90 tree verify).

Afterwards ``sys.modules`` is restored: the stub ``sglang`` never leaks, and a later real
``import sglang`` works. Inside a live SGLang process (real ``sglang`` already imported)
the real modules are imported normally instead.

Where the source comes from (`find_sglang_source`), first match wins:
1. the ``wheel_or_site_dir`` argument;
2. an installed ``sglang`` (``importlib.util.find_spec``, which does not import it);
3. ``$BOLE_SGLANG_WHEEL``: a ``sglang-0.5.23-*.whl``, an unpacked wheel / site dir, or a
   folder holding the wheel;
4. the repository's git-ignored ``.whl/`` folder (``/work/main/.whl`` in development).
A wheel file is read in place for source checks; for loading, the few kernel folders are
extracted once into ``$BOLE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/bole`` or ``~/.cache/bole``).

Facts about the loaded kernels (signatures, layouts, dtypes): docs/sglang-0.5.23.md.
Nothing heavy is imported at module level.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import threading
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from bole_cli.errors import BoleError, InputError

SGLANG_VERSION = "0.5.23"
ENV_WHEEL = "BOLE_SGLANG_WHEEL"
ENV_CACHE = "BOLE_CACHE_DIR"

NOT_FOUND = (
    f"SGLang {SGLANG_VERSION} not found: pip install 'bole-cli[serve]' or set "
    f"{ENV_WHEEL}=/path/to/sglang-{SGLANG_VERSION}-*.whl (or an unpacked wheel directory)"
)

# The modules `load_sglang_kernels` imports (dotted names inside SGLang 0.5.23).
VERIFY_MODULE = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
CONV_MODULE = "sglang.kernels.ops.mamba.causal_conv1d_triton"
SCATTER_MODULE = "sglang.kernels.ops.mamba.mamba_state_scatter_triton"
GATING_MODULE = "sglang.kernels.ops.attention.linear.fused_gdn_gating"
WRAPPER_MODULE = "sglang.srt.layers.attention.linear.kernels.gdn_triton"
KERNEL_MODULES = (VERIFY_MODULE, CONV_MODULE, SCATTER_MODULE, GATING_MODULE)
# Light real modules those import whose parent package __init__ is heavy (stubbed parents).
_DEPENDENCY_MODULES = ("sglang.kernels.ops.memory.ptr_table",)

# Folders of the package a standalone load reads (extracted from a wheel file).
_EXTRACT_PREFIXES = (
    "sglang/kernels/ops/attention/linear/",
    "sglang/kernels/ops/attention/fla/",
    "sglang/kernels/ops/mamba/",
    "sglang/kernels/ops/memory/",
    "sglang/kernels/jit/utils/",
    "sglang/srt/layers/attention/linear/",
)
_EXTRACT_FILES = ("sglang/_version.py", "sglang/version.py")

# Stubbed helper modules -> the names they provide (see `_helper_functions`).
_STUB_MODULES = {
    "sglang.srt.utils": (
        "is_cpu", "is_npu", "is_xpu", "is_cuda", "is_hip", "get_device_sm",
        "is_gfx95_supported", "is_sm90_supported", "get_device_core_count", "torch_release",
    ),
    "sglang.srt.utils.common": (
        "is_cpu", "is_npu", "is_xpu", "is_cuda", "is_hip", "get_device_sm",
        "is_gfx95_supported", "is_sm90_supported", "get_device_core_count", "torch_release",
    ),
    "sglang.kernels.jit.utils": ("is_arch_support_pdl",),
}


# --------------------------------------------------------------------------- source


@dataclass(frozen=True)
class SGLangSource:
    """Where SGLang's source lives.

    kind: "installed" (site-packages, found by find_spec), "directory" (an unpacked wheel
    or any folder holding the ``sglang`` package) or "wheel" (a ``.whl`` zip file).
    path: the folder that CONTAINS ``sglang/`` (installed, directory) or the ``.whl`` file.
    version: read from ``sglang/_version.py`` / package metadata / the wheel name.
    """

    kind: str
    path: Path
    version: Optional[str]
    origin: str = ""

    def describe(self) -> str:
        where = f" ({self.origin})" if self.origin else ""
        return f"SGLang {self.version or '?'} {self.kind} at {self.path}{where}"

    def exists(self, relpath: str) -> bool:
        """Whether a file (path relative to the folder holding ``sglang/``) exists."""
        if self.kind == "wheel":
            st = self.path.stat()
            return relpath in _zip_names(str(self.path), st.st_size, st.st_mtime_ns)
        return (self.path / relpath).is_file()

    def read_text(self, relpath: str) -> str:
        """The text of e.g. ``sglang/srt/mem_cache/memory_pool.py``; no import."""
        try:
            if self.kind == "wheel":
                with zipfile.ZipFile(self.path) as zf:
                    return zf.read(relpath).decode("utf-8")
            return (self.path / relpath).read_text(encoding="utf-8")
        except (KeyError, FileNotFoundError) as exc:
            raise BoleError(f"{relpath} is missing from {self.describe()}") from exc

    def package_root(self) -> Path:
        """A folder on disk holding ``sglang/`` with the kernel modules as files.

        For a wheel file, the kernel folders are extracted once into the cache directory.
        """
        if self.kind != "wheel":
            return self.path
        return _extract_wheel(self.path)


@functools.lru_cache(maxsize=8)
def _zip_names(path: str, size: int, mtime_ns: int) -> frozenset[str]:
    with zipfile.ZipFile(path) as zf:
        return frozenset(zf.namelist())


def find_sglang_source(
    wheel_or_site_dir: Optional[os.PathLike | str] = None,
    *,
    version: Optional[str] = SGLANG_VERSION,
) -> SGLangSource:
    """Locate SGLang's source without importing it (order in the module docstring).

    ``version=None`` accepts any version. Raises InputError when an explicitly given path
    (argument or ``$BOLE_SGLANG_WHEEL``) is unusable or of the wrong version, and
    BoleError with a one-line install hint when nothing is found.
    """
    if wheel_or_site_dir is not None:
        src = _source_from_path(Path(wheel_or_site_dir).expanduser(), "argument", version)
        _check_version(src, version, explicit=True)
        return src

    rejected: list[SGLangSource] = []
    installed = _installed_source()
    if installed is not None:
        if version is None or installed.version == version:
            return installed
        rejected.append(installed)

    env = os.environ.get(ENV_WHEEL, "").strip()
    if env:
        src = _source_from_path(Path(env).expanduser(), f"${ENV_WHEEL}", version)
        _check_version(src, version, explicit=True)
        return src

    repo_whl = _repo_wheel_dir()
    if repo_whl is not None and repo_whl.is_dir():
        wheels = _wheels_in(repo_whl, version)
        if wheels:
            src = _source_from_path(wheels[0], "repository .whl/", version)
            if version is None or src.version == version:
                return src
            rejected.append(src)

    if rejected:
        found = "; ".join(s.describe() for s in rejected)
        raise BoleError(f"{NOT_FOUND} (found only: {found})")
    raise BoleError(NOT_FOUND)


def _check_version(src: SGLangSource, version: Optional[str], *, explicit: bool) -> None:
    if version is None or src.version == version:
        return
    cls = InputError if explicit else BoleError
    raise cls(
        f"{src.describe()} is not SGLang {version}; Bole's SGLang integration is pinned "
        f"to {version} (pip install 'bole-cli[serve]')"
    )


def _repo_wheel_dir() -> Optional[Path]:
    here = Path(__file__).resolve()
    # bole_cli/sglang/compat.py -> repository root (only meaningful for a source checkout).
    root = here.parents[2]
    if (root / "pyproject.toml").is_file():
        return root / ".whl"
    return None


def _installed_source() -> Optional[SGLangSource]:
    real = sys.modules.get("sglang")
    if real is not None and not getattr(real, "__bole_stub__", False):
        spec = getattr(real, "__spec__", None)
    else:
        try:
            spec = importlib.util.find_spec("sglang")
        except (ImportError, ValueError):
            spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(list(spec.submodule_search_locations)[0])
    if not (pkg / "srt").is_dir():
        return None
    version = _dir_version(pkg.parent)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("sglang")
        except Exception:  # noqa: BLE001 - metadata is optional here
            version = None
    return SGLangSource("installed", pkg.parent, version, "installed package")


def _wheel_name_version(path: Path) -> Optional[str]:
    m = re.match(r"sglang-([^-]+)-", path.name)
    return m.group(1) if m else None


def _wheels_in(folder: Path, version: Optional[str]) -> list[Path]:
    wheels = sorted(folder.glob("sglang-*.whl"))
    if version is not None:
        wheels.sort(key=lambda w: _wheel_name_version(w) != version)  # matching first
    return wheels


def _source_from_path(path: Path, origin: str, version: Optional[str]) -> SGLangSource:
    if path.is_file() and path.suffix == ".whl":
        try:
            with zipfile.ZipFile(path) as zf:
                names = set(zf.namelist())
                text = zf.read("sglang/_version.py").decode() if "sglang/_version.py" in names else None
        except zipfile.BadZipFile as exc:
            raise InputError(f"{origin}: {path} is not a valid wheel (zip) file") from exc
        if not any(n.startswith("sglang/srt/") for n in names):
            raise InputError(f"{origin}: {path} is not an SGLang wheel (no sglang/srt/ inside)")
        ver = (_version_from_text(text) if text else None) or _wheel_name_version(path)
        return SGLangSource("wheel", path.resolve(), ver, origin)
    if path.is_dir():
        if (path / "sglang" / "srt").is_dir():
            return SGLangSource("directory", path.resolve(), _dir_version(path), origin)
        if path.name == "sglang" and (path / "srt").is_dir():
            return SGLangSource("directory", path.parent.resolve(), _dir_version(path.parent), origin)
        wheels = _wheels_in(path, version)
        if wheels:
            return _source_from_path(wheels[0], origin, version)
    raise InputError(
        f"{origin}: {path} is not an SGLang wheel, an unpacked wheel / site-packages "
        "directory, or a folder holding sglang-*.whl"
    )


def _version_from_text(text: str) -> Optional[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if "__version__" in names and isinstance(node.value.value, str):
                return node.value.value
    return None


def _dir_version(root: Path) -> Optional[str]:
    vfile = root / "sglang" / "_version.py"
    if vfile.is_file():
        ver = _version_from_text(vfile.read_text(encoding="utf-8"))
        if ver:
            return ver
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _cache_base() -> Path:
    from bole_cli.paths import cache_dir

    return cache_dir()


def _extract_wheel(wheel: Path) -> Path:
    st = wheel.stat()
    tag = f"{wheel.stem}-{st.st_size}"
    for base in (_cache_base(), Path(tempfile.gettempdir()) / f"bole-{os.getuid()}"):
        dest = base / "sglang-src" / tag
        if (dest / "sglang" / ".complete").is_file():
            return dest
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
            tmp.chmod(0o755)
        except OSError:
            continue
        try:
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    if name in _EXTRACT_FILES or (
                        name.startswith(_EXTRACT_PREFIXES) and name.endswith(".py")
                    ):
                        zf.extract(name, tmp)
            (tmp / "sglang" / ".complete").write_text(str(wheel) + "\n")
            try:
                os.replace(tmp, dest)
            except OSError:  # another process won the race, or dest is stale: keep theirs
                if not (dest / "sglang" / ".complete").is_file():
                    shutil.rmtree(dest, ignore_errors=True)
                    os.replace(tmp, dest)
            return dest
        except OSError:
            continue
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    raise BoleError(f"could not extract SGLang's kernels from {wheel} (no writable cache directory)")


# --------------------------------------------------------------------------- stubs


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

    release = tuple(int(x) for x in re.findall(r"\d+", torch.__version__.split("+")[0])[:3])
    return {
        "is_cuda": is_cuda, "is_hip": is_hip, "is_cpu": is_cpu, "is_npu": is_npu,
        "is_xpu": is_xpu, "get_device_sm": get_device_sm,
        "is_sm90_supported": is_sm90_supported, "is_gfx95_supported": is_gfx95_supported,
        "get_device_core_count": get_device_core_count,
        "is_arch_support_pdl": is_arch_support_pdl, "torch_release": release,
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
            "kernel module needs a helper not stubbed in bole_cli/sglang/compat.py"
        )

    mod.__getattr__ = __getattr__
    return mod


@contextlib.contextmanager
def _isolated_sglang(root: Path, module_names: tuple[str, ...]) -> Iterator[None]:
    """Install stub parent packages / helpers for `module_names`, restore sys.modules after."""
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
        for mod_name in (*module_names, *_DEPENDENCY_MODULES, *_STUB_MODULES):
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
        yield
    finally:
        for key in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[key]
        sys.modules.update(saved)


# --------------------------------------------------------------------------- kernels


@dataclass(frozen=True)
class SGLangKernels:
    """SGLang 0.5.23's GDN verify / conv / commit kernels, loaded alone.

    Callables (signatures in docs/sglang-0.5.23.md):
    - fused_sigmoid_gating_delta_rule_update: the serial (tree) verify kernel wrapper.
    - causal_conv1d_update: conv update; with retrieve_next_token/sibling it is the tree
      conv, and it also FILLS retrieve_parent_token for the verify kernel.
    - fused_gdn_gating: g, beta from A_log, a, b, dt_bias (prefill path; [1, T, HV] fp32).
    - fused_mamba_state_scatter_with_mask / fused_conv_window_scatter_with_mask /
      scatter_mamba_states_after_mtp_verify: the accepted-snapshot copy-back (CUDA/XPU only;
      `copy_back_accepted` falls back to SGLang's torch indexing on other devices).
    - TritonGDNKernel: the wrapper class, only with ``with_wrapper=True``.
    """

    version: Optional[str]
    source: SGLangSource
    isolated: bool
    fused_sigmoid_gating_delta_rule_update: Callable[..., Any]
    causal_conv1d_update: Callable[..., Any]
    fused_gdn_gating: Callable[..., Any]
    fused_mamba_state_scatter_with_mask: Callable[..., Any]
    fused_conv_window_scatter_with_mask: Callable[..., Any]
    scatter_mamba_states_after_mtp_verify: Callable[..., Any]
    TritonGDNKernel: Optional[type] = None
    modules: Mapping[str, types.ModuleType] = field(default_factory=dict)

    def target_verify(
        self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
        intermediate_states_buffer, intermediate_state_indices, cache_steps,
        retrieve_parent_token, **_ignored,
    ):
        """Exactly what ``TritonGDNKernel.target_verify`` does in 0.5.23 (gdn_triton.py:217-257)."""
        return self.fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
            initial_state_source=ssm_states, initial_state_indices=cache_indices,
            cu_seqlens=query_start_loc, use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0, softplus_threshold=20.0, is_kda=False,
            disable_state_update=True,
            intermediate_states_buffer=intermediate_states_buffer,
            intermediate_state_indices=intermediate_state_indices,
            cache_steps=cache_steps, retrieve_parent_token=retrieve_parent_token,
        )

    def copy_back_accepted(self, dst, src, dst_indices, step_indices, src_indices=None) -> None:
        """dst[:, dst_indices[i]] = src[:, src_indices[i], step_indices[i]] for step >= 0.

        Mirrors HybridLinearAttnBackend._scatter_speculative_state_with_mask (0.5.23,
        hybrid_linear_attn_backend.py:1618-1658): the fused Triton scatter on CUDA, SGLang's
        own torch indexing elsewhere. dst [layers, slots, ...]; src [layers, rows, steps, ...];
        src_indices default to arange (scratch row = batch position).
        """
        import torch

        if dst is None or src is None or step_indices.numel() == 0:
            return
        if dst.is_cuda and src.is_cuda:
            self.fused_mamba_state_scatter_with_mask(dst, src, dst_indices, step_indices, src_indices)
            return
        device = dst.device
        dsti = dst_indices.to(device=device, dtype=torch.long)
        steps = step_indices.to(device=device, dtype=torch.long)
        srci = (
            torch.arange(steps.shape[0], device=device, dtype=torch.long)
            if src_indices is None
            else src_indices.to(device=device, dtype=torch.long)
        )
        valid = (
            (steps >= 0) & (steps < src.shape[2]) & (dsti >= 0) & (dsti < dst.shape[1])
            & (srci < src.shape[1])
        )
        rows = valid.nonzero(as_tuple=True)[0]
        if rows.numel() == 0:
            return
        dst[:, dsti[rows]] = src[:, srci[rows], steps[rows]]


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


_LOCK = threading.Lock()
_CACHE: dict[tuple, SGLangKernels] = {}


def load_sglang_kernels(
    wheel_or_site_dir: Optional[os.PathLike | str] = None,
    *,
    version: Optional[str] = SGLANG_VERSION,
    with_wrapper: bool = False,
    fix_interpreter: bool = True,
) -> SGLangKernels:
    """Load SGLang's GDN Triton kernel modules without SGLang's top-level ``__init__``.

    wheel_or_site_dir: a ``.whl``, an unpacked wheel / site-packages folder, or a folder
    holding the wheel; default: `find_sglang_source`'s search. with_wrapper: also load
    ``gdn_triton.TritonGDNKernel`` (needs einops and the fla chunk kernels importable).
    Set TRITON_INTERPRET=1 before calling to get interpreter (CPU) kernels; the result is
    cached per (source, interpreter mode). Under the interpreter, fix_interpreter applies
    `fix_triton_interpreter_masks` (process-wide) so SGLang's conv kernel can run on CPU.
    """
    real = sys.modules.get("sglang")
    live = real is not None and not getattr(real, "__bole_stub__", False)
    source = find_sglang_source(wheel_or_site_dir, version=version)
    names = KERNEL_MODULES + ((WRAPPER_MODULE,) if with_wrapper else ())
    if live and wheel_or_site_dir is None:
        root, isolated = source.path, False
    else:
        root, isolated = source.package_root(), True
    key = (str(root), isolated, with_wrapper, os.environ.get("TRITON_INTERPRET", ""))
    with _LOCK:
        if key in _CACHE:
            if fix_interpreter:
                fix_triton_interpreter_masks()
            return _CACHE[key]
        try:
            import torch  # noqa: F401 - fail here with a clear message rather than mid-import
            import triton  # noqa: F401
        except ImportError as exc:
            raise BoleError(f"loading SGLang's kernels needs torch and triton: {exc}") from exc
        if fix_interpreter:
            fix_triton_interpreter_masks()
        modules: dict[str, types.ModuleType] = {}
        current = None
        try:
            if isolated:
                with _isolated_sglang(root, names):
                    for current in names:
                        modules[current] = importlib.import_module(current)
            else:
                for current in names:
                    modules[current] = importlib.import_module(current)
        except Exception as exc:  # noqa: BLE001 - one clear line for the CLI
            raise BoleError(
                f"could not load {current} from {source.describe()}: {type(exc).__name__}: {exc}"
            ) from exc
        verify, conv, scatter, gating = (modules[n] for n in KERNEL_MODULES)
        kernels = SGLangKernels(
            version=source.version,
            source=source,
            isolated=isolated,
            fused_sigmoid_gating_delta_rule_update=verify.fused_sigmoid_gating_delta_rule_update,
            causal_conv1d_update=conv.causal_conv1d_update,
            fused_gdn_gating=gating.fused_gdn_gating,
            fused_mamba_state_scatter_with_mask=scatter.fused_mamba_state_scatter_with_mask,
            fused_conv_window_scatter_with_mask=scatter.fused_conv_window_scatter_with_mask,
            scatter_mamba_states_after_mtp_verify=scatter.scatter_mamba_states_after_mtp_verify,
            TritonGDNKernel=getattr(modules.get(WRAPPER_MODULE), "TritonGDNKernel", None),
            modules=types.MappingProxyType(modules),
        )
        _CACHE[key] = kernels
        return kernels


def sglang_parents(retrieve_parent_token, draft_token_num: Optional[int] = None):
    """SGLang's per-request parent table -> Bole's packed ``parents`` [B*T] int32.

    retrieve_parent_token [B, T] (filled by causal_conv1d_update; entry 0 is 0 = "n/a")
    -> parents with -1 for each request's node 0 (the root, child of the committed prefix)
    and the local parent index elsewhere. SGLang trees have exactly one root per request.
    """
    import torch

    rpt = retrieve_parent_token
    if draft_token_num is not None:
        rpt = rpt[:, :draft_token_num]
    parents = rpt.to(torch.int32).clone()
    parents[:, 0] = -1
    return parents.reshape(-1)


def parents_from_next_links(retrieve_next_token, retrieve_next_sibling):
    """Bole ``parents`` [B*T] int32 from SGLang's first-child / next-sibling links.

    Same rule as the tree conv kernel (causal_conv1d_triton.py:839-863): walking nodes in
    index order, node i's first child gets parent i and i's next sibling inherits i's parent.
    """
    import torch

    nxt = retrieve_next_token.to(torch.long).cpu()
    sib = retrieve_next_sibling.to(torch.long).cpu()
    bsz, t = nxt.shape
    parents = torch.zeros(bsz, t, dtype=torch.int32)
    for b in range(bsz):
        for i in range(t):
            c = int(nxt[b, i])
            if c != -1:
                parents[b, c] = i
            s = int(sib[b, i])
            if s != -1:
                parents[b, s] = parents[b, i]
        parents[b, 0] = -1
    return parents.reshape(-1).to(retrieve_next_token.device)
