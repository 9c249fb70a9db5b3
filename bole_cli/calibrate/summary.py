"""The rows of `bole calibrate`'s summary table, one per (batch, KV bucket) of a profile.

Plain numbers (seconds, counts), no formatting: the command renders them. The decision and
its speedup over plain decoding count drafting and sampling (docs/design.md §8); B_ver is
the paper's rule (Eq. 12), kept beside it, and `differs` says when the decision is not a
tree of B_ver tokens.
"""

from __future__ import annotations

from typing import Any, Optional


def summary_rows(profile: dict) -> list[dict[str, Any]]:
    """Per configuration, sorted by (batch, kv_len): T_dec, B_ver, and the decision (None
    without one: a profile made without drafter costs or an acceptance model)."""
    rows = []
    for cfg in sorted(profile["configs"], key=lambda c: (c["batch"], c["kv_len"])):
        i = cfg["n"].index(cfg["b_ver"])
        row: dict[str, Optional[Any]] = {
            "batch": cfg["batch"], "kv_len": cfg["kv_len"], "t_dec": cfg["t_dec"],
            "b_ver": cfg["b_ver"], "below_threshold": bool(cfg.get("below_threshold")),
            "t_ver_b_ver": cfg["t_ver"][i], "n_star": cfg.get("n_star"),
            "decision": None, "mode": None, "tokens_per_step": None, "step_s": None,
            "tok_s": None, "speedup": None, "runner_up": None, "runner_up_vs": None,
            "differs": None,
        }
        d = cfg.get("decision")
        if d:
            ch, ru = d["chosen"], d.get("runner_up")
            row.update(decision=ch["label"], mode=ch["mode"], tokens_per_step=ch["tokens"],
                       step_s=ch["step_s"], tok_s=ch["tok_s"], speedup=ch["speedup"],
                       differs=not (ch["mode"] == "tree" and ch["budget"] == cfg["b_ver"]))
            if ru:  # the runner-up's mode and shape; its budget is in the JSON
                short = ru["label"].split(" N=")[0]
                row.update(runner_up=short, runner_up_vs=ru["tok_s"] / ch["tok_s"] - 1)
        rows.append(row)
    return rows
