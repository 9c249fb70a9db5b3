"""The prompt file of `bole acceptance`: JSON lines, one prompt per line.

Each non-blank line is a JSON object with `prompt` (a string: tokenized as is) or
`messages` (a list of {role, content}: rendered with the tokenizer's chat template, a
generation prompt added), or a bare JSON string. A bad line fails naming the file and the
line, before any model is loaded. The file's SHA-256 goes into the acceptance file's
provenance, so a measurement names the exact prompts it was made on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from bole_cli.errors import InputError

#: A prompt file larger than this is not a prompt file (the model reads a few thousand).
MAX_PROMPT_FILE_BYTES = 64 << 20

Prompt = Union[str, list]  # plain text, or chat messages


@dataclass(frozen=True)
class PromptSet:
    path: Path
    sha256: str
    prompts: tuple  # of Prompt
    lines: tuple  # the file line of each prompt (1-based), for messages


def _messages(value: Any, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: 'messages' must be a non-empty list of "
                         "{role, content} objects")
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise InputError(f"{where}: messages[{i}] must be an object with string "
                             "'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def parse_prompt_line(text: str, where: str) -> Prompt:
    """One line of the file -> a prompt; InputError names `where` (FILE:LINE)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        msg = getattr(exc, "msg", None) or type(exc).__name__
        raise InputError(f"{where}: not valid JSON ({msg})") from None
    if isinstance(data, str):
        prompt: Prompt = data
    elif isinstance(data, dict) and "messages" in data:
        prompt = _messages(data["messages"], where)
    elif isinstance(data, dict) and "prompt" in data:
        if not isinstance(data["prompt"], str):
            raise InputError(f"{where}: 'prompt' must be a string")
        prompt = data["prompt"]
    else:
        raise InputError(f"{where}: expected an object with 'prompt' (a string) or "
                         "'messages' (chat messages), or a JSON string")
    if isinstance(prompt, str) and not prompt.strip():
        raise InputError(f"{where}: the prompt is empty")
    return prompt


def read_prompts(path: "str | Path") -> PromptSet:
    """Read and check the whole file (see the module docstring)."""
    from bole_cli.files import read_bytes

    data = read_bytes(path, max_bytes=MAX_PROMPT_FILE_BYTES)
    if b"\x00" in data:
        raise InputError(f"{path}: is a binary file, not JSON lines")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    prompts, lines = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            prompts.append(parse_prompt_line(line, f"{path}:{n}"))
            lines.append(n)
    if not prompts:
        raise InputError(f"{path}: no prompts (expected JSON lines with 'prompt' or "
                         "'messages')")
    return PromptSet(Path(path), hashlib.sha256(data).hexdigest(), tuple(prompts), tuple(lines))
