"""The versions Bole is pinned to, in one home: pyproject's `serve` extra and .ci/run's wheel
download name the same (tests/test_readme_ci.py checks it)."""

#: The SGLang release the plug-in, its hooks' source facts and the benches' baseline match.
SGLANG_VERSION = "0.5.23"
