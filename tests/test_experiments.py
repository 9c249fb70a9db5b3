"""The kept experiments stay runnable (experiments/README.md): every superseded kernel
variant is a text edit of a shipped kernel, and an edit that no longer applies (the shipped
kernel changed under it) must fail loudly here, not on the GPU machine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def _kernel_variants():
    spec = importlib.util.spec_from_file_location("kernel_variants", EXPERIMENTS / "kernel_variants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_every_variant_edit_applies_to_the_shipped_kernels():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(EXPERIMENTS / "ab_kernels.py"), "--check"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_edit_that_no_longer_applies_fails():
    variants = _kernel_variants()
    site = next(iter(variants.VARIANTS.values())).site
    with pytest.raises(ValueError, match="edit no longer applies"):
        variants.edited_source(site, [("this text is in no kernel", "")])
