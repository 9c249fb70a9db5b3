"""The model's own MTP layer, as SGLang 0.5.23 runs it (docs/design.md §8).

SGLang's Qwen3.5 / Qwen3-Next MTP (where each piece sits in SGLang's source:
docs/sglang-0.5.23.md (f)): for a token x at position i and the target's final hidden
state h (after its last norm) at position i - 1,

    z = fc([norm_e(embed(x)), norm_h(h)])      m = norm(decoder_layer(z))      logits = lm_head(m)

with the target's embedding and LM head, one full-attention decoder layer of the model's own
kind (gated attention, and an MoE block on MoE models) and zero-centred RMS norms. A draft
step feeds m back as the next step's h. The checkpoint names the tensors `mtp.fc`,
`mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`;
transformers does not load them. The decoder layer here is transformers' own class for the
model (built from the target's config with one full-attention layer), so the layer's math is
the modeling code's; only the MTP wiring above is ours. Attention always gets an explicit
additive mask (sdpa), so callers decide what each query sees (bole_cli/mtp/measure.py).
"""

from __future__ import annotations

import copy
import re
from typing import Any, Optional

import torch
from torch import nn

from bole_cli.errors import InputError

_HEAD_KEYS = ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight",
              "norm.weight")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class KeyValueStore:
    """The one MTP layer's keys and values across calls (duck-types transformers' Cache
    for a single layer): each call appends its keys after the stored ones."""

    def __init__(self) -> None:
        self.key: Optional[torch.Tensor] = None
        self.value: Optional[torch.Tensor] = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int = 0,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key is None:
            self.key, self.value = key, value
        else:
            self.key = torch.cat([self.key, key], dim=-2)
            self.value = torch.cat([self.value, value], dim=-2)
        return self.key, self.value

    @property
    def length(self) -> int:
        return 0 if self.key is None else int(self.key.shape[-2])


def causal_mask(n: int, device: Any) -> torch.Tensor:
    """[n, n] bool: query i sees keys 0..i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


class MTPHead(nn.Module):
    """The MTP layer over the target's embedding, rotary embedding and LM head."""

    def __init__(self, layer: nn.Module, norm_cls: type, hidden: int, eps: float,
                 target: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = norm_cls(hidden, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(hidden, eps=eps)
        self.layer = layer
        self.norm = norm_cls(hidden, eps=eps)
        # the target's modules, shared (not registered: they are not the head's weights)
        self._target = (target.get_input_embeddings(), target.get_output_embeddings(),
                        target.model.rotary_emb)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._target[0](token_ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._target[1](hidden)

    def forward(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                mask: Optional[torch.Tensor] = None,
                store: Optional[KeyValueStore] = None) -> torch.Tensor:
        """token_ids [n], hidden [n, H] (the state that predicted each token), positions [n];
        mask [n, keys] bool over (stored keys, then these n), default causal. Returns the
        MTP's output hidden states m [n, H] (after its norm); lm_head(m) are the logits."""
        z = torch.cat([self.pre_fc_norm_embedding(self.embed(token_ids)),
                       self.pre_fc_norm_hidden(hidden.to(self.fc.weight.dtype))], dim=-1)
        z = self.fc(z)[None]
        if mask is None:
            mask = causal_mask(len(token_ids), z.device)
            if store is not None and store.length:
                mask = torch.cat([mask.new_ones(len(token_ids), store.length), mask], dim=1)
        additive = torch.zeros(mask.shape, dtype=z.dtype, device=z.device)
        additive.masked_fill_(~mask, torch.finfo(z.dtype).min)
        pos = positions[None]
        out = self.layer(z, position_embeddings=self._target[2](z, pos),
                         attention_mask=additive[None, None], position_ids=pos, cache=store)
        if isinstance(out, tuple):
            out = out[0]
        return self.norm(out[0])


def _fuse_experts(tensors: dict, where: str) -> dict:
    """Per-expert checkpoint tensors (mlp.experts.E.{gate,up,down}_proj.weight) -> the
    stacked parameters transformers' expert modules hold (gate_up_proj, down_proj)."""
    experts: dict = {}
    out = {}
    for key, value in tensors.items():
        m = _EXPERT.match(key)
        if m:
            experts.setdefault(int(m.group(1)), {})[m.group(2)] = value
        else:
            out[key] = value
    if experts:
        ids = sorted(experts)
        if ids != list(range(len(ids))) or any(len(e) != 3 for e in experts.values()):
            raise InputError(f"{where}: the MTP layer's experts are incomplete")
        out["mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]], dim=0) for e in ids])
        out["mlp.experts.down_proj"] = torch.stack([experts[e]["down_proj"] for e in ids])
    return out


def _checkpoint_name(key: str) -> str:
    """A head parameter's name in the checkpoint (layer.X -> mtp.layers.0.X)."""
    return "mtp." + ("layers.0." + key[len("layer."):] if key.startswith("layer.") else key)


def build_head(target: nn.Module, tensors: dict, where: str) -> MTPHead:
    """The MTP head of `target` with the checkpoint's `mtp.*` tensors (prefix removed);
    InputError names the missing or mismatched tensors. `where` names the checkpoint."""
    base = target.model
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = 1
    config.layer_types = ["full_attention"]
    if hasattr(config, "mlp_only_layers"):
        config.mlp_only_layers = []
    config._attn_implementation = "sdpa"  # explicit masks: flash attention would drop them
    layer = type(base.layers[0])(config, 0)
    norm_cls = type(base.norm)
    head = MTPHead(layer, norm_cls, config.hidden_size, config.rms_norm_eps, target)

    missing = [k for k in _HEAD_KEYS if k not in tensors]
    layer_tensors = {k[len("layers.0."):]: v for k, v in tensors.items()
                     if k.startswith("layers.0.")}
    if missing or not layer_tensors:
        names = ", ".join(f"mtp.{k}" for k in missing + ([] if layer_tensors else ["layers.0.*"]))
        raise InputError(f"{where}: the MTP weights are incomplete: missing {names}")
    state = {f"layer.{k}": v for k, v in _fuse_experts(layer_tensors, where).items()}
    state.update({k: tensors[k] for k in _HEAD_KEYS})
    expected = head.state_dict()
    absent = sorted(set(expected) - set(state))
    if absent:
        raise InputError(f"{where}: the MTP layer does not match the model's config: missing "
                         f"{_checkpoint_name(absent[0])}"
                         + (f" and {len(absent) - 1} more" if len(absent) > 1 else ""))
    for k in expected:
        if tuple(state[k].shape) != tuple(expected[k].shape):
            raise InputError(f"{where}: MTP tensor {_checkpoint_name(k)} has "
                             f"shape {tuple(state[k].shape)}, the config gives "
                             f"{tuple(expected[k].shape)}")
    head.load_state_dict({k: state[k] for k in expected}, strict=True)
    weight = target.get_output_embeddings().weight
    return head.to(device=weight.device, dtype=weight.dtype).eval()
