"""`ngram`: model-free prompt-lookup drafting.

It looks for the most recent earlier occurrence of the context's last n tokens (n from `max_ngram` down to
`min_ngram`) and proposes the k tokens that followed it. No training, no draft model; it shines on turns
that copy from their context (code edits, tool-result echoes).
"""

from __future__ import annotations

import torch

from evalsuite.catalog import MethodSpec, Option, Speculative, positive
from evalsuite.methods.base import Method, DraftState, Proposal, Sampling, tensor_bytes


SPEC = MethodSpec(
    "ngram", "prompt lookup: proposes the continuation of the latest earlier match of the last n tokens",
    options={"max_ngram": Option(int, "longest n-gram looked up (3)", positive, "must be >= 1", default=3),
             "min_ngram": Option(int, "shortest n-gram looked up (1)", positive, "must be >= 1", default=1)},
    engines={"vllm": Speculative("ngram", {"max_ngram": "prompt_lookup_max", "min_ngram": "prompt_lookup_min"})})


class PromptLookupMethod(Method):
    name = "ngram"

    def __init__(self, device: torch.device, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.device = device
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.ids = torch.empty(0, dtype=torch.long)  # whole context on the CPU, anchor last

    def start_turn(self, ids: torch.Tensor, features: torch.Tensor | None) -> None:
        self.ids = ids.detach().to("cpu", torch.long).clone()

    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor | None) -> None:
        self.ids = torch.cat([self.ids, new_ids.detach().to("cpu", torch.long)])

    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        ids = self.ids
        n = ids.numel()
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            pattern = ids[n - size:]
            windows = ids[: n - 1].unfold(0, size, 1)  # every earlier window whose continuation exists
            hits = (windows == pattern).all(dim=1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + size  # the most recent match
                continuation = ids[start: start + k]
                return Proposal(tokens=continuation.to(self.device))
        return Proposal(tokens=torch.empty(0, dtype=torch.long, device=self.device))

    def state_bytes(self) -> DraftState:
        # The lookup table is the token history itself: it grows with the context.
        return DraftState(history=tensor_bytes(self.ids))

    def describe(self) -> dict:
        return {**super().describe(), "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}


def build(target, options: dict) -> Method:
    return PromptLookupMethod(target.device, int(options.get("max_ngram", 3)), int(options.get("min_ngram", 1)))
