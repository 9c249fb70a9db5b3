"""The measured StepTimer of `bole calibrate`: the runtime's verify and decode timer, plus
the drafter's levels and sampling, which the decision adds to a step (docs/design.md §8).

The drafter is `bole bench e2e`'s (bole_cli/bench/drafter.py: fc, one gated-attention
layer and the MLP at the target's width, the target's LM head), on the timer's model, so
that calibrate prices the same head the end-to-end bench runs. One level is timed alone in
a CUDA graph: level 1 with one row per request, a tree's further levels with top-k rows.
Sampling is the target's argmax over the step's logits and the tokens' trip to the host,
timed by the wall clock around the sync (what a serving engine waits for). On a CPU (the
tests) the level runs eagerly under the wall clock.
"""

from __future__ import annotations

from typing import Any, Optional

from bole_cli.timing import capture, seconds_per_call


class MeasuredForward:
    """calibrate.sweep.StepTimer on the GPU: `timer` (runtime.timer.HybridForwardTimer)
    times decode and verify; this adds time_draft_level and time_sample."""

    def __init__(self, timer: Any, *, inner: int = 3, draft_vocab: Optional[int] = None):
        """draft_vocab: the drafter's hot tokens (SGLang's --speculative-token-map), None for
        the full vocabulary."""
        self.timer = timer
        self.inner = inner
        self.draft_vocab = draft_vocab
        self.device_name = timer.device_name
        self._drafters: dict[int, Any] = {}
        self._graphs: dict[tuple, Any] = {}
        self._logits: dict[int, Any] = {}

    def release(self) -> None:
        """Drop the drafters, their graph and cache, and the sample's logits. The sweep times
        them after a configuration's verify points; held on, they would sit beside the next
        configuration's biggest verify (at 27B, four heads of 0.79 GiB and 0.5 GiB of logits,
        where the estimate counts one head: experiments/NOTES.md "The estimate's GPU memory").
        The heads are rebuilt from the same seed: the same weights."""
        self._graphs.clear()
        self._drafters.clear()
        self._logits.clear()

    def time_decode(self, batch: int, kv_len: int) -> float:
        self.release()
        return self.timer.time_decode(batch, kv_len)

    def time_verify(self, batch: int, kv_len: int, n_tree_tokens: int) -> float:
        self.release()
        return self.timer.time_verify(batch, kv_len, n_tree_tokens)

    def _drafter(self, rows: int) -> Any:
        from bole_cli.bench.drafter import MTPDrafter, build_layout

        if rows not in self._drafters:
            probs = [[0.5 / rows] * rows] * 2  # the shape only: depth 2, `rows` wide
            self._drafters[rows] = MTPDrafter(self.timer.model, build_layout(2, rows, probs),
                                              draft_vocab=self.draft_vocab)
        return self._drafters[rows]

    @property
    def _cuda(self) -> bool:
        return self.timer.device.type == "cuda"

    def time_draft_level(self, batch: int, kv_len: int, rows: int) -> float:
        """Seconds of one drafter level over `rows` rows per request (level 1 when rows is 1,
        else the second level of a `rows`-wide beam) at context `kv_len`."""
        import torch

        own = getattr(self.timer, "time_draft_level", None)
        if callable(own):  # a runtime that times its own drafter
            return own(batch, kv_len, rows)
        key = ("draft", batch, kv_len, rows)
        if key not in self._graphs:
            self._graphs.clear()  # one shape at a time: its KV cache is the big buffer
            drafter = self._drafter(rows)
            st = drafter.new_state(batch, kv_len)
            lvl = 0 if rows == 1 else 1
            gen = torch.Generator(device=drafter.device).manual_seed(batch * 31 + rows)
            tokens = torch.randint(drafter.draft_vocab, (batch, rows), generator=gen,
                                   device=drafter.device)
            hidden = torch.randn(batch, rows, self.timer.spec.hidden, generator=gen,
                                 device=drafter.device, dtype=drafter.dtype)

            def level():
                with torch.inference_mode():
                    drafter.level(st, lvl, tokens, hidden, 1 if lvl else 0)

            run = capture(torch, level)[0].replay if self._cuda else level
            self._graphs[key] = (run, st, tokens, hidden)
        return seconds_per_call(torch, self._graphs[key][0], self.inner, cuda=self._cuda)

    def time_sample(self, batch: int, tokens: int) -> float:
        """Seconds to take the argmax of `tokens` rows of logits and bring it to the host."""
        import torch

        own = getattr(self.timer, "time_sample", None)
        if callable(own):
            return own(batch, tokens)
        logits = self._logits.get(tokens)
        if logits is None:
            self._logits.clear()
            spec = self.timer.spec
            logits = torch.randn(tokens, spec.vocab, device=self.timer.device,
                                 dtype=self.timer.dtype)
            self._logits[tokens] = logits
        if self._cuda:
            torch.cuda.synchronize()
        return seconds_per_call(torch, lambda: logits.argmax(-1).tolist(), self.inner, cuda=False)

    def info(self) -> dict[str, Any]:
        details = dict(self.timer.info())
        details["drafter"] = ("bole bench e2e's MTP-style head (bole_cli/bench/drafter.py), "
                              "one level timed alone in a CUDA graph"
                              + (f", scoring {self.draft_vocab:,} hot tokens" if self.draft_vocab else ""))
        details["sample"] = "argmax over the step's logits + the host sync (wall clock)"
        return details
