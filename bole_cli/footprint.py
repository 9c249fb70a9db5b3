"""What one step of the embedded runtime holds in GPU memory: the weights (their shapes are
this module's too), the KV cache, the GDN states and conv windows, a verify's transient
buffers, the activations and logits, and a fixed workspace.

Why here, without torch: the measured sweep checks a step against the device's free memory
before it allocates (runtime.timer), and the roofline estimate checks the same figures
against the GPU's datasheet memory (calibrate.costmodel), so a cell that cannot run on one
GPU is reported as such by both paths instead of being priced (docs/design.md §5).
Element sizes come in as bytes; the runtime passes its dtypes' sizes.
"""

from __future__ import annotations

from typing import Any

from bole_cli.errors import BoleError
from bole_cli.memory import FACTOR_ELEM_BYTES, GiB, format_bytes

__all__ = ["WORKSPACE_BYTES", "gdn_proj_width", "param_shapes", "param_bytes", "drafter_param_bytes",
           "drafter_memory", "step_memory", "does_not_fit"]

WORKSPACE_BYTES = 1 * GiB  # CUDA context slack, cuBLAS workspaces, allocator fragmentation


def gdn_proj_width(s: Any) -> int:
    """in_proj_qkv | in_proj_z | in_proj_b | in_proj_a, fused."""
    return s.conv_dim + s.gdn_value_heads * s.gdn_value_dim + 2 * s.gdn_value_heads


def param_shapes(s: Any) -> dict[str, dict[str, tuple]]:
    """Shapes of every weight of the runtime's model (runtime.model.HybridModel), grouped:
    "model" (once), "gdn", "attn", "mlp" (per layer of that kind; "mlp" and "norms" in every
    layer). Entries ending in "@f" are kept in the factor dtype (float32) whatever the model
    dtype."""
    h, hv, dv = s.hidden, s.gdn_value_heads, s.gdn_value_dim
    dh = s.attn_head_dim
    model = {"embed": (s.vocab, h), "final_norm": (h,)}
    if not s.tied_embeddings:
        model["lm_head"] = (s.vocab, h)
    gdn = {"in_proj": (gdn_proj_width(s), h), "conv_w": (s.conv_dim, s.conv_kernel),
           "A_log@f": (hv,), "dt_bias@f": (hv,), "norm_w": (dv,), "out_proj": (h, hv * dv)}
    attn = {"qkv_proj": (2 * s.attn_heads * dh + 2 * s.attn_kv_heads * dh, h), "q_norm": (dh,),
            "k_norm": (dh,), "o_proj": (h, s.attn_heads * dh)}
    if s.is_moe:
        mlp = {"router": (s.experts, h), "w13": (s.experts, 2 * s.expert_ffn, h),
               "w2": (s.experts, h, s.expert_ffn)}
        if s.shared_expert_ffn:
            mlp.update({"shared_gate_up": (2 * s.shared_expert_ffn, h),
                        "shared_down": (h, s.shared_expert_ffn), "shared_gate": (1, h)})
    else:
        mlp = {"gate_up": (2 * s.ffn, h), "down": (h, s.ffn)}
    return {"model": model, "gdn": gdn, "attn": attn, "mlp": mlp,
            "norms": {"input_norm": (h,), "post_norm": (h,)}}


def param_bytes(s: Any, elem: int, factor_elem: int = FACTOR_ELEM_BYTES) -> int:
    """Exact bytes of the runtime model's weights, `elem` bytes an element ("@f" entries
    `factor_elem`)."""
    def size(group: dict) -> int:
        total = 0
        for name, shape in group.items():
            n = 1
            for d in shape:
                n *= d
            total += n * (factor_elem if name.endswith("@f") else elem)
        return total

    g = param_shapes(s)
    return (size(g["model"]) + s.n_gdn_layers * size(g["gdn"]) + s.n_attention_layers * size(g["attn"])
            + s.layers * (size(g["mlp"]) + size(g["norms"])))


def drafter_param_bytes(s: Any, elem: int) -> int:
    """The MTP draft head's own weights (its embedding and LM head are the target's): the
    norms, the fc over [embedding | hidden], one attention layer and a dense MLP as wide as
    the target's active experts."""
    h, hq, hk, dh = s.hidden, s.attn_heads, s.attn_kv_heads, s.attn_head_dim
    ffn = s.ffn or (s.experts_top_k * s.expert_ffn + s.shared_expert_ffn)
    n = 5 * h + 2 * dh + 2 * h * h + (2 * hq * dh + 2 * hk * dh) * h + h * hq * dh + 3 * ffn * h
    return n * elem


def drafter_memory(s: Any, elem: int, *, batch: int, kv_len: int) -> dict[str, int]:
    """What speculation adds beside the target: the draft head's weights and its one
    layer's KV cache. A hot-token head adds nothing: the runtime's drafter reads its rows
    of the target's LM head in place (SGLang's token map copies them: 0.3 GiB at 32k
    tokens of 9B, left out as the runtime leaves it out)."""
    return {"draft_head": drafter_param_bytes(s, elem),
            "draft_kv": 2 * batch * s.attn_kv_heads * kv_len * s.attn_head_dim * elem}


def step_memory(s: Any, elem: int, factor_elem: int, *, batch: int, kv_len: int,
                n_tree_tokens: int = 0, path: str = "bole") -> dict[str, int]:
    """Bytes the runtime allocates for one step: weights, KV cache, GDN states and conv
    windows (per slot), the verify's transient GDN buffers (Bole's factors or the snapshot
    buffer), the attention bias, activations and logits, and a fixed workspace; "total"
    sums them."""
    e, f = elem, factor_elem
    n = max(n_tree_tokens, batch)
    t_max = -(-n // batch)
    n_gdn, n_attn = s.n_gdn_layers, s.n_attention_layers
    hv, dk, dv = s.gdn_value_heads, s.gdn_key_dim, s.gdn_value_dim
    kv_limit = kv_len + t_max
    out = {"weights": param_bytes(s, e, f),
           "kv_cache": n_attn * 2 * s.attn_kv_heads * s.attn_head_dim * e * batch * kv_limit,
           "gdn_states": n_gdn * batch * hv * dv * dk * f,
           "conv_windows": n_gdn * batch * s.conv_dim * (s.conv_kernel - 1) * e}
    if n_tree_tokens:
        conv_in = n_gdn * n * gdn_proj_width(s) * e  # every layer's in_proj outputs (x for the commit)
        if path == "bole":  # every layer's conv outputs (k, v); one layer's u and log_p
            out["verify_factors"] = conv_in + n_gdn * n * s.conv_dim * e + n * (hv * dv + hv) * f
        else:
            out["verify_snapshots"] = conv_in + n_gdn * batch * (t_max + 1) * hv * dv * dk * f
        out["attention_bias"] = batch * t_max * s.attn_group * kv_limit * e
    width = max(s.conv_dim + hv * dv + 2 * hv, 2 * (s.attn_heads + s.attn_kv_heads) * s.attn_head_dim,
                2 * s.ffn, 2 * s.shared_expert_ffn,
                s.experts_top_k * (2 * s.hidden + 3 * s.expert_ffn) if s.is_moe else 0)
    out["activations"] = 4 * n * (width + s.hidden) * max(e, f) + n * s.vocab * (e + 4)
    out["workspace"] = WORKSPACE_BYTES
    out["total"] = sum(out.values())
    return out


def largest_parts(need: dict[str, int], count: int = 3) -> str:
    """A step's `count` largest parts, largest first, the rest counted: "kv_cache 31.3 GiB,
    gdn_states 46.9 GiB and 5 more"."""
    sized = sorted(((v, k) for k, v in need.items() if k != "total" and v), reverse=True)
    parts = ", ".join(f"{k} {format_bytes(v)}" for v, k in sized[:count])
    if len(sized) > count:
        parts += f" and {len(sized) - count} more"
    return parts


def need_and_available(need: int, available: int) -> tuple[str, str]:
    """Both sizes formatted, with more digits where the short forms would read equal (a
    step a few MiB over the GPU must not read "needs 74.5 GiB, 74.5 GiB available")."""
    a, b = format_bytes(need), format_bytes(available)
    if a == b:
        a, b = f"{need / 2**30:.3f} GiB", f"{available / 2**30:.3f} GiB"
    return a, b


def does_not_fit(name: str, what: str, need: dict[str, int], available: int, where: str,
                 hint: str = "") -> BoleError:
    """The one wording of a step that does not fit: what it needs, its largest parts first
    (three of them; the rest counted), against what `where` has."""
    total, has = need_and_available(need["total"], available)
    return BoleError(f"{name} does not fit for {what}: needs {total} ({largest_parts(need)}), "
                     f"{has} available on {where}{hint}")
