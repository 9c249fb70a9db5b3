"""The profile schema (docs/design.md §5) and its validation.

A profile is one YAML mapping per (gpu, model):

    bole_profile: 2                  # format version; its absence marks a foreign file
    gpu: a100                        # catalogue key
    model: Qwen/Qwen3.5-9B
    dtype: bf16
    draft_vocab: null                # draft_level priced a head scoring this many hot tokens
                                     # (SGLang's --speculative-token-map); null or absent: all
    provenance:
      kind: estimated                # measured | estimated
      partial: false                 # true when a sweep was interrupted
      note: ""                       # free text (e.g. "placeholder until measured")
      sampled_layers: null           # layers the runtime ran, when it sampled a subset
      bole_version: 0.1.0
      torch_version: 2.13.0          # null when unknown
      triton_version: 3.5.0
      device_name: NVIDIA H200
      date: 2025-01-01T00:00:00Z
      command: bole calibrate --gpu a100 --model 9b
      (measured: timing {warmup, repeats, spread_tol, max_rounds} and runtime {...};
       estimated: cost_model {...}; failures: [...] when points raised)
    eps: 0.05
    grid: [8, 12, 16, ...]           # tree tokens across the batch (root tokens included)
    acceptance: {name, source, ...}  # the model behind n_star / e_acc (optional)
    configs:                         # one per (batch, kv_len)
      - batch: 8
        kv_len: 4096
        t_dec: 0.0116                # seconds, one decode step
        n: [8, 12, ...]              # grid points measured (those >= batch)
        t_ver: [0.0118, ...]         # seconds, one per n
        b_ver: 64                    # Eq. 12
        below_threshold: false       # true: no point met the threshold, b_ver = n[0]
        n_star: 128                  # the best tree's budget (decision.best.tree), or null
        e_acc: [8.0, ...]            # expected committed tokens per n (optional)
        draft_level: [0.00098, ...]  # seconds of one drafter level, 1..top-k rows/request
        sample: {fixed: 1.0e-4, per_token: 2.0e-7}   # T_sample(N) = fixed + per_token N
        decision:                    # how to speculate here (docs/design.md §8)
          mode: tree                 # none | chain | tree
          chosen: {mode, depth, topk, budget, tokens, t_draft, t_verify, t_sample,
                   verify, step_s, tok_s, speedup, label}
          runner_up: {...}           # the best choice of another mode, or null
          best: {none: {...}, chain: {...}, tree: {...}}
          considered: 412
        noisy: []                    # n whose timing spread stayed high (optional)
        t_dec_noisy: true            # the decode step's spread stayed high (optional)
    kernels: {}                      # tuned tile configurations keyed by shape

Unknown keys are kept (other tools may add sections); known keys are checked and the
first problem raises InputError naming the file and the field:
"profile.yaml: configs[3].t_ver: expected a list of numbers".
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from bole_cli.errors import InputError, brief

PROFILE_VERSION = 2  # 2: the decision (drafting counted), draft_level, sample, chain points
KINDS = ("measured", "estimated")


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, msg: str) -> InputError:
        return InputError(f"{self.source}: {where}: {msg}")

    def get(self, obj: dict, key: str, where: str, *, required: bool = True) -> Any:
        if key not in obj:
            if required:
                raise self.fail(where, "missing required field")
            return None
        return obj[key]

    def mapping(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {_kind(value)}")
        return value

    def string(self, value: Any, where: str, *, nullable: bool = False) -> Optional[str]:
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string, got {_kind(value)}")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {_kind(value)}")
        return value

    def integer(self, value: Any, where: str, *, minimum: int = 1, nullable: bool = False) -> Optional[int]:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer, got {_kind(value)}")
        if value < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {brief(value)}")
        return value

    def number(self, value: Any, where: str, *, positive: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"expected a number, got {_kind(value)}")
        if not _finite(value):
            raise self.fail(where, f"expected a finite number, got {brief(value)}")
        if positive and value <= 0:
            raise self.fail(where, f"expected a number > 0, got {value}")
        return float(value)

    def numbers(self, value: Any, where: str) -> list[float]:
        if not isinstance(value, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and _finite(x) and x > 0
            for x in value
        ):
            raise self.fail(where, "expected a list of numbers")
        return [float(x) for x in value]

    def integers(self, value: Any, where: str, *, increasing: bool = True,
                 minimum: int = 1) -> list[int]:
        if not isinstance(value, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= minimum for x in value
        ):
            what = "positive integers" if minimum == 1 else f"integers >= {minimum}"
            raise self.fail(where, f"expected a list of {what}")
        if increasing and any(b <= a for a, b in zip(value, value[1:])):
            raise self.fail(where, "expected strictly increasing values")
        return list(value)


def _finite(value: "int | float") -> bool:
    """math.isfinite, but False (not OverflowError) for an int beyond float range."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def drafter_words(draft_vocab: Optional[int]) -> str:
    """How messages name a drafter's vocabulary: 'the full vocabulary' or 'N hot tokens'."""
    return "the full vocabulary" if draft_vocab is None else f"{draft_vocab:,} hot tokens"


def failure_cell(batch: int, kv_len: Optional[int] = None) -> str:
    """How provenance.failures names a cell, the start of each entry ("batch 16, kv 4096");
    the sweep writes it, a lookup matches the cell asked for against it."""
    return f"batch {batch}" if kv_len is None else f"batch {batch}, kv {kv_len}"


def decode_failure(batch: Any, kv_len: Any, why: str) -> str:
    """provenance.failures' entry of a cell whose decode step failed (no entry in configs)."""
    return f"{failure_cell(batch, kv_len)}, decode: {why}"


def failed_cells(profile: dict) -> list[tuple[int, int, str]]:
    """(batch, kv_len, why) of each cell whose decode step failed in the sweep (out of
    memory, say): no entry in `configs`, only its line in provenance.failures."""
    head = re.compile("^" + decode_failure(r"(\d+)", r"(\d+)", ""))
    cells = []
    for line in (profile.get("provenance") or {}).get("failures") or []:
        m = head.match(str(line))
        if m:
            cells.append((int(m.group(1)), int(m.group(2)), str(line)[m.end():]))
    return cells


def draft_vocab_of(profile: dict, vocab: Optional[int] = None) -> Optional[int]:
    """The hot tokens its drafter levels were priced over; None: the full vocabulary (also
    for a hand-edited value of `vocab`, the model's vocabulary, or more)."""
    n = profile.get("draft_vocab")
    return None if n is None or (vocab is not None and n >= vocab) else n


def validate_profile(data: Any, source: str = "profile") -> dict:
    """Check a parsed profile; return it unchanged or raise InputError naming the field."""
    c = _Checker(source)
    if not isinstance(data, dict) or "bole_profile" not in data:
        raise InputError(f"{source}: not a Bole profile (no 'bole_profile' version key); "
                         "profiles are written by `bole calibrate`")
    version = c.integer(data["bole_profile"], "bole_profile")
    if version > PROFILE_VERSION:
        raise c.fail("bole_profile", f"version {version} is newer than this bole reads "
                                     f"({PROFILE_VERSION}); upgrade bole")
    c.string(c.get(data, "gpu", "gpu"), "gpu")
    c.string(c.get(data, "model", "model"), "model")
    if "dtype" in data:
        c.string(data["dtype"], "dtype")
    if "draft_vocab" in data:
        c.integer(data["draft_vocab"], "draft_vocab", minimum=1, nullable=True)

    prov = c.mapping(c.get(data, "provenance", "provenance"), "provenance")
    kind = c.string(c.get(prov, "kind", "provenance.kind"), "provenance.kind")
    if kind not in KINDS:
        raise c.fail("provenance.kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    for key in ("bole_version", "date", "device_name"):
        c.string(c.get(prov, key, f"provenance.{key}"), f"provenance.{key}")
    for key in ("torch_version", "triton_version", "command", "note"):
        if key in prov:
            c.string(prov[key], f"provenance.{key}", nullable=True)
    if "partial" in prov:
        c.boolean(prov["partial"], "provenance.partial")
    sampled = prov.get("sampled_layers")  # layer ids, or how many layers ran
    if isinstance(sampled, int) and not isinstance(sampled, bool):
        c.integer(sampled, "provenance.sampled_layers")
    elif sampled is not None:
        c.integers(sampled, "provenance.sampled_layers", minimum=0)

    configs = data.get("configs")
    grid: list[int] = []
    if configs is not None or "grid" in data:
        grid = c.integers(c.get(data, "grid", "grid"), "grid")
        if not grid:
            raise c.fail("grid", "expected at least one grid point")
        c.number(c.get(data, "eps", "eps"), "eps")
    if "acceptance" in data and data["acceptance"] is not None:
        acc = c.mapping(data["acceptance"], "acceptance")
        c.string(c.get(acc, "name", "acceptance.name"), "acceptance.name")
        _check_acceptance(acc, source)
    if "kernels" in data:
        c.mapping(data["kernels"], "kernels")

    if configs is None:
        return data
    if not isinstance(configs, list):
        raise c.fail("configs", f"expected a list, got {_kind(configs)}")
    seen: set[tuple[int, int]] = set()
    grid_set = set(grid)
    for i, cfg in enumerate(configs):
        w = f"configs[{i}]"
        c.mapping(cfg, w)
        batch = c.integer(c.get(cfg, "batch", f"{w}.batch"), f"{w}.batch")
        kv = c.integer(c.get(cfg, "kv_len", f"{w}.kv_len"), f"{w}.kv_len")
        if (batch, kv) in seen:
            raise c.fail(w, f"duplicate configuration batch {batch}, kv_len {kv}")
        seen.add((batch, kv))
        c.number(c.get(cfg, "t_dec", f"{w}.t_dec"), f"{w}.t_dec")
        n = c.integers(c.get(cfg, "n", f"{w}.n"), f"{w}.n")
        t_ver = c.numbers(c.get(cfg, "t_ver", f"{w}.t_ver"), f"{w}.t_ver")
        if len(n) != len(t_ver):
            raise c.fail(f"{w}.t_ver", f"expected {len(n)} values (one per n), got {len(t_ver)}")
        if not n:
            raise c.fail(f"{w}.n", "expected at least one measured point")
        chains = set(_chain_points(batch)) if version >= 2 else set()
        off = [x for x in n if x not in grid_set and x not in chains]
        if off:
            raise c.fail(f"{w}.n", f"{off[0]} is not a grid point (nor a chain's size)")
        b_ver = c.integer(c.get(cfg, "b_ver", f"{w}.b_ver"), f"{w}.b_ver")
        if b_ver not in n:
            raise c.fail(f"{w}.b_ver", f"{b_ver} is not one of the measured n")
        if "below_threshold" in cfg:
            c.boolean(cfg["below_threshold"], f"{w}.below_threshold")
        n_star = c.integer(cfg.get("n_star"), f"{w}.n_star", nullable=True)
        if n_star is not None and n_star not in n:
            raise c.fail(f"{w}.n_star", f"{n_star} is not one of the measured n")
        if cfg.get("e_acc") is not None:
            e_acc = cfg["e_acc"]
            if not isinstance(e_acc, list) or len(e_acc) != len(n) or not all(
                x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)
                              and _finite(x) and 0 < x <= tokens)
                for x, tokens in zip(e_acc, n)
            ):
                raise c.fail(f"{w}.e_acc", "expected finite committed tokens, one per n, "
                                           "each > 0 and at most its n")
        if cfg.get("noisy") is not None:
            c.integers(cfg["noisy"], f"{w}.noisy")
        if "draft_level" in cfg:
            c.numbers(cfg["draft_level"], f"{w}.draft_level")
        if "sample" in cfg:
            smp = c.mapping(cfg["sample"], f"{w}.sample")
            for key in ("fixed", "per_token"):
                c.number(c.get(smp, key, f"{w}.sample.{key}"), f"{w}.sample.{key}",
                         positive=False)
                if smp[key] < 0:
                    raise c.fail(f"{w}.sample.{key}", f"expected a number >= 0, got {smp[key]}")
        if cfg.get("decision") is not None:
            _check_decision(c, cfg["decision"], f"{w}.decision", set(n), batch)
    return data


def _check_acceptance(acc: dict, source: str) -> None:
    """The profile's acceptance model, checked as strictly as the file it came from (the
    same checks: bole_cli/calibrate/acceptance.py)."""
    from bole_cli.calibrate.acceptance import check_curve, check_rank_rows

    if "per_depth_rank" in acc:
        check_rank_rows(acc["per_depth_rank"], f"{source}: acceptance.per_depth_rank")
    if "curve" in acc:
        check_curve(acc["curve"], f"{source}: acceptance.curve")


def _chain_points(batch: int) -> list[int]:
    from bole_cli.calibrate.decision import MAX_CHAIN_DEPTH, chain_points

    return chain_points(batch, MAX_CHAIN_DEPTH)


def _check_choice(c: "_Checker", value: Any, where: str, n: set, batch: int) -> dict:
    """One priced choice: its mode's shape (none: nothing drafted, the batch verified; a chain:
    top-k 1, depth 1..8, batch (d + 1) tokens; a tree: top-k >= 2, a beam tree of at most
    256 nodes, whole per-request budgets), a known verifier and positive figures."""
    from bole_cli.calibrate.decision import MAX_CHAIN_DEPTH, MODES
    from bole_cli.limits import MAX_TREE_NODES
    from bole_cli.trees.generators import beam_tree_size

    ch = c.mapping(value, where)
    mode = c.string(c.get(ch, "mode", f"{where}.mode"), f"{where}.mode")
    if mode not in MODES:
        raise c.fail(f"{where}.mode", f"expected one of {', '.join(MODES)}, got {mode!r}")
    c.string(c.get(ch, "label", f"{where}.label"), f"{where}.label")
    verify = c.string(c.get(ch, "verify", f"{where}.verify"), f"{where}.verify")
    want_verify = {"none": ("decode",), "chain": ("bole", "replayssm"), "tree": ("bole",)}[mode]
    if verify not in want_verify:
        raise c.fail(f"{where}.verify", f"a {mode} is verified by {' or '.join(want_verify)}, "
                                        f"got {verify!r}")
    depth = c.integer(c.get(ch, "depth", f"{where}.depth"), f"{where}.depth", minimum=0)
    topk = c.integer(c.get(ch, "topk", f"{where}.topk"), f"{where}.topk", minimum=0)
    budget = c.integer(c.get(ch, "budget", f"{where}.budget"), f"{where}.budget")
    if mode != "none" and budget not in n:
        raise c.fail(f"{where}.budget", f"{budget} is not one of the measured n")
    if mode == "none" and (depth, topk, budget) != (0, 0, batch):
        raise c.fail(where, f"no speculation drafts nothing and verifies the batch ({batch}): "
                            f"depth 0, topk 0, budget {batch}")
    if mode == "chain" and not (topk == 1 and 1 <= depth <= MAX_CHAIN_DEPTH
                                and budget == batch * (depth + 1)):
        raise c.fail(where, f"a chain has topk 1, depth 1..{MAX_CHAIN_DEPTH} and budget "
                            f"batch x (depth + 1); got topk {topk}, depth {depth}, budget {budget}")
    if mode == "tree":
        if topk < 2 or depth < 1 or beam_tree_size(depth, topk) > MAX_TREE_NODES:
            raise c.fail(where, f"a tree has topk >= 2, depth >= 1 and at most {MAX_TREE_NODES} "
                                f"nodes; got depth {depth}, topk {topk}")
        if budget % batch or not 2 <= budget // batch <= beam_tree_size(depth, topk):
            raise c.fail(f"{where}.budget", f"{budget} is not a whole tree of 2.."
                                            f"{beam_tree_size(depth, topk)} tokens per request")
    for key in ("tokens", "tok_s", "speedup", "step_s"):
        c.number(c.get(ch, key, f"{where}.{key}"), f"{where}.{key}")
    return ch


def _check_decision(c: "_Checker", value: Any, where: str, n: set, batch: int) -> None:
    d = c.mapping(value, where)
    chosen = _check_choice(c, c.get(d, "chosen", f"{where}.chosen"), f"{where}.chosen", n, batch)
    if d.get("mode") != chosen["mode"]:
        raise c.fail(f"{where}.mode", f"{d.get('mode')!r} differs from chosen.mode "
                                      f"{chosen['mode']!r}")
    if d.get("runner_up") is not None:
        ru = _check_choice(c, d["runner_up"], f"{where}.runner_up", n, batch)
        if ru["mode"] == chosen["mode"]:
            raise c.fail(f"{where}.runner_up.mode", "the runner-up is the best of another mode")
    for mode, ch in c.mapping(d.get("best") or {}, f"{where}.best").items():
        got = _check_choice(c, ch, f"{where}.best.{mode}", n, batch)
        if got["mode"] != mode:
            raise c.fail(f"{where}.best.{mode}.mode", f"expected {mode!r}, got {got['mode']!r}")
