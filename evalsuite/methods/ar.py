"""`ar`: plain autoregressive decoding. It drafts nothing, so every verify step emits exactly one token."""

from __future__ import annotations

import torch

from evalsuite.catalog import MethodSpec, Speculative
from evalsuite.methods.base import Method, Proposal, Sampling


SPEC = MethodSpec("ar", "no drafting: the target decodes one token per forward (the speedup baseline)",
                  engines={"vllm": Speculative(None)})


class AutoregressiveMethod(Method):
    name = "ar"

    def __init__(self, device: torch.device):
        self._empty = torch.empty(0, dtype=torch.long, device=device)

    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        return Proposal(tokens=self._empty)


def build(target, options: dict) -> Method:
    return AutoregressiveMethod(target.device)
