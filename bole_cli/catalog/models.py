"""The hybrid-attention model catalogue: Qwen3.5 family and Qwen3-Next (docs/design.md §1).

A ModelSpec holds only architecture shapes; every byte count (state, snapshots, factors,
KV per token) is derived from it, never hard-coded per model, with bole_cli.memory's
arithmetic.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from bole_cli.errors import InputError


@dataclass(frozen=True)
class ModelSpec:
    name: str  # canonical Hugging Face id
    layers: int
    hidden: int
    attn_heads: int  # full-attention query heads
    attn_kv_heads: int
    gdn_value_heads: int  # HV
    vocab: int
    ffn: int = 0  # dense MLP intermediate size (0 for MoE)
    experts: int = 0
    experts_top_k: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0
    tied_embeddings: bool = False
    gdn_key_heads: int = 16  # H
    gdn_key_dim: int = 128  # dk
    gdn_value_dim: int = 128  # dv
    conv_kernel: int = 4
    attn_head_dim: int = 256
    full_attention_interval: int = 4  # 0 = irregular (then full_attention_layers is given)
    # Explicit full-attention layer ids (from a config's layer_types); None = use the
    # interval. An empty tuple means "no full-attention layer at all".
    full_attention_layers: Optional[tuple[int, ...]] = None
    mtp_layers: int = 1
    aliases: tuple[str, ...] = field(default=(), compare=False)
    source: str = field(default="catalogue", compare=False)  # "catalogue" or a config path

    def __post_init__(self) -> None:
        if self.full_attention_layers is None and self.full_attention_interval <= 0:
            raise ValueError(f"{self.name}: full_attention_interval must be > 0 "
                             "when full_attention_layers is not given")
        if self.full_attention_layers is not None:
            object.__setattr__(self, "full_attention_layers",
                               tuple(int(i) for i in self.full_attention_layers))

    # ---- layer structure -------------------------------------------------------------
    @property
    def short_name(self) -> str:
        """The name without the organisation prefix ("Qwen3.5-9B")."""
        return self.name.rsplit("/", 1)[-1]

    @property
    def attention_layer_ids(self) -> tuple[int, ...]:
        if self.full_attention_layers is not None:
            return self.full_attention_layers
        k = self.full_attention_interval
        return tuple(i for i in range(self.layers) if (i + 1) % k == 0)

    @property
    def n_attention_layers(self) -> int:
        return len(self.attention_layer_ids)

    @property
    def n_gdn_layers(self) -> int:
        return self.layers - self.n_attention_layers

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def gqa_group(self) -> int:
        """GDN value heads per key head (value head hv reads key head hv // gqa_group)."""
        return self.gdn_value_heads // self.gdn_key_heads

    @property
    def attn_group(self) -> int:
        """Full-attention query heads per KV head: a query token's rows a (request, KV head)."""
        return self.attn_heads // self.attn_kv_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv: q|k|v."""
        return 2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim

    # ---- bytes -----------------------------------------------------------------------
    def gdn_state_bytes_per_layer(self, state_bytes: int = 4) -> int:
        """One request's recurrent state in one GDN layer: HV * dk * dv elements."""
        from bole_cli.memory import state_snapshot_bytes

        return state_snapshot_bytes(self.gdn_value_heads, self.gdn_value_dim, self.gdn_key_dim,
                                    state_bytes)

    def gdn_state_bytes(self, state_bytes: int = 4) -> int:
        """One request's recurrent state over all GDN layers."""
        return self.n_gdn_layers * self.gdn_state_bytes_per_layer(state_bytes)

    def conv_state_bytes(self, elem_bytes: int = 2) -> int:
        """One request's conv window (kernel-1 inputs per channel) over all GDN layers."""
        from bole_cli.memory import conv_window_bytes

        return self.n_gdn_layers * conv_window_bytes(self.conv_dim, self.conv_kernel - 1, elem_bytes)

    def snapshot_bytes_per_node(self, state_bytes: int = 4) -> int:
        """Per draft node, all GDN layers: one full state snapshot (SGLang's verifier)."""
        return self.gdn_state_bytes(state_bytes)

    def factor_bytes_per_node(self) -> int:
        """Per draft node, all GDN layers: Bole's factors (k, u, log_p)."""
        from bole_cli.memory import factor_bytes_per_node_layer

        return self.n_gdn_layers * factor_bytes_per_node_layer(self)

    def snapshot_factor_ratio(self) -> float:
        """How many times smaller the per-node factors are than a per-node snapshot."""
        from bole_cli.memory import factor_ratio

        return factor_ratio(self)

    def kv_bytes_per_token(self, elem_bytes: int = 2) -> int:
        """KV cache bytes one token costs across all full-attention layers."""
        return self.n_attention_layers * 2 * self.attn_kv_heads * self.attn_head_dim * elem_bytes

    def ffn_description(self) -> str:
        if self.is_moe:
            shared = f", shared {self.shared_expert_ffn}" if self.shared_expert_ffn else ""
            return f"MoE {self.experts}x{self.expert_ffn} top-{self.experts_top_k}{shared}"
        return f"{self.ffn}" + (" (tied emb.)" if self.tied_embeddings else "")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["aliases"] = list(self.aliases)
        d["full_attention_layers"] = list(self.attention_layer_ids)
        return d

    def derived(self) -> dict[str, Any]:
        """Every derived count and byte figure (fp32 state, bf16 conv/KV), stable keys."""
        return {
            "n_gdn_layers": self.n_gdn_layers,
            "n_attention_layers": self.n_attention_layers,
            "gqa_group": self.gqa_group,
            "conv_dim": self.conv_dim,
            "gdn_state_bytes_per_layer": self.gdn_state_bytes_per_layer(),
            "gdn_state_bytes": self.gdn_state_bytes(),
            "conv_state_bytes": self.conv_state_bytes(),
            "snapshot_bytes_per_node": self.snapshot_bytes_per_node(),
            "factor_bytes_per_node": self.factor_bytes_per_node(),
            "snapshot_factor_ratio": round(self.snapshot_factor_ratio(), 2),
            "kv_bytes_per_token": self.kv_bytes_per_token(),
        }


_QWEN35_VOCAB = 248320
_QWEN3_NEXT_VOCAB = 151936

CATALOGUE: tuple[ModelSpec, ...] = (
    ModelSpec("Qwen/Qwen3.5-0.8B", 24, 1024, 8, 2, 16, _QWEN35_VOCAB, ffn=3584,
              tied_embeddings=True, aliases=("0.8b",)),
    ModelSpec("Qwen/Qwen3.5-2B", 24, 2048, 8, 2, 16, _QWEN35_VOCAB, ffn=6144,
              tied_embeddings=True, aliases=("2b",)),
    ModelSpec("Qwen/Qwen3.5-4B", 32, 2560, 16, 4, 32, _QWEN35_VOCAB, ffn=9216,
              tied_embeddings=True, aliases=("4b",)),
    ModelSpec("Qwen/Qwen3.5-9B", 32, 4096, 16, 4, 32, _QWEN35_VOCAB, ffn=12288, aliases=("9b",)),
    ModelSpec("Qwen/Qwen3.5-27B", 64, 5120, 24, 4, 48, _QWEN35_VOCAB, ffn=17408, aliases=("27b",)),
    ModelSpec("Qwen/Qwen3.5-35B-A3B", 40, 2048, 16, 2, 32, _QWEN35_VOCAB, experts=256,
              experts_top_k=8, expert_ffn=512, shared_expert_ffn=512, aliases=("35b", "35b-a3b")),
    ModelSpec("Qwen/Qwen3.5-122B-A10B", 48, 3072, 32, 2, 64, _QWEN35_VOCAB, experts=256,
              experts_top_k=8, expert_ffn=1024, shared_expert_ffn=1024,
              aliases=("122b", "122b-a10b")),
    ModelSpec("Qwen/Qwen3.5-397B-A17B", 60, 4096, 32, 2, 64, _QWEN35_VOCAB, experts=512,
              experts_top_k=10, expert_ffn=1024, aliases=("397b", "397b-a17b")),
    ModelSpec("Qwen/Qwen3-Next-80B-A3B", 48, 2048, 16, 2, 32, _QWEN3_NEXT_VOCAB, experts=512,
              experts_top_k=10, expert_ffn=512, shared_expert_ffn=512,
              aliases=("80b", "next-80b", "qwen3-next")),
)


def tiny_spec(*, moe: bool = False, **overrides) -> ModelSpec:
    """A small hybrid model for CPU tests: 8 layers (6 GDN + 2 attention), hidden 64,
    H=2, HV=4, dk=dv=16, attention 4/2 heads of 16, vocab 128."""
    kw = dict(name="tiny/hybrid-moe" if moe else "tiny/hybrid", layers=8, hidden=64,
              attn_heads=4, attn_kv_heads=2, gdn_value_heads=4, vocab=128, gdn_key_heads=2,
              gdn_key_dim=16, gdn_value_dim=16, attn_head_dim=16)
    if moe:
        kw.update(experts=8, experts_top_k=2, expert_ffn=32, shared_expert_ffn=32)
    else:
        kw.update(ffn=128)
    kw.update(overrides)
    return ModelSpec(**kw)


# ---- name resolution -------------------------------------------------------------------

def _norm(name: str) -> str:
    return name.strip().lower()


def _index() -> dict[str, ModelSpec]:
    idx: dict[str, ModelSpec] = {}
    for spec in CATALOGUE:
        for key in (spec.name, spec.short_name, *spec.aliases):
            idx[_norm(key)] = spec
    return idx


_INDEX = _index()


def resolve_model(name_or_path: "str | os.PathLike[str]") -> ModelSpec:
    """A catalogue model by name or alias (case-insensitive: ``9b``, ``qwen3.5-9b``,
    ``Qwen/Qwen3.5-9B``), else a user's model from a Hugging Face ``config.json`` (or a
    directory holding one). Catalogue names win over same-named local paths.

    Raises InputError listing the known names when neither matches.
    """
    text = os.fspath(name_or_path)
    spec = _INDEX.get(_norm(text))
    if spec is not None:
        return spec
    path = Path(text).expanduser()
    try:
        exists = bool(text.strip()) and path.exists()
    except OSError:  # e.g. a name too long for the file system: not a path then
        exists = False
    if exists:
        return load_hf_config(path)
    from bole_cli.errors import brief

    if text.endswith(".json") or text.startswith((".", "/", "~")):
        raise InputError(f"model config not found: {brief(text, 200)}")
    aliases = ", ".join(s.aliases[0] for s in CATALOGUE)  # the shortest names; `bole models` has the rest
    raise InputError(f"unknown model {brief(text)}; known: {aliases} (`bole models`), "
                     "or a Hugging Face config.json")


# ---- Hugging Face config.json ----------------------------------------------------------

_LAYER_TYPES = {"linear_attention", "full_attention"}
#: Sanity caps on config.json integers: real models are far below them, and a typo such
#: as 10**18 layers must fail at once rather than hang the per-layer loops.
MAX_MODEL_LAYERS = 4096
MAX_CONFIG_INT = 1 << 32
#: Fields only a Gated-DeltaNet hybrid config has.
_GDN_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
               "linear_value_head_dim")


def _check_hybrid(f: "_Fields", file: Path) -> None:
    """A config without any Gated DeltaNet field is another architecture: say so, rather
    than name the first missing linear_* field."""
    found, types, _ = f._lookup("layer_types")
    if any(f.has(k) for k in _GDN_FIELDS):
        return
    if found and isinstance(types, list) and "linear_attention" in types:
        return
    kind = f.top.get("model_type")
    # shown only when short and printable: an ESC in a downloaded config must not reach the terminal
    what = f" ({kind})" if isinstance(kind, str) and len(kind) < 40 and kind.isprintable() else ""
    raise InputError(f"{file}: not a hybrid GDN model{what}: it has no Gated DeltaNet "
                     "(linear_attention) layers")


class _Fields:
    """Typed, named access to a config dict; text_config fields win over top-level ones."""

    def __init__(self, data: dict, path: Path) -> None:
        self.path = path
        text = data.get("text_config")
        if text is not None and not isinstance(text, dict):
            raise InputError(f"{path}: field 'text_config' must be an object, "
                             f"got {type(text).__name__}")
        self.text: dict = text or {}
        self.top = data

    def _lookup(self, key: str) -> tuple[bool, Any, str]:
        if key in self.text:
            return True, self.text[key], f"text_config.{key}"
        if key in self.top:
            return True, self.top[key], key
        return False, None, (f"text_config.{key}" if self.text else key)

    def has(self, key: str) -> bool:
        found, value, _ = self._lookup(key)
        return found and value is not None

    def get_int(self, key: str, default: Optional[int] = None, *, minimum: int = 1,
                maximum: int = MAX_CONFIG_INT) -> int:
        found, value, where = self._lookup(key)
        if not found or value is None:
            if default is None:
                raise InputError(f"{self.path}: missing required field '{where}'")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{self.path}: field '{where}' must be an integer, "
                             f"got {_shown_json(value)}")
        if value < minimum:
            raise InputError(f"{self.path}: field '{where}' must be >= {minimum}, got {value}")
        if value > maximum:
            raise InputError(f"{self.path}: field '{where}' is {value}, more than "
                             f"{maximum:,}; is the config right?")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        found, value, where = self._lookup(key)
        if not found or value is None:
            return default
        if not isinstance(value, bool):
            raise InputError(f"{self.path}: field '{where}' must be true or false, "
                             f"got {_shown_json(value)}")
        return value

    def layer_types(self, n_layers: int) -> Optional[tuple[int, ...]]:
        found, value, where = self._lookup("layer_types")
        if not found or value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{self.path}: field '{where}' must be a list of strings")
        bad = sorted({v for v in value if v not in _LAYER_TYPES})
        if bad:
            raise InputError(f"{self.path}: field '{where}' has unknown layer type(s) "
                             f"{', '.join(map(repr, bad))}; expected 'linear_attention' "
                             "or 'full_attention'")
        if len(value) != n_layers:
            raise InputError(f"{self.path}: field '{where}' lists {len(value)} layers "
                             f"but num_hidden_layers is {n_layers}")
        return tuple(i for i, v in enumerate(value) if v == "full_attention")


def _shown_json(value: object) -> str:
    """A config value for an error: as JSON, but an integer too long to read (files.py reads
    one as a float, inf past the float range) said so, not as 'Infinity'."""
    import math

    from bole_cli.files import MAX_INT_DIGITS

    if isinstance(value, float) and math.isinf(value):
        return f"a number too large (over {MAX_INT_DIGITS} digits)"
    return json.dumps(value)


def _config_file(path: Path) -> Path:
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(f"model config not found: {path}")
    return path


def _regular_interval(ids: tuple[int, ...], n_layers: int) -> int:
    """The interval k whose pattern (layers k-1, 2k-1, ...) gives ids, else 0."""
    if not ids:
        return 0
    k = ids[0] + 1
    pattern = tuple(i for i in range(n_layers) if (i + 1) % k == 0)
    return k if pattern == ids else 0


def load_hf_config(path: "str | os.PathLike[str]") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (or a directory holding one).

    Reads Qwen3-Next style flat configs and Qwen3.5 multimodal configs whose language
    model fields sit under ``text_config`` (those win; top-level values fill the gaps,
    e.g. ``tie_word_embeddings``). A missing or wrong-typed required field raises
    InputError naming the field and the file.
    """
    from bole_cli.files import parse_json, read_text

    file = _config_file(Path(path).expanduser())
    data = parse_json(read_text(file), str(file), unique_keys=False)
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected a JSON object, got {type(data).__name__}")
    f = _Fields(data, file)

    layers = f.get_int("num_hidden_layers", maximum=MAX_MODEL_LAYERS)
    _check_hybrid(f, file)
    hidden = f.get_int("hidden_size")
    attn_heads = f.get_int("num_attention_heads")
    kv_heads = f.get_int("num_key_value_heads")
    if not f.has("head_dim") and hidden < attn_heads:
        raise InputError(f"{file}: field 'hidden_size' ({hidden}) is below "
                         f"'num_attention_heads' ({attn_heads}), so head_dim would be 0; "
                         "give 'head_dim'")
    head_dim = f.get_int("head_dim", default=hidden // attn_heads)
    key_heads = f.get_int("linear_num_key_heads")
    value_heads = f.get_int("linear_num_value_heads")
    key_dim = f.get_int("linear_key_head_dim")
    value_dim = f.get_int("linear_value_head_dim")
    conv_kernel = f.get_int("linear_conv_kernel_dim", default=4)
    vocab = f.get_int("vocab_size")
    tied = f.get_bool("tie_word_embeddings", default=False)
    mtp = f.get_int("mtp_num_hidden_layers", default=0, minimum=0)

    full_ids = f.layer_types(layers)
    if full_ids is None:
        if not f.has("full_attention_interval"):
            raise InputError(f"{file}: missing required field 'layer_types' "
                             "(or 'full_attention_interval')")
        interval = f.get_int("full_attention_interval")
    else:
        interval = _regular_interval(full_ids, layers)
    if (len(full_ids) if full_ids is not None else layers // interval) >= layers:
        raise InputError(f"{file}: not a hybrid GDN model (every one of its {layers} layers "
                         "is full attention; Bole needs Gated DeltaNet layers)")

    experts = f.get_int("num_experts", default=0, minimum=0)
    if experts:
        moe = dict(experts=experts, experts_top_k=f.get_int("num_experts_per_tok"),
                   expert_ffn=f.get_int("moe_intermediate_size"),
                   shared_expert_ffn=f.get_int("shared_expert_intermediate_size", default=0,
                                           minimum=0))
        if moe["experts_top_k"] > experts:
            raise InputError(f"{file}: field 'num_experts_per_tok' ({moe['experts_top_k']}) "
                             f"exceeds 'num_experts' ({experts})")
        ffn = 0
    else:
        moe = {}
        ffn = f.get_int("intermediate_size")

    if value_heads % key_heads:
        raise InputError(f"{file}: field 'linear_num_value_heads' ({value_heads}) must be a "
                         f"multiple of 'linear_num_key_heads' ({key_heads})")
    if attn_heads % kv_heads:
        raise InputError(f"{file}: field 'num_attention_heads' ({attn_heads}) must be a "
                         f"multiple of 'num_key_value_heads' ({kv_heads})")

    name = data.get("_name_or_path")
    if not isinstance(name, str) or not name.strip():
        name = file.parent.name if file.name == "config.json" and file.parent.name else file.stem
    return ModelSpec(
        name=name, layers=layers, hidden=hidden, attn_heads=attn_heads,
        attn_kv_heads=kv_heads, gdn_value_heads=value_heads, vocab=vocab, ffn=ffn,
        tied_embeddings=tied, gdn_key_heads=key_heads, gdn_key_dim=key_dim,
        gdn_value_dim=value_dim, conv_kernel=conv_kernel, attn_head_dim=head_dim,
        full_attention_interval=interval, full_attention_layers=full_ids, mtp_layers=mtp,
        source=str(file), **moe,
    )
