"""`ar`: plain autoregressive decoding. It drafts nothing, so every verify step emits exactly one token."""

from __future__ import annotations

import torch

from evalsuite.methods.base import Drafter, Proposal, Sampling, register


class AutoregressiveBaseline(Drafter):
    name = "ar"

    def __init__(self, device: torch.device):
        self._empty = torch.empty(0, dtype=torch.long, device=device)

    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        return Proposal(tokens=self._empty)


@register("ar", "no drafting: the target decodes one token per forward (the speedup baseline)")
def build(target, options: dict) -> Drafter:
    return AutoregressiveBaseline(target.device)
