"""Error types the CLI turns into one red line and an exit code.

InputError (exit 2) means the user gave something wrong: a file, a field, a node, a name.
BoleError (exit 1) means the input was fine but the work failed (no GPU, a failed run).
Both subclass ValueError/RuntimeError so library callers can catch them normally.
"""

from __future__ import annotations

from bole_cli.versions import SGLANG_VERSION


class BoleError(RuntimeError):
    """A runtime failure: the request was valid but could not be carried out."""

    exit_code = 1


class InputError(BoleError, ValueError):
    """Bad input from the user; the message names the field, node or argument at fault."""

    exit_code = 2


def brief(value: object, width: int = 40) -> str:
    """A bad value as a message shows it: repr cut to `width` characters, and a huge int
    by its size (its repr may be thousands of digits, or refused by Python's int limit)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, (list, tuple, dict)) and len(value) > 8:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


#: What each optional feature needs when the package's own metadata cannot say (a source
#: tree run without installing); pyproject.toml's extras are the one home of the pins.
_EXTRA_FALLBACK = {"serve": (f"sglang=={SGLANG_VERSION}",),
                   "acceptance": ("transformers>=5.24,<6", "safetensors>=0.4")}


def install_hint(extra: str) -> str:
    """`pip install "sglang==<SGLANG_VERSION>"`: what to install for an optional feature, read from
    the installed package's extras (bole-cli is on no index, so `bole-cli[serve]` would
    not resolve)."""
    from importlib import metadata

    try:
        reqs = metadata.requires("bole-cli") or []
    except metadata.PackageNotFoundError:
        reqs = []
    marker = f'extra == "{extra}"'
    pins = [r.split(";")[0].strip() for r in reqs if marker in r] or list(_EXTRA_FALLBACK[extra])
    return "pip install " + " ".join(f'"{p}"' for p in pins)
