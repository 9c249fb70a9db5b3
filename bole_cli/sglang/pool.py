"""A MambaPool without per-node snapshots (built on SGLang 0.5.23's MambaPool at run time).

`bole_pool_class(MambaPool, plan)` returns a subclass whose __init__ lets SGLang allocate
everything a non-speculative pool has (conv and temporal states, same layout, same
memory-saver region, same logging), then, instead of
``intermediate_ssm [L, rows, D, HV, V, K]`` and ``intermediate_conv_window [L, rows, D,
conv_dim, W-1]`` (MambaPool.__init__), allocates Bole's factor arena and exposes a
``SpeculativeState`` whose

- ``intermediate_ssm`` is a zero-stride placeholder of the right shape (4 bytes): the
  GDN verify branch asserts it is not None (GDNAttnBackend.forward_extend) and hands it to
  target_verify, whose Bole hook never touches it;
- per-layer ``intermediate_conv_window`` is ``[None]``: SGLang's tree or chain conv then
  skips its window snapshots (SAVE_INTERMEDIATE=False); the tree conv still fills
  retrieve_parent_token.

Trees and chains (top-k 1; SGLang would allocate deduplicated conv windows for those)
get the same arena. Anything Bole does not handle (ReplaySSM, envelope layout, no
speculation, a draft shape other than the plan's) gets SGLang's own pool unchanged. The
pool carries ``bole_store`` (a FactorStore, or None). docs/design.md §6.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from typing import Any, Optional

from bole_cli.memory import GiB, format_bytes
from bole_cli.sglang.plan import BolePlan, is_chain

logger = logging.getLogger("bole_cli.sglang.plugin")

_STATE_CLASSES: dict[type, type] = {}


def bole_state_class(spec_state_cls: type) -> type:
    """SGLang's MambaPool.SpeculativeState with Bole's per-layer view and memory count."""
    if spec_state_cls in _STATE_CLASSES:
        return _STATE_CLASSES[spec_state_cls]

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class BoleSpeculativeState(spec_state_cls):  # type: ignore[misc, valid-type]
        def at_layer_idx(self, layer: int):
            kwargs = {}
            for f in dataclasses.fields(self):
                value = getattr(self, f.name)
                if f.name == "intermediate_conv_window":
                    kwargs[f.name] = [None] * len(self.conv)
                elif value is None:
                    kwargs[f.name] = None
                elif f.name == "conv":
                    kwargs[f.name] = [c[layer] for c in value]
                else:
                    kwargs[f.name] = value[layer]
            return type(self)(**kwargs)

        def mem_usage_bytes(self):
            tensors = [*self.conv, self.temporal] + [
                getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name.startswith("replayssm_") and getattr(self, f.name) is not None]
            return sum(t.numel() * t.element_size() for t in tensors)

    BoleSpeculativeState.__qualname__ = BoleSpeculativeState.__name__
    _STATE_CLASSES[spec_state_cls] = BoleSpeculativeState
    return BoleSpeculativeState


def _kv_region(pool: Any):
    """The memory-saver region SGLang allocates pool tensors in (a no-op without one)."""
    adapter = getattr(pool, "memory_saver_adapter", None)
    module = sys.modules.get(type(pool).__mro__[1].__module__)
    tag = getattr(module, "GPU_MEMORY_TYPE_KV_CACHE", None)
    if adapter is None or tag is None:
        return contextlib.nullcontext()
    return adapter.region(tag)


def eligible_pool_kwargs(kw: dict, plan: Optional[BolePlan] = None) -> str:
    """Why SGLang's own pool must be built for these MambaPool kwargs ("" if Bole's can).

    A chain (speculative_eagle_topk None or <= 1, SGLang's meaning) takes Bole's pool like
    a tree, but only under a plan made for the same shape of draft: `plan.decide` read the
    top-k from the same server arguments, so a mismatch means SGLang changed under us."""
    if kw.get("speculative_num_draft_tokens") is None:
        return "no speculative decoding"
    for flag in ("enable_linear_replayssm", "enable_linear_replayssm_spec", "envelope_layout"):
        if kw.get(flag):
            return f"{flag} is on"
    topk = kw.get("speculative_eagle_topk")
    chain = is_chain(topk)
    if not chain and not isinstance(topk, int):
        return f"speculative_eagle_topk {topk!r}"
    if plan is not None and chain != plan.chain:
        return (f"speculative_eagle_topk {topk!r} (a {'chain' if chain else 'tree'}) but the plan "
                f"was made for a {plan.mode}")
    return ""


def bole_pool_class(mamba_pool_cls: type, plan: BolePlan) -> type:
    """A subclass of SGLang's MambaPool that allocates `plan`'s arena instead of snapshots."""

    class BoleMambaPool(mamba_pool_cls):  # type: ignore[misc, valid-type]
        bole_plan = plan

        def __init__(self, **kw):
            self.bole_store = None
            why = eligible_pool_kwargs(kw, self.bole_plan)
            if why:
                logger.info("Bole: keeping SGLang's MambaPool (%s)", why)
                super().__init__(**kw)
                return
            draft_tokens = int(kw["speculative_num_draft_tokens"])
            super().__init__(**dict(kw, speculative_num_draft_tokens=None))
            self._bole_install(draft_tokens, int(kw["spec_state_size"]))

        def _bole_install(self, draft_tokens: int, spec_state_size: int) -> None:
            import torch

            from bole_cli.sglang.factors import FactorStore

            cache = self.mamba_cache
            temporal, conv = cache.temporal, list(cache.conv)
            layers, _, hv, vdim, kdim = temporal.shape
            the_plan = dataclasses.replace(
                self.bole_plan, layers=int(layers), draft_tokens=draft_tokens,
                rows=max(self.bole_plan.rows, spec_state_size + 1),
                value_heads=int(hv), value_dim=int(vdim), key_dim=int(kdim),
                conv_dim=int(conv[0].shape[-2]), conv_window=int(conv[0].shape[-1]),
                ssm_dtype=str(temporal.dtype).removeprefix("torch."),
                conv_dtype=str(conv[0].dtype).removeprefix("torch."))
            with _kv_region(self):
                store = FactorStore(the_plan, temporal.device)
                placeholder = torch.zeros(1, dtype=temporal.dtype, device=temporal.device).expand(
                    int(layers), the_plan.rows, draft_tokens, int(hv), int(vdim), int(kdim))
            state_cls = bole_state_class(self.SpeculativeState)
            extra = {f.name: getattr(cache, f.name) for f in dataclasses.fields(cache)
                     if f.name not in ("conv", "temporal")}
            self.mamba_cache = state_cls(conv=conv, temporal=temporal, intermediate_ssm=placeholder,
                                         intermediate_conv_window=[], **extra)
            self._intermediate_conv_window_phys = []
            self.bole_store = store.bind(temporal)
            self.mem_usage = (self.mamba_cache.mem_usage_bytes() + store.nbytes) / GiB
            sglang_rows = spec_state_size + 1  # what SGLang's MambaPool would have allocated
            logger.info(
                "Bole: no per-node snapshot buffers (%s verify): intermediate_ssm + "
                "intermediate_conv_window would take %s (%d GDN layers x %d rows x %d draft "
                "tokens); Bole's factor arena takes %s (%d rows)", the_plan.mode,
                format_bytes(dataclasses.replace(the_plan, rows=sglang_rows).snapshot_bytes()),
                the_plan.layers, sglang_rows, draft_tokens, format_bytes(store.nbytes), the_plan.rows)

    BoleMambaPool.__qualname__ = BoleMambaPool.__name__
    BoleMambaPool.__module__ = __name__
    return BoleMambaPool
