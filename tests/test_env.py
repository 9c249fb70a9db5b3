"""Every BOLE_* flag is read by one rule (bole_cli/env.py): BOLE_DISABLE=off no longer
disables the plug-in while BOLE_CHAINS=off means off."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bole_cli import env


@pytest.mark.parametrize("value,want", [(None, False), ("", False), ("0", False), ("off", False), ("No", False),
                                        ("1", True), (" on ", True), ("TRUE", True), ("maybe", True)])
def test_plugin_disabled_by_the_one_rule(value, want):
    from bole_cli.sglang.plan import plugin_disabled

    assert plugin_disabled(value) is want


@pytest.mark.parametrize("value,want", [(None, True), ("", True), ("off", False), ("0", False), ("yes", True),
                                        ("2", None)])
def test_chains_by_the_one_rule(value, want):
    from bole_cli.sglang.plan import chains_enabled

    assert chains_enabled(value) is want


@pytest.mark.parametrize("value,off", [("off", True), ("0", True), ("none", True), ("false", True),
                                       ("/tmp/tables.yaml", False), ("", False)])
def test_kernel_tables_off_by_the_one_rule(value, off):
    from bole_cli.kernels.tuned_tables import tables_off

    assert tables_off(value) is off


def test_every_bole_variable_has_its_home_in_env():
    """A BOLE_* name spelled as a string outside bole_cli/env.py would be a second home."""
    root = Path(__file__).resolve().parents[1] / "bole_cli"
    name = re.compile(r"BOLE_[A-Z_]+")
    strays = [p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.name != "env.py"
              and any(isinstance(n, ast.Constant) and isinstance(n.value, str) and name.fullmatch(n.value)
                      for n in ast.walk(ast.parse(p.read_text())))]
    assert strays == [], strays
    assert env.flag("On", False) is True and env.flag("", True) is True
