"""Safe reading of the files users hand to Bole: trees, profiles, config.json, acceptance.

Every reader goes through here so a hostile or broken file fails the same way, fast, with
one line naming the file (docs/design.md §7): only regular files (a FIFO would block, a
device such as /dev/zero would fill memory), a size cap, UTF-8 text, and JSON/YAML parsed
with limits on what a small file can expand to:

- YAML aliases: PyYAML shares an anchored node between its aliases, so a "billion laughs"
  document is small in memory but exponential for anyone who walks it (or prints it).
  Aliases may add at most MAX_ALIAS_EXPANSION values; recursive aliases are refused.
- Integers longer than MAX_INT_DIGITS digits are read as floats (inf when beyond float
  range), so Python's int-to-str limit or an int-to-float OverflowError can never escape a
  validator; the validator then names the field ("log-prob inf is positive").
- Nesting deeper than MAX_DEPTH levels is refused (no RecursionError later).
- A mapping that repeats a key is refused in files written for Bole (trees, acceptance
  files, profiles; a checkpoint's own JSON is read as its tools read it): both parsers would
  keep the last value silently, so a pasted-over field would change the result with no word
  (YAML merge keys, `<<`, still merge; a key written next to them overrides the merged one,
  as YAML says).
- YAML reads 1e-3, 5E+2 and -.5 as floats, as YAML 1.2 and JSON do: PyYAML's YAML 1.1
  resolver takes only floats with a dot and a signed exponent, and the rest became strings
  ("probability '1e-3' is not a number"). Integers, 1_000, 0x10 and 1:20 read as before.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Union

from bole_cli.memory import MiB
from bole_cli.errors import InputError, brief

#: Largest file Bole reads: trees, profiles and configs are kilobytes; 32 MiB is generous.
MAX_FILE_BYTES = 32 << 20
#: Values that YAML aliases may add beyond the document's own nodes.
MAX_ALIAS_EXPANSION = 10_000
#: Integers of more digits are read as floats (int64 has 19 digits).
MAX_INT_DIGITS = 20
#: Deepest nesting of lists and mappings.
MAX_DEPTH = 64

PathLike = Union[str, "os.PathLike[str]"]


def _mib(n: int) -> str:
    return f"{n / MiB:g} MiB"


def read_bytes(path: PathLike, *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file, at most `max_bytes`; InputError names the file."""
    if str(path) == "":
        raise InputError("an empty path was given; name a file")
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not block; checked below anyway.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{path}: symbolic link loop") from None
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path}: is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else
                    "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                    "a socket" if stat.S_ISSOCK(st.st_mode) else "not a plain file")
            raise InputError(f"{path}: is {kind}, not a regular file")
        if st.st_size > max_bytes:
            raise InputError(f"{path}: is {_mib(st.st_size)}, larger than the "
                             f"{_mib(max_bytes)} limit")
        chunks, total = [], 0
        while True:  # the size may change under us (e.g. /proc files report 0)
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise InputError(f"{path}: larger than the {_mib(max_bytes)} limit")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def read_text(path: PathLike, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A regular file's UTF-8 text (see read_bytes); a binary file is one clear error."""
    data = read_bytes(path, max_bytes=max_bytes)
    if b"\x00" in data:
        raise InputError(f"{path}: is a binary file, not UTF-8 text")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (Windows editors) is not text
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None


def _check_depth(data: Any, source: str) -> None:
    stack = [(data, 1)]
    seen: set[int] = set()
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (dict, list)):
            if depth > MAX_DEPTH:
                raise InputError(f"{source}: nested deeper than {MAX_DEPTH} levels")
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            items = obj.values() if isinstance(obj, dict) else obj
            stack.extend((v, depth + 1) for v in items)


def _json_int(text: str) -> Union[int, float]:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else float(text)


def check_fields(mapping: dict, allowed: tuple, where: str = "", hint: str = "") -> None:
    """Refuse a key of a file's mapping that is not in `allowed`, naming it, `hint` or the
    nearest allowed key, and the allowed ones: a misspelt key would leave its default in
    force with no word."""
    import difflib

    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), [str(a) for a in allowed], n=1)
        hint = hint or (f" (did you mean '{close[0]}'?)" if close else "")
        raise InputError(f"{where + ': ' if where else ''}unknown field {brief(unknown[0])}{hint}; "
                         "expected " + ", ".join(allowed))


def _json_object(pairs: list) -> dict:
    """A JSON object whose keys are all different (json.loads keeps the last silently)."""
    obj: dict = {}
    for key, value in pairs:
        if key in obj:
            raise InputError(f"key {brief(key)} appears twice")
        obj[key] = value
    return obj


def parse_json(text: str, source: str, *, unique_keys: bool = True) -> Any:
    """JSON with Bole's limits (module docstring); InputError names `source`. A file another
    tool wrote and reads (a checkpoint's config.json, whose readers keep a repeated key's
    last value) passes `unique_keys=False`, so Bole reads it as they do."""
    try:
        data = json.loads(text, parse_int=_json_int, object_pairs_hook=_json_object if unique_keys else None)
    except InputError as exc:  # before ValueError, which it is
        raise InputError(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not valid JSON (invalid JSON at line {exc.lineno} "
                         f"column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply") from None
    except ValueError as exc:  # e.g. a number the float parser refuses
        raise InputError(f"{source}: not valid JSON ({str(exc)[:80]})") from None
    _check_depth(data, source)
    return data


#: YAML 1.2's floats that YAML 1.1 (PyYAML) leaves as strings: an exponent where 1.1 wants a
#: dot and a sign (1e-3, 5E+2, 1.0e3), or a signed leading dot (-.5). An exponent or a dot is
#: required, so no integer (nor '09', a string today) becomes a float.
_YAML12_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+"
                           r"|[-+]?\.[0-9]+)$")
_YAML_MERGE = "tag:yaml.org,2002:merge"


@functools.lru_cache(maxsize=None)
def _safe_loader() -> type:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it

    class BoleSafeLoader(base):  # type: ignore[misc, valid-type]
        """SafeLoader whose integers never trip int limits, whose floats are YAML 1.2's and
        whose mappings repeat no key (see the module docstring)."""

        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen: set = set()
            own = node.value if isinstance(node, yaml.MappingNode) else []  # else base says
            for key_node, _ in own:  # the node's own keys: merged ones are added later
                if key_node.tag == _YAML_MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)  # as the base does
                try:
                    if key in seen:
                        raise InputError(f"line {key_node.start_mark.line + 1}: key "
                                         f"{brief(key)} appears twice")
                    seen.add(key)
                except TypeError:  # unhashable: the base constructor says so
                    pass
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Union[int, float]:
            value = self.construct_scalar(node)
            digits = str(value).replace("_", "").lstrip("+-")
            if len(digits) > MAX_INT_DIGITS:
                try:
                    return float(str(value).replace("_", ""))
                except ValueError:
                    raise InputError(f"line {node.start_mark.line + 1}: the number "
                                     f"{str(value)[:20]}... is too long") from None
            return super().construct_yaml_int(node)

    BoleSafeLoader.add_constructor("tag:yaml.org,2002:int",
                                   BoleSafeLoader.construct_yaml_int)
    _add_yaml12_floats(BoleSafeLoader)
    return BoleSafeLoader


def _add_yaml12_floats(cls: type) -> None:
    """The YAML 1.2 float rule on a loader (read 1e-3 as a number) or a dumper (quote the
    string '5e2', which that loader would read as one), on the class's own resolver table:
    PyYAML's shared SafeLoader and SafeDumper are never changed."""
    cls.yaml_implicit_resolvers = {ch: list(rs) for ch, rs in cls.yaml_implicit_resolvers.items()}
    cls.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))


@functools.lru_cache(maxsize=None)
def _safe_dumper() -> type:
    import yaml

    base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: the same text, 2x faster

    class BoleSafeDumper(base):  # type: ignore[misc, valid-type]
        pass

    _add_yaml12_floats(BoleSafeDumper)
    return BoleSafeDumper


def dump_yaml(data: Any, **options: Any) -> str:
    """YAML text that parse_yaml reads back to `data`: safe, and a string that looks like a
    YAML 1.2 float ('5e2', an acceptance file's name) quoted. Every YAML writer uses it."""
    import yaml

    return yaml.dump(data, Dumper=_safe_dumper(), **options)


def _check_aliases(root: Any) -> None:
    """Refuse recursive aliases and aliases that expand to more than MAX_ALIAS_EXPANSION
    values beyond the document's own nodes (sizes memoised per node: linear time)."""
    import yaml

    size: dict[int, int] = {}
    on_path: set[int] = set()
    distinct = 0
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            if isinstance(node, yaml.MappingNode):
                kids = [n for pair in node.value for n in pair]
            else:
                kids = node.value
            size[key] = 1 + sum(size[id(k)] for k in kids)
            continue
        if key in size:
            continue
        if key in on_path:
            raise InputError("a YAML alias refers to itself (recursive alias)")
        distinct += 1
        if isinstance(node, yaml.ScalarNode):
            size[key] = 1
            continue
        on_path.add(key)
        stack.append((node, True))
        kids = ([n for pair in node.value for n in pair]
                if isinstance(node, yaml.MappingNode) else node.value)
        for k in kids:
            if id(k) in on_path:
                raise InputError("a YAML alias refers to itself (recursive alias)")
            stack.append((k, False))
    expanded = size[id(root)]
    if expanded - distinct > MAX_ALIAS_EXPANSION:
        raise InputError(f"YAML aliases expand to {expanded:,} values (at most "
                         f"{MAX_ALIAS_EXPANSION:,} more than written); write the values out")


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document with Bole's limits (module docstring); InputError names `source`."""
    import yaml

    loader = _safe_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_aliases(node)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        lines = str(exc).strip().splitlines()
        first = " ".join(lines[:1])[:160] or "parse error"
        if "increasing" in first and "level" in first:  # libyaml's depth limit
            raise InputError(f"{source}: nested too deeply") from None
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{source}: not valid YAML ({first}{where})") from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply") from None
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    finally:
        loader.dispose()
    _check_depth(data, source)
    return data


def load_structured(path: PathLike, *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """A JSON (by the .json suffix) or YAML (otherwise) file, read and parsed safely."""
    text = read_text(path, max_bytes=max_bytes)
    source = str(path)
    if Path(path).suffix.lower() == ".json":
        return parse_json(text, source)
    return parse_yaml(text, source)
