"""Find SGLang 0.5.23's source without importing it, and unpack a wheel's kernel folders.

Where the source comes from (`find_sglang_source`), first match wins:
1. the ``wheel_or_site_dir`` argument;
2. an installed ``sglang`` (``importlib.util.find_spec``, which does not import it);
3. ``$BOLE_SGLANG_WHEEL``: a ``sglang-0.5.23-*.whl``, an unpacked wheel / site dir, or a
   folder holding the wheel;
4. the repository's git-ignored ``.whl/`` folder (``/work/main/.whl`` in development).
A wheel file is read in place for source checks; for loading, the few kernel folders are
extracted once into ``$BOLE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/bole`` or ``~/.cache/bole``).

Why Bole reads SGLang's source at all: docs/design.md §6; the facts read: docs/sglang-0.5.23.md.
Nothing heavy is imported here.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bole_cli import env
from bole_cli.errors import BoleError, InputError
from bole_cli.sglang.isolation import live_sglang
from bole_cli.versions import SGLANG_VERSION

ENV_WHEEL = env.SGLANG_WHEEL

NOT_FOUND = (
    f"SGLang {SGLANG_VERSION} not found: pip install \"sglang=={SGLANG_VERSION}\" or set "
    f"{ENV_WHEEL}=/path/to/sglang-{SGLANG_VERSION}-*.whl (or an unpacked wheel directory)"
)

# Folders of the package a standalone kernel load reads (extracted from a wheel file); a
# kernel module outside them (bole_cli/sglang/baseline_kernels.py) adds its folder here.
_EXTRACT_PREFIXES = (
    "sglang/kernels/ops/attention/linear/",
    "sglang/kernels/ops/attention/fla/",
    "sglang/kernels/ops/mamba/",
    "sglang/kernels/ops/memory/",
    "sglang/kernels/jit/utils/",
    "sglang/srt/layers/attention/linear/",
)
_EXTRACT_FILES = ("sglang/_version.py", "sglang/version.py")


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
        f"to {version} (pip install \"sglang=={version}\")"
    )


def _repo_wheel_dir() -> Optional[Path]:
    here = Path(__file__).resolve()
    # bole_cli/sglang/source.py -> repository root (only meaningful for a source checkout).
    root = here.parents[2]
    if (root / "pyproject.toml").is_file():
        return root / ".whl"
    return None


def _installed_source() -> Optional[SGLangSource]:
    real = live_sglang()
    if real is not None:
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

