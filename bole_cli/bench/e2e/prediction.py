"""`bole bench e2e`'s predictions: what the calibration profile of this GPU and model says
each measured run of AR, Bole's trees and the chains (either verifier: one price, docs/
design.md §8) should reach, by the objective `bole calibrate` decides with
(bole_cli.calibrate.decision, docs/design.md §8), so every table shows prediction and
measurement side by side. Needs a profile with drafter and sampling costs (format 2) and
simulated acceptance; otherwise it prices nothing and says why.
"""

from __future__ import annotations

from typing import Any, Optional


class ProfilePricer:
    """pricer(run) -> predicted tokens/s of that run (None where it cannot price)."""

    def __init__(self, entries: dict[int, Any], acceptance: Any, why: str, source: str):
        self.entries = entries  # batch -> (BucketCosts, lookup note)
        self.acceptance = acceptance
        self.why = why
        self.source = source

    def __call__(self, run: Any) -> Optional[float]:
        from bole_cli.calibrate.acceptance import AcceptanceModel
        from bole_cli.calibrate.decision import price

        got = self.entries.get(run.batch)
        if got is None or self.acceptance is None or not run.tok_s:
            return None
        costs = got[0]
        if run.decoder == "ar":
            choice = price(costs, None, "none")  # type: ignore[arg-type]
        elif run.chain_depth:
            q = self.acceptance.rows(run.chain_depth, 1)
            choice = price(costs, AcceptanceModel("e2e", "", q=q), "chain", run.chain_depth)
        elif run.tree_shape and run.budget and run.decoder == "bole":  # snapshot: not priced
            d, k = run.tree_shape
            q = self.acceptance.rows(d, k)
            choice = price(costs, AcceptanceModel("e2e", "", q=q), "tree", d, k, run.budget)
        else:
            return None
        return None if choice is None else choice.tok_s

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "priced": sorted(self.entries), "why_not": self.why or None,
                "notes": {str(b): note for b, (_, note) in self.entries.items()}}


def profile_pricer(cfg: Any, bench: Any) -> ProfilePricer:
    """The pricer of this run's GPU and model profile (an empty one without a usable profile)."""
    from bole_cli.calibrate.decision import BucketCosts
    from bole_cli.catalog.hardware import match_gpu
    from bole_cli.errors import BoleError, InputError
    from bole_cli.profiles import drafter_words, find_profile, load_profile, lookup_budget

    if bench.acceptance.greedy:
        return ProfilePricer({}, None, "greedy acceptance (real tokens): nothing to price", "")
    gpu = match_gpu(bench.device_name)
    skipped: list[str] = []  # a profile of another drafter is one: its draft levels would mislead
    path = (find_profile(gpu.key, cfg.spec, skipped=skipped, draft_vocab=cfg.draft_vocab)
            if gpu is not None else None)
    if path is None:
        why = (f"no calibration profile for {bench.device_name} and a drafter over "
               f"{drafter_words(cfg.draft_vocab)}" + "".join(f" ({s})" for s in skipped[:1]))
        return ProfilePricer({}, None, why, "")
    try:
        profile = load_profile(path)
    except (InputError, BoleError) as exc:
        return ProfilePricer({}, None, str(exc), str(path))
    entries = {}
    for b in cfg.batches:
        entry, note = lookup_budget(profile, b, cfg.context)
        if "draft_level" not in entry or "sample" not in entry or entry["batch"] != b:
            continue
        costs = BucketCosts(b, entry["kv_len"], entry["t_dec"], entry["n"], entry["t_ver"],
                            entry["draft_level"], entry["sample"]["fixed"],
                            entry["sample"]["per_token"])
        entries[b] = (costs, note)
    why = "" if entries else "the profile has no drafter costs at these batches (re-run bole calibrate)"
    kind = (profile.get("provenance") or {}).get("kind")
    return ProfilePricer(entries, bench.acceptance, why, f"{path} ({kind})")
