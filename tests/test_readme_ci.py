"""The README's Quick start is what CI runs: exactly two command lines, the second is the
test line that .ci/run executes."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```(?:bash)?\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_quick_start_has_two_lines_install_then_run():
    lines = quick_start_lines()
    assert len(lines) == 2
    assert all(line.startswith("pip install") for line in lines)
    assert "bole calibrate" in lines[0] and "pytest" in lines[1]


def test_ci_runs_the_readme_test_line():
    script = (ROOT / ".ci" / "run").read_text()
    extracted = subprocess.run(
        ["bash", "-c", "awk '/^## Quick start/{q=1} q && /^```/{n++; next} q && n==1 && NF {print}' README.md | sed -n 2p"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert extracted == quick_start_lines()[1]
    assert 'bash -euo pipefail -c "$test_line"' in script


def test_one_sglang_pin():
    """pyproject's `serve` extra and .ci/run's wheel download pin bole_cli/versions.py's
    SGLang; a literal "0.5.23"-style pin elsewhere in bole_cli would drift."""
    from bole_cli.versions import SGLANG_VERSION

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.findall(r'"sglang==([^"]+)"', pyproject) == [SGLANG_VERSION]
    script = (ROOT / ".ci" / "run").read_text()
    assert set(re.findall(r"sglang==([0-9][\w.]*)", script)) == {SGLANG_VERSION}
    literal = re.compile(r"[\"']" + re.escape(SGLANG_VERSION) + r"[\"']")
    homes = [p.relative_to(ROOT).as_posix() for p in (ROOT / "bole_cli").rglob("*.py") if literal.search(p.read_text())]
    assert homes == ["bole_cli/versions.py"]


def test_ci_fails_without_the_sglang_wheel():
    """The equivalence tests must run in CI: a failed wheel download stops .ci/run."""
    script = (ROOT / ".ci" / "run").read_text()
    download = script[script.index("pip download"):script.index("test_line=")]
    assert "exit 1" in download and "will skip" not in download
