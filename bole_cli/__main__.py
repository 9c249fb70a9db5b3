"""`python -m bole_cli`: the same command line as `bole`."""

from bole_cli.cli import app

if __name__ == "__main__":
    app(prog_name="bole")
