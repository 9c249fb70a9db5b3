"""Sub-commands of `bole`, one module each, listed in bole_cli.cli.COMMAND_MODULES.

Each module defines `register(app)`. Keep module tops light (typer, rich, bole_cli
catalogues): torch/triton/sglang/matplotlib/optuna are imported inside the command
function so `bole --help` stays instant. A command that prints data takes `--json`; a
command that prints none names itself in a module-level `JSON_EXEMPT = {"name": "why"}`
(tests/test_cli_conventions.py checks both).
"""
