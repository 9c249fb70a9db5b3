"""The metadata, skinny GEMM, attention-input, tree-masked cache attention, KV-compact,
deferred-write, split GDN decode and drafter top-k kernels and the chain kernel's two launches compile for the H200 (sm_90) here, without a
GPU, within its shared memory (tests/sm90_compile.py): the interpreter runs what the device
would refuse (a loop-carried variable that changes type)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_kernels_compile_for_sm90():
    import triton

    if not glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas*")):
        pytest.skip("this Triton install ships no ptxas")
    script = Path(__file__).with_name("sm90_compile.py")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(script.parent.parent))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok ") == 44 and "FAIL" not in run.stdout, run.stdout
