"""Teacher-forced MTP acceptance along the target's greedy continuation (docs/design.md §8).

For one prompt the target continues greedily (transformers' generate); one target forward
over prompt + continuation gives the final hidden states h and the target's greedy token y_i
after every position i. An anchor is a position t of the continuation: the target has just
committed the bonus token s_{t+1}; the MTP drafts depth 1 from (s_{t+1}, h_t), and depth j
from (s_{t+j}, m_{j-1}), its own previous output, which is what a draft tree below the
accepted depth-(j-1) node computes whatever that node's rank was. The rank of y_{t+j} among
the depth-j draft's top-k is recorded for every anchor and depth.

Batched over anchors, in one MTP pass per depth. The MTP's attention sees what SGLang's
draft sees: the entries (s_{i+1}, h_i) of the committed positions i <= t (pass 1 computes
them for the whole sequence, causally) and the anchor's own earlier draft steps; so the
query of anchor t at depth j attends to pass-1 keys 0..t and to the keys of anchor t in
passes 2..j. The keys persist in one KeyValueStore across passes; the mask says who sees
what. `predict` is the test seam: it may replace the draft logits (with the target's own,
or random ones) before the ranks are taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from bole_cli.mtp.head import KeyValueStore, MTPHead, causal_mask

MISS = -1
# (depth, draft logits [A, V], the target's logits for the same tokens [A, V]) -> logits
Predict = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class PromptRanks:
    ranks: list  # per anchor, per depth: 0-based rank of the target's token, MISS if not in top-k
    generated: int  # tokens the target generated
    mismatches: int  # generated tokens that differ from the full forward's greedy token


def greedy_continuation(target: Any, ids: torch.Tensor, max_new: int) -> torch.Tensor:
    """prompt ids [1, P] -> prompt + greedy continuation [1, P + G], G <= max_new (EOS)."""
    from transformers import GenerationConfig

    gen = target.generation_config
    eos = gen.eos_token_id
    pad = gen.pad_token_id if gen.pad_token_id is not None else (
        eos[0] if isinstance(eos, list) and eos else eos)
    config = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                              pad_token_id=pad if pad is not None else 0)
    return target.generate(ids, generation_config=config)


def _ranks_of(logits: torch.Tensor, labels: torch.Tensor, topk: int) -> torch.Tensor:
    top = logits.float().topk(min(topk, logits.shape[-1]), dim=-1).indices  # [A, k]
    hit = top == labels[:, None]
    first = hit.int().argmax(dim=-1)
    return torch.where(hit.any(dim=-1), first, torch.full_like(first, MISS))


@torch.no_grad()
def teacher_forced_ranks(target: Any, head: MTPHead, seq: torch.Tensor, prompt_len: int,
                         depth: int, topk: int, predict: Optional[Predict] = None) -> PromptRanks:
    """Ranks for every anchor of one sequence seq [1, L] = prompt (prompt_len) + continuation."""
    s = seq[0]
    n = len(s)
    generated = n - prompt_len
    a0, a1 = prompt_len - 1, n - 1 - depth  # anchors t in [a0, a1]
    if a1 < a0:
        return PromptRanks([], generated, 0)
    h = target.model(input_ids=seq).last_hidden_state[0]  # [L, H], after the final norm
    # the target's logits and greedy tokens from the prompt's last position on
    target_logits = target.get_output_embeddings()(h[a0:])  # row r <-> position a0 + r
    y = target_logits.argmax(dim=-1)
    mismatches = int((y[:-1] != s[prompt_len:]).sum())
    anchors = torch.arange(a0, a1 + 1, device=s.device)
    count = len(anchors)

    store = KeyValueStore()
    m1 = head(s[1:], h[:-1], torch.arange(n - 1, device=s.device),
              causal_mask(n - 1, s.device), store)  # entry i = (s_{i+1}, h_i), position i
    m = m1[anchors]
    out = []
    for j in range(1, depth + 1):
        if j > 1:
            # anchor t, depth j: token s_{t+j} at MTP position t+j-1, hidden from depth j-1
            seen_prefix = torch.arange(n - 1, device=s.device)[None, :] <= anchors[:, None]
            own = torch.eye(count, dtype=torch.bool, device=s.device).repeat(1, j - 1)
            m = head(s[anchors + j], m, anchors + j - 1,
                     torch.cat([seen_prefix, own], dim=1), store)
        logits = head.lm_head(m)
        rows = anchors + j - a0  # target logits predicting s_{t+j+1}
        if predict is not None:
            logits = predict(j, logits, target_logits[rows])
        out.append(_ranks_of(logits, y[rows], topk))
    ranks = torch.stack(out, dim=1).tolist()
    return PromptRanks(ranks, generated, mismatches)
