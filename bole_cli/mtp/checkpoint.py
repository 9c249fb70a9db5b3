"""A local Hugging Face checkpoint of a Qwen3.5 / Qwen3-Next model, for `bole acceptance`.

`inspect_checkpoint` checks everything that can be checked cheaply, before any weight is
read and without torch or transformers: the directory and its config.json (a Gated-DeltaNet
hybrid of a model type transformers models here, through bole_cli.catalog's config
reader), the `mtp.*` tensors (named by model.safetensors.index.json, else read from the
safetensors headers; transformers skips them when it loads the model), and a tokenizer.
The loaders below then read the model with transformers (local files only: no hub) and the
MTP tensors with safetensors. See docs/design.md §8.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bole_cli.errors import BoleError, InputError, install_hint

#: config.json model types whose modeling code (transformers 5) and MTP layout we read.
MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
MTP_PREFIX = "mtp."
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
INDEX_FILE = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 256 << 20


@dataclass(frozen=True)
class Checkpoint:
    path: Path  # the directory
    model_type: str
    name: str
    mtp_files: dict = field(default_factory=dict)  # "mtp.*" tensor name -> file


def require_transformers() -> None:
    """BoleError (exit 1, as for every missing optional dependency: the input is fine, the
    installation lacks a part) naming what to install when transformers or safetensors is
    missing; looks the modules up without importing them."""
    missing = [m for m in ("transformers", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        raise BoleError(f"bole acceptance needs {' and '.join(missing)}: "
                        f"{install_hint('acceptance')}")


def _directory(spec: "str | Path") -> Path:
    path = Path(spec).expanduser()
    if path.name == "config.json" and path.is_file():
        path = path.parent
    if not path.exists():
        raise InputError(f"--model: {spec} not found (bole acceptance reads a local "
                         "checkpoint directory; download the model first)")
    if not path.is_dir():
        raise InputError(f"--model: {spec} is not a checkpoint directory (or its config.json)")
    if not (path / "config.json").is_file():
        raise InputError(f"--model: {path} has no config.json")
    return path


def safetensors_keys(file: Path) -> list[str]:
    """Tensor names from a safetensors header (8-byte length, then JSON): no tensor read."""
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):  # a FIFO would block open(); a device never ends
            raise InputError(f"{file}: not a regular file")
        with open(file, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise InputError(f"{file}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER_BYTES:
                raise InputError(f"{file}: not a safetensors file (header of {n} bytes)")
            header = json.loads(fh.read(n))
    except InputError:  # a ValueError too: keep its own words
        raise
    except OSError as exc:
        raise InputError(f"{file}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError):
        raise InputError(f"{file}: not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise InputError(f"{file}: not a safetensors file (bad header)")
    return [k for k in header if k != "__metadata__"]


def _mtp_files(path: Path) -> dict:
    from bole_cli.files import parse_json, read_text

    index = path / INDEX_FILE
    if index.is_file():
        data = parse_json(read_text(index), str(index), unique_keys=False)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict):
            raise InputError(f"{index}: expected a 'weight_map' object")
        found = {k: path / str(v) for k, v in weight_map.items() if k.startswith(MTP_PREFIX)}
        for file in sorted(set(found.values())):
            if not file.is_file():
                raise InputError(f"{index}: names {file.name}, which is not in {path}")
        return found
    found = {}
    for file in sorted(path.glob("*.safetensors")):
        found.update({k: file for k in safetensors_keys(file) if k.startswith(MTP_PREFIX)})
    return found


def inspect_checkpoint(spec: "str | Path") -> Checkpoint:
    """Check a checkpoint directory (module docstring); InputError names what is wrong."""
    from bole_cli.catalog.models import load_hf_config
    from bole_cli.files import parse_json, read_text

    path = _directory(spec)
    config = path / "config.json"
    model = load_hf_config(config)  # a GDN hybrid, or one line saying why not
    data = parse_json(read_text(config), str(config), unique_keys=False)
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise InputError(f"{config}: model_type {json.dumps(model_type)[:40]} is not one "
                         f"bole acceptance reads ({', '.join(MODEL_TYPES)})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"--model: {path} has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                         "copy the model's tokenizer files beside its config.json")
    mtp = _mtp_files(path)
    if not mtp:
        raise InputError(f"--model: {path} has no mtp.* weights: the checkpoint ships no "
                         "MTP layer (bole acceptance measures the model's own MTP head)")
    return Checkpoint(path=path, model_type=model_type, name=model.name, mtp_files=mtp)


def read_mtp_tensors(ckpt: Checkpoint) -> dict:
    """The `mtp.*` tensors, prefix removed (CPU tensors, as stored)."""
    from safetensors import safe_open

    tensors = {}
    by_file: dict = {}
    for key, file in ckpt.mtp_files.items():
        by_file.setdefault(file, []).append(key)
    for file, keys in sorted(by_file.items()):
        try:
            with safe_open(str(file), framework="pt") as fh:
                for key in keys:
                    tensors[key[len(MTP_PREFIX):]] = fh.get_tensor(key)
        except Exception as exc:  # noqa: BLE001 - a damaged file is the user's input
            raise InputError(f"{file}: cannot read the MTP tensors "
                             f"({type(exc).__name__}: {str(exc)[:120]})") from None
    return tensors


def load_tokenizer(ckpt: Checkpoint) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(ckpt.path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - one line naming the checkpoint
        raise InputError(f"--model: {ckpt.path}: cannot load the tokenizer "
                         f"({type(exc).__name__}: {str(exc)[:160]})") from None


def load_target(ckpt: Checkpoint, device: str, dtype: Any) -> Any:
    """The target model (transformers' own modeling code), eval mode, on `device`."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the fallback-kernel notes are not the user's problem
    hf_logging.disable_progress_bar()  # Bole shows its own progress
    try:
        model = AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=dtype,
                                                     local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:  # a bad checkpoint; bugs and OOM stay loud
        raise InputError(f"--model: {ckpt.path}: cannot load the model "
                         f"({type(exc).__name__}: {str(exc)[:160]})") from None
    return model.to(device).eval()
