"""`python -m bole_cli`: the same command line as `bole`."""

from bole_cli.cli import main

if __name__ == "__main__":
    main()
