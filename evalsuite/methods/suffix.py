"""`suffix`: SuffixDecoding (model-free) through `arctic-inference`'s `SuffixDecodingCache`.

Two suffix trees, as in the paper: a per-request tree over the turn's context (its prompt, then its own reply as
it grows) and a global tree over the outputs of every earlier turn of the run. Each step matches the newest
`max_depth` tokens against both trees and proposes the continuation with the higher score (the sum of the
estimated probabilities of its tokens).

How it maps onto the drafter interface:
- one turn = one request: `start_turn` closes the previous request (its context tree is dropped, its reply stays
  in the global tree) and opens a new one on the context; the anchor (the first reply token) is its first
  response token;
- `commit` appends the accepted drafts and the bonus token to the response: the library extends both the
  request's tree and the global tree, so the global tree learns every reply token as it is committed;
- drafts are a single chain: the library's path speculation follows the most frequent child at every node, i.e.
  the best chain of the speculation tree (no tree verification here). Their probabilities are not a distribution
  over the vocabulary, so at T>0 the proposal is treated as one-hot (as for ngram);
- `reset` (after the runner's warm-up) forgets every tree, so that only the run's own outputs are learned.

State: the library reports each tree's bytes (`SuffixTree.estimate_memory`: nodes, child groups and the stored
token sequences). `history` is the request tree plus the global tree; the global part grows with every reply
seen and never shrinks unless `max_cached_requests` evicts old replies.
"""

from __future__ import annotations


import numpy as np
import torch

from evalsuite.catalog import MethodSpec, Option, Speculative
from evalsuite.errors import UserError
from evalsuite.methods.base import Method, DraftState, Proposal, Sampling


SPEC = MethodSpec(
    "suffix", "SuffixDecoding (arctic-inference): suffix trees over the context and over earlier replies",
    options={"max_depth": Option(int, "tokens matched against the trees (64)", lambda v: v >= 2, "must be >= 2"),
             "max_spec_factor": Option(float, "draft length per matched token (1.0)", lambda v: v >= 0,
                                       "must be >= 0"),
             "max_spec_offset": Option(float, "draft length offset (0)"),
             "min_token_prob": Option(float, "smallest estimated probability followed (0.1)",
                                      lambda v: 0 <= v <= 1, "must be in [0, 1]"),
             "max_cached_requests": Option(int, "replies kept in the global tree (-1 = all)", lambda v: v != 0,
                                           "0 would switch the global tree off; use -1 for no limit")},
    learns_across_turns=True,  # and forgets a repeated turn's reply (rewind_turn)
    engines={"vllm": Speculative("suffix", needs="arctic-inference in vLLM's venv")})


INSTALL_HINT = "method suffix needs arctic-inference==0.3.0: pip install 'evalsuite[suffix]' (see scripts/setup.sh)"


def _load_cache_class():
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as err:
        raise UserError(f"{INSTALL_HINT} ({err})") from None
    return SuffixDecodingCache


class SuffixMethod(Method):
    name = "suffix"

    def __init__(self, device: torch.device, max_depth: int = 64, max_spec_factor: float = 1.0,
                 max_spec_offset: float = 0.0, min_token_prob: float = 0.1, max_cached_requests: int = -1):
        self.device = device
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.max_spec_offset = max_spec_offset
        self.min_token_prob = min_token_prob
        self.max_cached_requests = max_cached_requests
        self._cache_class = _load_cache_class()
        self.reset()

    def reset(self) -> None:
        self.cache = self._cache_class(max_tree_depth=self.max_depth, max_cached_requests=self.max_cached_requests)
        self._next_request = 0
        self.request: int | None = None
        self.tail: list[int] = []  # the newest max_depth tokens of the context, anchor last
        self._calls: list[tuple] = []  # every call that changed the trees since the reset, in order (rewind_turn)
        self._turn_start = (0, 0, None, [])  # (calls, next request id, request, tail) when the current turn started

    def _call(self, name: str, *args) -> None:
        self._calls.append((name, *args))
        getattr(self.cache, name)(*args)

    def start_turn(self, ids: torch.Tensor, features: torch.Tensor | None) -> None:
        self._turn_start = (len(self._calls), self._next_request, self.request, list(self.tail))
        if self.request is not None:
            self._call("stop_request", self.request)
        ids = ids.detach().to("cpu", torch.int32).numpy()
        self.request, self._next_request = self._next_request, self._next_request + 1
        self._call("start_request", self.request, np.ascontiguousarray(ids[:-1]))  # the context (prompt)
        self._call("add_active_response", self.request, np.ascontiguousarray(ids[-1:]))  # the anchor: first reply
        self.tail = ids[-self.max_depth:].tolist()

    def rewind_turn(self) -> None:
        """A repeat of the turn: the trees are rebuilt by replaying, into a fresh cache, every call made before the
        turn started, so the repeat starts from exactly the state the first decode of the turn started from (the
        library's own eviction leaves the trees shaped differently, and drafts can differ)."""
        calls, self._next_request, self.request, self.tail = self._turn_start
        self._calls = self._calls[:calls]
        self.cache = self._cache_class(max_tree_depth=self.max_depth, max_cached_requests=self.max_cached_requests)
        for name, *args in self._calls:
            getattr(self.cache, name)(*args)

    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor | None) -> None:
        tokens = new_ids.detach().to("cpu", torch.int32).numpy()
        self._call("add_active_response", self.request, np.ascontiguousarray(tokens))
        self.tail = (self.tail + tokens.tolist())[-self.max_depth:]

    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        draft = self.cache.speculate(self.request, self.tail, max_spec_tokens=k, max_spec_factor=self.max_spec_factor,
                                     max_spec_offset=self.max_spec_offset, min_token_prob=self.min_token_prob,
                                     use_tree_spec=False)
        return Proposal(tokens=torch.tensor(list(draft.token_ids)[:k], dtype=torch.long, device=self.device))

    def tree_bytes(self) -> tuple[int, int]:
        """(request tree, global tree) bytes as the library estimates them. The cache keeps its trees in private
        attributes; estimate_memory is the native trees' own count."""
        local = self.cache._local_trees.get(self.request) if self.request is not None else None
        return (local.estimate_memory() if local is not None else 0), self.cache._global_tree.estimate_memory()

    def state_bytes(self) -> DraftState:
        local, shared = self.tree_bytes()
        return DraftState(history=local + shared)

    def describe(self) -> dict:
        return {**super().describe(), "library": "arctic-inference", "library_version": _library_version(),
                "max_depth": self.max_depth, "max_spec_factor": self.max_spec_factor,
                "max_spec_offset": self.max_spec_offset, "min_token_prob": self.min_token_prob,
                "max_cached_requests": self.max_cached_requests, "use_tree_spec": False,
                "draft_shape": "chain (path speculation: most frequent child at each node)",
                "global_tree": "replies of earlier turns in this process, in run order (not restored by --resume)"}


def _library_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("arctic-inference")
    except PackageNotFoundError:
        return None


def build(target, options: dict) -> Method:
    """`options`: the settings parsed by evalsuite.catalog (max_depth, max_spec_factor, ...)."""
    return SuffixMethod(target.device, **options)
