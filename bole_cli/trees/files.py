"""Tree files (docs/design.md §4): Bole's parents/log-probs format and SGLang's arrays.

JSON by suffix, YAML otherwise; one tree (a mapping) or a batch (a list). Errors name the
file, the tree or request, and the node or field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence, Union

from bole_cli.errors import InputError
from bole_cli.files import check_fields
from bole_cli.limits import MAX_BATCH_REQUESTS
from bole_cli.trees.sglang_links import from_sglang
from bole_cli.trees.tree import ProposalTree
from bole_cli.trees.values import as_list


#: Trees one file may hold (a batch): far above any server's running requests.
MAX_BATCH_TREES = MAX_BATCH_REQUESTS
_TREE_KEYS = ("parents", "probs", "log_probs", "tokens")
_SGLANG_KEYS = ("retrive_next_token", "retrive_next_sibling", "probs", "log_probs",
                "tokens", "draft_token")


def _tree_from_mapping(d: Any) -> ProposalTree:
    if not isinstance(d, dict):
        raise InputError(f"a tree must be a mapping with 'parents', got {type(d).__name__}")
    check_fields(d, _TREE_KEYS, hint=" (SGLang arrays? use --sglang)" if "retrive_next_token" in d else "")
    if "parents" not in d:
        raise InputError("missing field 'parents'")
    has_p, has_lp = "probs" in d, "log_probs" in d
    if has_p and has_lp:
        raise InputError("give either 'probs' or 'log_probs', not both")
    if not (has_p or has_lp):
        raise InputError("missing field 'probs' or 'log_probs'")
    parents = as_list(d["parents"], "parents")
    tokens = d.get("tokens")
    if has_p:
        probs = as_list(d["probs"], "probs")
        if len(probs) != len(parents):
            raise InputError(f"'probs' has {len(probs)} entries but 'parents' has {len(parents)}")
        return ProposalTree.from_probs(parents, probs, tokens)
    return ProposalTree(parents, d["log_probs"], tokens)


def _prefixed(label: str, fn, *args):
    try:
        return fn(*args)
    except InputError as exc:
        raise InputError(f"{label}: {exc}") from None


def parse_trees(data: Any, source: str = "input") -> list[ProposalTree]:
    """Trees from parsed JSON/YAML: one mapping (one tree) or a list (a batch).
    Errors name the source, the tree (for a batch) and the node or field."""
    if isinstance(data, dict):
        return [_prefixed(source, _tree_from_mapping, data)]
    if isinstance(data, list):
        if not data:
            raise InputError(f"{source}: the list of trees is empty")
        if len(data) > MAX_BATCH_TREES:
            raise InputError(f"{source}: {len(data)} trees; at most {MAX_BATCH_TREES} in a batch")
        return [_prefixed(f"{source}: tree {b}", _tree_from_mapping, d)
                for b, d in enumerate(data)]
    got = "an empty file" if data is None else type(data).__name__
    raise InputError(f"{source}: expected a tree (mapping) or a list of trees, got {got}")


def _read_structured(path: Union[str, os.PathLike]) -> Any:
    from bole_cli.files import load_structured

    return load_structured(path)


def load_trees(path: Union[str, os.PathLike]) -> list[ProposalTree]:
    """Read a tree file (JSON by suffix, YAML otherwise): one tree or a list of trees."""
    return parse_trees(_read_structured(path), str(path))


def _sglang_from_mapping(d: Any) -> list[ProposalTree]:
    if not isinstance(d, dict):
        raise InputError(f"expected a mapping with 'retrive_next_token', got {type(d).__name__}")
    check_fields(d, _SGLANG_KEYS)
    for k in ("retrive_next_token", "retrive_next_sibling"):
        if k not in d:
            raise InputError(f"missing field '{k}'")
    if "probs" in d and "log_probs" in d:
        raise InputError("give either 'probs' or 'log_probs', not both")
    if "probs" not in d and "log_probs" not in d:
        raise InputError("missing field 'probs' or 'log_probs' (draft probabilities)")
    if "tokens" in d and "draft_token" in d:
        raise InputError("give either 'tokens' or 'draft_token', not both")
    nt = as_list(d["retrive_next_token"], "retrive_next_token")
    batched = bool(nt) and isinstance(nt[0], (list, tuple))

    def rows(key: str) -> list:
        v = d.get(key)
        if v is None:
            return [None] * len(nt)
        v = as_list(v, key)
        if len(v) != len(nt):
            raise InputError(f"'{key}' has {len(v)} rows but 'retrive_next_token' has {len(nt)}")
        return v

    tok_key = "draft_token" if "draft_token" in d else "tokens"
    if not batched:
        return [_from_sglang_kw(nt, d["retrive_next_sibling"], d.get("log_probs"),
                                d.get("probs"), d.get(tok_key))]
    ns, lp, pr, tk = (rows("retrive_next_sibling"), rows("log_probs"), rows("probs"),
                      rows(tok_key))
    return [_prefixed(f"request {b}", _from_sglang_kw, nt[b], ns[b], lp[b], pr[b], tk[b])
            for b in range(len(nt))]


def _from_sglang_kw(nt: Any, ns: Any, lp: Any, pr: Any, tk: Any) -> ProposalTree:
    return from_sglang(nt, ns, lp, probs=pr, tokens=tk)


def load_sglang(path: Union[str, os.PathLike]) -> list[ProposalTree]:
    """Read SGLang arrays (retrive_next_token / retrive_next_sibling plus draft probs or
    log-probs, optional tokens or draft_token): one request's 1-D arrays, [bs, n] 2-D
    arrays, or a list of one-request mappings."""
    data = _read_structured(path)
    source = str(path)
    if isinstance(data, list):
        if not data:
            raise InputError(f"{source}: the list of requests is empty")
        if len(data) > MAX_BATCH_TREES:
            raise InputError(f"{source}: {len(data)} requests; at most {MAX_BATCH_TREES}")
        out: list[ProposalTree] = []
        for b, d in enumerate(data):
            out.extend(_prefixed(f"{source}: request {b}", _sglang_from_mapping, d))
        return out
    return _prefixed(source, _sglang_from_mapping, data)


def dump_trees(path: Union[str, os.PathLike], trees: Union[ProposalTree, Sequence[ProposalTree]],
               *, use_probs: bool = False) -> Path:
    """Write trees atomically in load_trees' format: JSON for .json, else YAML. A single
    tree is written as a mapping, a sequence as a list. Log-probs (the default) round-trip
    exactly; probs are friendlier to read."""
    from bole_cli.console import atomic_write_text, dumps_json

    data: Any
    if isinstance(trees, ProposalTree):
        data = trees.to_dict(use_probs)
    else:
        data = [t.to_dict(use_probs) for t in trees]
    path = Path(path)
    if path.suffix.lower() == ".json":
        text = dumps_json(data) + "\n"
    else:
        from bole_cli.files import dump_yaml

        text = dump_yaml(data, sort_keys=False, default_flow_style=None, width=100)
    return atomic_write_text(path, text)

