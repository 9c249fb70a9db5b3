"""`bole bench e2e`'s options, checked before any model is built: the defaults (full run and
a --tiny smoke run), the lists, the tree shapes, the device (docs/design.md §8).

Light (no torch at import): the command calls `check_options` first, so a typo fails in
milliseconds, and builds its E2EConfig from the result.
"""

from __future__ import annotations

from typing import Any, Optional

from bole_cli.errors import InputError, brief
from bole_cli.memory import FLOAT_DTYPES
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.parsing import check_int, parse_int_list
from bole_cli.trees.generators import beam_tree_size

# `bench e2e`'s defaults, and those of a --tiny smoke run (seconds on 2 CPU cores).
E2E_DEFAULTS = dict(batch="1,4,16", context=4096, depth=8, topk=4, steps=32, warmup=3, chain_depths=None,
                    decoders="ar,snapshot,bole,chain,bole-chain")
SMOKE_DEFAULTS = dict(batch="1,2", context=16, depth=3, topk=2, steps=2, warmup=1, chain_depths="2",
                      decoders="ar,snapshot,bole")
DTYPES = ("auto",) + tuple(FLOAT_DTYPES)


def parse_tree_shapes(text: Optional[str]) -> tuple[tuple[int, int], ...]:
    """--tree-shapes '8x4,6x2' -> ((8, 4), (6, 2)): depth x top-k of each drafted tree."""
    if not text:
        return ()
    shapes = []
    for part in str(text).split(","):
        d, sep, k = part.strip().lower().partition("x")
        if not sep:
            raise InputError(f"--tree-shapes: expected DEPTHxTOPK items such as 8x4, got {brief(part)}")
        depth = parse_int_list(d, "--tree-shapes (depth)")
        topk = parse_int_list(k, "--tree-shapes (top-k)")
        if len(depth) != 1 or len(topk) != 1 or topk[0] < 2:
            raise InputError(f"--tree-shapes: {brief(part)} is not DEPTHxTOPK with top-k >= 2")
        size = beam_tree_size(depth[0], topk[0])
        if size > MAX_TREE_NODES:
            raise InputError(f"--tree-shapes: {depth[0]}x{topk[0]} drafts {size} nodes per "
                             f"request; the tree kernels take at most {MAX_TREE_NODES}")
        shapes.append((depth[0], topk[0]))
    return tuple(dict.fromkeys(shapes))


def check_options(given: dict[str, Any], *, tiny: bool, acceptance: str, tree_budgets: Optional[str],
                  tree_shapes: Optional[str], device: str, dtype: str, max_batch: int,
                  max_probes: int, probe_nodes: Optional[int]) -> dict[str, Any]:
    """The run's settings: `given` (None = default) filled from the defaults, every list
    parsed, every number and name checked; InputError names the first bad option."""
    use = {k: v if v is not None else (SMOKE_DEFAULTS if tiny else E2E_DEFAULTS)[k]
           for k, v in given.items()}
    use["batches"] = parse_int_list(use.pop("batch"), "--batch")
    depth = use["depth"]
    use["chain_depths"] = tuple(parse_int_list(
        use["chain_depths"] or ",".join(map(str, range(1, depth + 1))), "--chain-depths"))
    use["decoders"] = tuple(d.strip() for d in use["decoders"].split(",") if d.strip())
    if acceptance == "greedy" and len(use["decoders"]) < 2:
        raise InputError("--acceptance greedy compares the decoders' token streams: give at least two "
                         "--decoders")
    use["tree_budgets"] = tuple(parse_int_list(tree_budgets, "--tree-budgets")) if tree_budgets else ()
    use["tree_shapes"] = parse_tree_shapes(tree_shapes)
    if device not in ("cuda", "cpu"):
        raise InputError(f"--device: expected cuda or cpu, got {device!r}")
    if device == "cpu" and not tiny:
        raise InputError("--device cpu runs only with --tiny (a smoke run: CPU timings mean nothing)")
    if dtype not in DTYPES:
        raise InputError(f"--dtype: expected auto, bfloat16, float16 or float32, got {dtype!r}")
    for name, value, low in (("--context", use["context"], 1), ("--steps", use["steps"], 1),
                             ("--warmup", use["warmup"], 0), ("--max-batch", max_batch, 1),
                             ("--max-probes", max_probes, 1)):
        if value < low:
            raise InputError(f"{name}: expected an integer >= {low}, got {value}")
    check_int(probe_nodes, "--probe-nodes")
    use["dtype"] = (("bfloat16" if device == "cuda" else "float32") if dtype == "auto" else dtype)
    return use
