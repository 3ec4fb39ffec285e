"""The one interface every method implements (`Method`), and how a method is built by name (`get_method`).

A *method* is a way of proposing draft tokens, including none (`ar`); the four learned methods load a *drafter*
(a trained draft model, `--drafter`). Each method declares itself, its settings and capabilities in its own file
(`SPEC = MethodSpec(...)`, read by `evalsuite.catalog` without torch); its module is imported only when it is built.

Bookkeeping convention, shared by the engine and every method:
- A method sees the context as token ids `ids[0..n]`, where `ids[n]` is the *anchor*: the newest token,
  already chosen by the target but not yet run through it.
- Target features exist for every position before the anchor: `features[i]` holds the target hidden states
  at position i for the layers the method asked for (`feature_layers`), shape [n, S, H].
- `start_turn(ids, features)` hands over the whole context at the start of a turn (after the target prefill).
- `propose(k, sampling)` returns k draft tokens continuing after the anchor.
- `commit(new_ids, new_features)` reports one verify step: `new_features` are the target features of the old
  anchor and the accepted drafts (m rows); `new_ids` are the accepted drafts plus the bonus token (m tokens,
  the new anchor last). The context therefore grows by m tokens and m feature rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from evalsuite.catalog import method_spec


@dataclass(frozen=True)
class Sampling:
    """Target sampling parameters. temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Proposal:
    tokens: torch.Tensor  # [k] int64 on the target device
    probs: torch.Tensor | None = None  # [k, V] float32: the distribution each token was drawn from (None = one-hot)


@dataclass(frozen=True)
class DraftState:
    """Draft-side memory in bytes. `history` grows with the context (draft KV, cached features);
    `working` is per-step scratch that does not (the block being drafted, RNN state)."""

    history: int = 0
    working: int = 0

    @property
    def total(self) -> int:
        return self.history + self.working


class Method:
    """Base class of every method; subclasses implement `propose` and whichever hooks they need."""

    name: ClassVar[str] = "base"
    feature_layers: tuple[int, ...] = ()  # target layer ids this method reads (HF convention: j → hidden_states[j+1])
    model: torch.nn.Module | None = None  # a learned method's own network (None: model-free)
    draft_products: str | None = None  # what that network runs on (`build_method`): "panel"[+attention] | "torch"
    checkpoint_hash: str | None = None
    checkpoint_path: str | None = None

    def start_turn(self, ids: torch.Tensor, features: torch.Tensor | None) -> None:
        """Whole context at the start of a turn: ids [n+1] (anchor last), features [n, S, H] or None."""

    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        raise NotImplementedError

    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor | None) -> None:
        """One verify step: m new tokens (accepted drafts + bonus) and the m feature rows before them."""

    def state_bytes(self) -> DraftState:
        return DraftState()

    def rewind_turn(self) -> None:
        """Forget what the turn just decoded taught this method, so that decoding it again (`--repeats`) does the
        same work; the engine calls it before every repeat after the first. Only methods that learn from their own
        replies (suffix's global tree) have anything to forget."""

    def reset(self) -> None:
        """Forget what earlier turns left behind (the runner calls it after its untimed warm-up). Only drafters
        that learn across turns (suffix's global tree) keep such state."""

    def describe(self) -> dict:
        """What run.json records about this method."""
        return {"method": self.name, "checkpoint": self.checkpoint_path, "checkpoint_sha256": self.checkpoint_hash,
                "feature_layers": list(self.feature_layers), "draft_products": self.draft_products}


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors. A serving engine's prefix cache keeps exactly
    this much of its KV across turns; the target's cache and the cache-keeping drafters do the same."""
    n = min(a.numel(), b.numel())
    if n == 0:
        return 0
    differ = (a[:n].to(b.device) != b[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# ---- building by name -------------------------------------------------------------------------------------------
# A method module defines `build(target, options) -> Method`; options holds the parsed `--method-option` settings
# (evalsuite.catalog) and, for learned methods, the drafter checkpoint (`drafter`). `get_method(name).factory` is it.
MethodFactory = Callable[..., Method]
get_method = method_spec


def build_method(name: str, target, options: dict) -> Method:
    """`name` built for `target` (a `TargetModel`), as the engines and the profile use it: the method's factory,
    then its own network's products put on the kernels the target's decoder runs on (`TargetModel.prepare_drafter`:
    the panels under `fused+panel`), recorded as `draft_products`. Training builds with the factory alone."""
    method = get_method(name).factory(target, options)
    if method.model is not None:
        method.draft_products = target.prepare_drafter(method.model)
    return method
