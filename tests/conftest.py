"""Shared pytest setup for the whole suite.

- Without CUDA, Triton kernels run under Triton's CPU interpreter: TRITON_INTERPRET=1 is
  set here, at conftest import, before any test module can import triton.
- Tests marked `@pytest.mark.gpu` or `gpu_slow` are skipped when no CUDA device is present
  (`-m gpu` fits one device call of 5 minutes; `-m "gpu or gpu_slow"` runs them all).
- `sglang_source` / `sglang_kernels`: SGLang 0.5.23's source and kernels, or a skip.
- Under pytest-xdist each worker's torch takes its share of the cores.
- bole_cli.console's consoles are made with no COLUMNS set, so each CLI call's COLUMNS holds.
- Hypothesis profiles: "default" (no deadline: the interpreter and first-call compiles
  are slow), "ci" (fewer examples, derandomised) and "thorough". Pick one with
  HYPOTHESIS_PROFILE=name; CI=true selects "ci".
"""

from __future__ import annotations

import os
import sys

import pytest

try:
    import torch

    CUDA_AVAILABLE = bool(torch.cuda.is_available())
except Exception:  # noqa: BLE001 - no torch (or a broken one) means no CUDA
    CUDA_AVAILABLE = False

# pytest-xdist (the README's test line): the cores shared out among the workers, so their
# torch threads do not oversubscribe them
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _WORKERS > 1 and not CUDA_AVAILABLE:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

if not CUDA_AVAILABLE:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        import warnings

        warnings.warn("triton was imported before tests/conftest.py could set "
                      "TRITON_INTERPRET=1; kernels may not run on CPU", stacklevel=1)
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Rich fixes a Console's width when COLUMNS is set as it is made: bole_cli.console's consoles
# made here, with none set, read each CliRunner call's COLUMNS (the 80-column tests), whichever
# test happens to import them first in a worker
os.environ.pop("COLUMNS", None)
import bole_cli.console  # noqa: E402,F401

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a test extra; tests that need it import it themselves
    settings = None

if settings is not None:
    settings.register_profile("default", deadline=None, max_examples=50)
    settings.register_profile("ci", deadline=None, max_examples=20, derandomize=True,
                              print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("thorough", deadline=None, max_examples=500)
    _profile = os.environ.get("HYPOTHESIS_PROFILE") or (
        "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "default")
    settings.load_profile(_profile)


@pytest.fixture(scope="module")
def sglang_source():
    """SGLang 0.5.23's source (an installed sglang, $BOLE_SGLANG_WHEEL or .whl/); the test
    skips, naming why, without it."""
    from bole_cli.errors import BoleError
    from bole_cli.sglang.source import SGLANG_VERSION, find_sglang_source

    try:
        return find_sglang_source()
    except BoleError as exc:
        pytest.skip(f"needs SGLang {SGLANG_VERSION} source: {exc}")


@pytest.fixture(scope="module")
def sglang_kernels(sglang_source):
    """SGLang's Triton kernels loaded from that source without its heavy __init__."""
    from bole_cli.sglang.baseline_kernels import load_sglang_kernels

    return load_sglang_kernels()


@pytest.fixture
def gpu_like_bf16_dots():
    """Under Triton's interpreter, tl.dot of bfloat16 operands multiplies their raw uint16
    bits (the interpreter stores bf16 as uint16 and hands them to numpy's matmul: outputs off
    by ~1e9), where the GPU multiplies the values and sums in float32. The interpreter-only
    fix the SGLang kernels' tests take (sglang/triton_interpreter.fix_interpreted_bf16_dot:
    the operands upcast to float32, exact for bf16; other dtypes untouched) makes it do what
    the GPU does. No kernel changes; without the interpreter (a GPU run) there is nothing to
    fix and these CPU tests skip, the GPU bf16 tests standing in for them."""
    from bole_cli.sglang.triton_interpreter import fix_interpreted_bf16_dot

    if not fix_interpreted_bf16_dot():
        pytest.skip("an interpreter test (TRITON_INTERPRET=1)")


def pytest_report_header(config: pytest.Config) -> str:
    interp = os.environ.get("TRITON_INTERPRET", "0")
    return f"bole: CUDA {'available' if CUDA_AVAILABLE else 'absent'}, TRITON_INTERPRET={interp}"


GPU_MARKERS = ("gpu", "gpu_slow")  # gpu_slow: the long GPU tests, out of `-m gpu`


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if CUDA_AVAILABLE:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if any(item.get_closest_marker(name) is not None for name in GPU_MARKERS):
            item.add_marker(skip)
