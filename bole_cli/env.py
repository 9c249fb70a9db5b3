"""Every BOLE_* environment variable, and the one rule that reads a flag (docs/design.md §7).

A flag is on for 1, true, yes, on and off for 0, false, no, off (any case, spaces ignored);
unset or empty is the flag's default, and any other value is none of these (`flag` returns
None) so that the reader can name it: the plug-in refuses chains for a BOLE_CHAINS it cannot
read, and stays out for a BOLE_DISABLE it cannot read (the safe side).
"""

from __future__ import annotations

from typing import Optional

DISABLE = "BOLE_DISABLE"  # the SGLang plug-in stays out (SGLang runs unchanged)
CHAINS = "BOLE_CHAINS"  # off: top-k 1 (chain) verifies keep SGLang's path
VERIFY_PRECISION = "BOLE_VERIFY_PRECISION"  # the plug-in's verify dots (limits.PLUGIN_VERIFY_PRECISIONS)
CACHE_DIR = "BOLE_CACHE_DIR"  # profiles, results and SGLang's unpacked wheel (bole_cli/paths.py)
SGLANG_WHEEL = "BOLE_SGLANG_WHEEL"  # SGLang's wheel for the benches and equivalence tests
KERNEL_TABLES = "BOLE_KERNEL_TABLES"  # tuned kernel tables to read, or off

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def flag(value: Optional[str], default: bool) -> Optional[bool]:
    """A flag's value by the one rule above: `default` when unset or empty, None when unreadable."""
    key = (value or "").strip().lower()
    if not key:
        return default
    return True if key in ON else False if key in OFF else None
