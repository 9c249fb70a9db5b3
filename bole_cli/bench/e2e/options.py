"""`bole bench e2e`'s options, checked once, before any model is built: the defaults (full
run and a --tiny smoke run), the lists, the names, the tree shapes, the device
(docs/design.md §8). `check_options` returns the run's frozen E2EConfig; the library
trusts it and checks only what it learns later (the acceptance file, a GPU's free memory,
a calibration profile's budget).

Light (no torch at import): the command calls `check_options` first, so a typo fails in
milliseconds; the help texts of the defaults are written from the constants here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bole_cli.calibrate.acceptance import DEFAULT_PRESET
from bole_cli.catalog.models import ModelSpec, resolve_model, tiny_spec
from bole_cli.errors import InputError, brief
from bole_cli.memory import FLOAT_DTYPES
from bole_cli.limits import MAX_BATCH_REQUESTS, MAX_CONTEXT_TOKENS, MAX_SEED, REPLAYSSM_MIN_KEY_DIM
from bole_cli.parsing import check_draft_vocab, check_int, check_once, parse_int_list, parse_name_list
from bole_cli.trees.generators import check_beam_tree_size

# `bench e2e`'s defaults, and those of a --tiny smoke run (seconds on 2 CPU cores);
# chain_depths None: 1..depth.
E2E_DEFAULTS = dict(batch="1,4,16", context=4096, depth=8, topk=4, steps=32, warmup=3, chain_depths=None,
                    decoders="ar,snapshot,bole,chain,bole-chain")
SMOKE_DEFAULTS = dict(batch="1,2", context=16, depth=3, topk=2, steps=2, warmup=1, chain_depths="2",
                      decoders="ar,snapshot,bole")
# the defaults --tiny leaves alone
MODEL, BUDGET, SNAPSHOT_ENGINE, DEVICE, DTYPE, SEED = "9b", "profile", "auto", "cuda", "auto", 0
MAX_BATCH, MAX_PROBES = 256, 8  # the largest-batch search: its upper end, its probes per decoder
MAX_STEPS = 4096  # --steps and --warmup: 128x the default; the runs' caches are sized by them
AUTO_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}  # what --dtype auto means on each device
DTYPES = ("auto",) + tuple(FLOAT_DTYPES)
DEVICES = tuple(AUTO_DTYPE)
SNAPSHOT_ENGINES = ("auto", "sglang", "torch")
# every decoder --decoders takes, in the registry's order (decoders.DECODERS: the test of the
# registry holds the two equal; this copy keeps the check torch-free)
DECODER_NAMES = ("ar", "snapshot", "bole", "chain", "bole-chain")
TREE_DECODERS = ("snapshot", "bole")  # the ones that verify a tree under the batch budget
CHAIN_DECODERS = ("chain", "bole-chain")  # the ones whose depth --chain-depths sweeps
# what --decoders' help says of some of them (after the name, or after the last of a group)
DECODER_NOTES = {"chain": "SGLang's ReplaySSM chain"}


def default_note(name: str) -> str:
    """A help text's note of an option's two defaults: '[4096; --tiny: 16]' (its bracket
    escaped: help texts are Rich markup, where '[ar,...]' would read as a style)."""
    full = E2E_DEFAULTS[name]
    if name == "chain_depths" and full is None:
        full = "1..--depth"
    return f"\\[{full}; --tiny: {SMOKE_DEFAULTS[name]}]"


def decoders_help() -> str:
    """--decoders' help: every name (DECODER_NOTES after some) and the two defaults."""
    names = ", ".join(f"{n} ({DECODER_NOTES[n]})" if n in DECODER_NOTES else n for n in DECODER_NAMES)
    return f"Some of {names} {default_note('decoders')}."


@dataclass(frozen=True)
class E2EConfig:
    """One run's settings, checked (check_options): the harness trusts them."""

    spec: ModelSpec
    batches: tuple[int, ...]
    context: int = E2E_DEFAULTS["context"]
    budget: "str | int" = BUDGET
    acceptance: str = DEFAULT_PRESET
    depth: int = E2E_DEFAULTS["depth"]
    topk: int = E2E_DEFAULTS["topk"]
    steps: int = E2E_DEFAULTS["steps"]
    warmup: int = E2E_DEFAULTS["warmup"]
    seed: int = SEED
    decoders: tuple[str, ...] = tuple(E2E_DEFAULTS["decoders"].split(","))
    device: str = DEVICE
    dtype: str = AUTO_DTYPE[DEVICE]
    snapshot_engine: str = SNAPSHOT_ENGINE
    use_graphs: Optional[bool] = None  # None: on CUDA
    max_batch: int = MAX_BATCH
    max_probes: int = MAX_PROBES
    probe_nodes: Optional[int] = None
    search: bool = True
    command: str = ""
    chain_depths: tuple[int, ...] = tuple(range(1, E2E_DEFAULTS["depth"] + 1))
    draft_vocab: Optional[int] = None
    tree_budgets: tuple[int, ...] = ()  # the tree decoders run at each; empty: `budget` alone
    tree_shapes: tuple[tuple[int, int], ...] = ()  # (depth, top-k) each; empty: (depth, topk)


def parse_budget(text: str) -> "str | int":
    """--budget: 'profile' or one positive integer (parsed and capped as every int option)."""
    t = str(text).strip().lower()
    if t == "profile":
        return "profile"
    values = parse_int_list(t, "--budget") if t and t.lstrip("-").isdigit() else []
    if len(values) != 1:
        raise InputError(f"--budget: expected 'profile' or a positive integer, got {brief(text)}")
    return values[0]


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
        check_beam_tree_size(depth[0], topk[0], f"--tree-shapes: {depth[0]}x{topk[0]}")
        check_once((depth[0], topk[0]), shapes, "--tree-shapes", text, f"{depth[0]}x{topk[0]}")
        shapes.append((depth[0], topk[0]))
    return tuple(shapes)


def check_options(*, model: str, tiny: bool, batch: Optional[str], context: Optional[int],
                  depth: Optional[int], topk: Optional[int], steps: Optional[int], warmup: Optional[int],
                  decoders: Optional[str], chain_depths: Optional[str], budget: str, acceptance: str,
                  tree_budgets: Optional[str], tree_shapes: Optional[str], draft_vocab: Optional[int],
                  snapshot_engine: str, max_batch: int, max_probes: int, probe_nodes: Optional[int],
                  search: bool, dtype: str, device: str, graphs: bool, seed: int,
                  command: str = "") -> E2EConfig:
    """The run's E2EConfig from the command's options (None = the default, --tiny's under
    --tiny): every list parsed, every number and name checked, the model resolved;
    InputError names the first bad option."""
    given = dict(batch=batch, context=context, depth=depth, topk=topk, steps=steps, warmup=warmup,
                 chain_depths=chain_depths, decoders=decoders)
    use = {k: v if v is not None else (SMOKE_DEFAULTS if tiny else E2E_DEFAULTS)[k] for k, v in given.items()}
    batches = tuple(parse_int_list(use["batch"], "--batch", maximum=MAX_BATCH_REQUESTS))
    chains = tuple(parse_int_list(
        use["chain_depths"] or ",".join(map(str, range(1, use["depth"] + 1))), "--chain-depths"))
    names = tuple(parse_name_list(use["decoders"], "--decoders"))
    if acceptance == "greedy" and len(names) < 2:
        raise InputError("--acceptance greedy compares the decoders' token streams: give at least two "
                         "--decoders")
    budgets = tuple(parse_int_list(tree_budgets, "--tree-budgets")) if tree_budgets else ()
    shapes = parse_tree_shapes(tree_shapes)
    if device not in DEVICES:
        raise InputError(f"--device: expected cuda or cpu, got {device!r}")
    if device == "cpu" and not tiny:
        raise InputError("--device cpu runs only with --tiny (a smoke run: CPU timings mean nothing)")
    if dtype not in DTYPES:
        raise InputError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    check_int(use["context"], "--context", maximum=MAX_CONTEXT_TOKENS)
    for name, value, low, high in (("--depth", use["depth"], 1, None), ("--topk", use["topk"], 1, None),
                                   ("--steps", use["steps"], 1, MAX_STEPS), ("--warmup", use["warmup"], 0, MAX_STEPS),
                                   ("--max-batch", max_batch, 1, None), ("--max-probes", max_probes, 1, None),
                                   ("--seed", seed, 0, MAX_SEED)):
        check_int(value, name, minimum=low, maximum=high)
    check_beam_tree_size(use["depth"], use["topk"], f"--depth {use['depth']} with --topk {use['topk']}")
    check_int(probe_nodes, "--probe-nodes")
    budget_policy = parse_budget(budget)
    spec = tiny_spec() if tiny else resolve_model(model)
    if [d for d in names if d not in DECODER_NAMES] or not names:
        raise InputError(f"--decoders: expected some of {', '.join(DECODER_NAMES)}, got {','.join(names)!r}")
    if "chain" in names and spec.gdn_key_dim < REPLAYSSM_MIN_KEY_DIM:
        raise InputError(f"--decoders chain: SGLang's ReplaySSM kernel needs a GDN key dim of at least "
                         f"{REPLAYSSM_MIN_KEY_DIM}, and {'--tiny' if tiny else spec.name}'s is {spec.gdn_key_dim}")
    _check_combinations(model=model, tiny=tiny, budget=budget, budgets=budgets or (budget_policy,),
                        tree_budgets=tree_budgets, batches=batches, names=names, chains=chains,
                        chain_depths_given=chain_depths is not None, depth=use["depth"], search=search,
                        max_batch=max_batch, max_probes=max_probes, probe_nodes=probe_nodes, device=device)
    widest = max([use["topk"]] + [k for _, k in shapes or ()])  # the most drafts a level takes
    draft_vocab = check_draft_vocab(draft_vocab, spec.vocab, widest)
    if snapshot_engine not in SNAPSHOT_ENGINES:
        raise InputError(f"--snapshot-engine: expected one of {', '.join(SNAPSHOT_ENGINES)}, "
                         f"got {snapshot_engine!r}")
    return E2EConfig(spec=spec, batches=batches, context=use["context"], budget=budget_policy,
                     acceptance=acceptance, depth=use["depth"], topk=use["topk"], steps=use["steps"],
                     warmup=use["warmup"], seed=seed, decoders=names, device=device,
                     dtype=AUTO_DTYPE[device] if dtype == "auto" else dtype, snapshot_engine=snapshot_engine,
                     use_graphs=None if graphs else False, max_batch=max_batch, max_probes=max_probes,
                     probe_nodes=probe_nodes, search=search, command=command, chain_depths=chains,
                     draft_vocab=draft_vocab, tree_budgets=budgets, tree_shapes=shapes)


def _check_combinations(*, model: str, tiny: bool, budget: str, budgets: tuple, tree_budgets: Optional[str],
                        batches: tuple[int, ...], names: tuple[str, ...], chains: tuple[int, ...],
                        chain_depths_given: bool, depth: int, search: bool, max_batch: int, max_probes: int,
                        probe_nodes: Optional[int], device: str = DEVICE) -> None:
    """Options that contradict each other or the run, refused before any model is built."""
    if tiny and model.strip().lower() != MODEL:
        raise InputError(f"--model {model}: --tiny builds its own tiny model; give one or the other")
    if tree_budgets and str(budget).strip().lower() != BUDGET:
        raise InputError("--budget: --tree-budgets sweeps the budgets instead; give one or the other")
    if not search and (max_batch != MAX_BATCH or max_probes != MAX_PROBES or probe_nodes is not None):
        raise InputError("--no-max-batch: skips the largest-batch search that --max-batch, --max-probes "
                         "and --probe-nodes set up; give one or the others")
    search_options = [name for name, given in (("--max-batch", max_batch != MAX_BATCH),
                                               ("--max-probes", max_probes != MAX_PROBES),
                                               ("--probe-nodes", probe_nodes is not None)) if given]
    if device == "cpu" and search_options:
        raise InputError(f"{search_options[0]}: the largest-batch search it sets up runs on CUDA only (on CPU "
                         "an allocation failure means host RAM); drop it with --device cpu")
    if chain_depths_given and not any(d in CHAIN_DECODERS for d in names):
        raise InputError(f"--chain-depths: only {' and '.join(CHAIN_DECODERS)} draft chains, and "
                         "--decoders names neither; add one or drop --chain-depths")
    if any(d in CHAIN_DECODERS for d in names):
        over = [d for d in chains if d > depth]
        if over:
            whose = "" if chain_depths_given else (" (--tiny's default --chain-depths)" if tiny else "")
            raise InputError(f"--chain-depths: {over[0]}{whose} is outside 1..{depth} (--depth)")
    n = min((b for b in budgets if isinstance(b, int)), default=None)
    if n is not None and any(d in TREE_DECODERS for d in names):
        check_budget_covers_batch(n, batches[-1], "--tree-budgets" if tree_budgets else "--budget")


def check_budget_covers_batch(budget: int, batch: int, option: str = "--budget") -> None:
    """A batch budget verifies at least every request's root: InputError naming `option`."""
    if budget < batch:
        raise InputError(f"{option}: {budget} is smaller than batch {batch}: every request verifies "
                         "at least its root")
