"""The rows of `bole calibrate`'s summary table, one per (batch, KV bucket) of a profile.

Plain numbers (seconds, counts), no formatting: the command renders them. The gain over
plain decoding is expected tokens per second at N* over batch / T_dec (docs/design.md §8).
"""

from __future__ import annotations

from typing import Any, Optional


def summary_rows(profile: dict) -> list[dict[str, Any]]:
    """Per configuration, sorted by (batch, kv_len): T_dec, B_ver and T_ver there, and at
    N* (None without an acceptance model) T_ver, expected tokens per step and the gain."""
    rows = []
    for cfg in sorted(profile["configs"], key=lambda c: (c["batch"], c["kv_len"])):
        i = cfg["n"].index(cfg["b_ver"])
        row: dict[str, Optional[Any]] = {
            "batch": cfg["batch"], "kv_len": cfg["kv_len"], "t_dec": cfg["t_dec"],
            "b_ver": cfg["b_ver"], "below_threshold": bool(cfg.get("below_threshold")),
            "t_ver_b_ver": cfg["t_ver"][i],
            "n_star": None, "t_ver_n_star": None, "tokens_per_step": None, "gain": None,
        }
        if cfg.get("n_star") is not None:
            j = cfg["n"].index(cfg["n_star"])
            e = cfg["e_acc"][j]
            row.update(n_star=cfg["n_star"], t_ver_n_star=cfg["t_ver"][j], tokens_per_step=e,
                       gain=(e / cfg["t_ver"][j]) / (cfg["batch"] / cfg["t_dec"]))
        rows.append(row)
    return rows
