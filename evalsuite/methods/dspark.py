"""`dspark`: DSpark (Cheng et al. 2026), DeepSpec `Qwen3DSparkModel` (docs/methods.md §4).

The DFlash backbone — target layers fused by `fc` + `hidden_norm`, Qwen3 layers with bidirectional block
attention over a draft KV cache of the whole context, absolute positions — with DeepSpec's block layout:
the block is [anchor, MASK × (B-1)] and *every* slot predicts, slot j (position a+j) proposing the token at
a+j+1, so block 7 gives 7 proposals (DeepSpec `build_dspark_proposal`: `block_hidden[:, :block_size]`).
The logits are `lm_head(h_j)` plus the Markov head's bias from the previous token (x_0 = the anchor), sampled
left to right (DeepSpec `markov_head.py`); the draft samples at the target temperature and its proposal
distribution is softmax(corrected logits / T) (DeepSpec `logits_to_probs`). The confidence head
(`AcceptRatePredictor`, Linear(H [+ r] → 1) on [h_j ; markov_w1[x_{j-1}]]) is loaded; with a
`confidence_threshold` > 0 the block is cut at the first slot whose sigmoid falls below it (DeepSpec
`_confident_prefix_length`), 0 (the default, as in DeepSpec's eval) verifies the full block.

DeepSpec's own DFlash baseline (`dflash_qwen3_*_block7`) is this model with `markov_rank 0` and no confidence
head; `dflash` runs it through `DeepSpecMethod` below.

Released keys (unprefixed): `embed_tokens.weight`, `lm_head.weight`, `fc.weight`, `hidden_norm.weight`,
`norm.weight`, `layers.{i}.…`, `markov_head.markov_w1.weight` [V,r], `markov_head.markov_w2.weight` [V,r]
(gated: `markov_head.gate_proj.{weight,bias}`; rnn: `markov_head.joint_proj.{weight,bias}`),
`confidence_head.proj.{weight,bias}`. Config keys are flat: `block_size`, `mask_token_id`, `target_layer_ids`,
`num_target_layers`, `num_anchors`, `enable_confidence_head`, `confidence_head_with_markov`, `markov_rank`,
`markov_head_type`.

Random-init default (no checkpoint): block 7, 5 layers with the target's layer sizes, target layers chosen by
z-lab's rule (1 … L-3), Markov rank 256 vanilla, confidence head with Markov features, and the target's own
embedding and lm_head (shared; a frozen copy would hold the same values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from evalsuite.catalog import SEED, MethodSpec, Option
from evalsuite.methods.base import Method, Proposal, Sampling
from evalsuite.methods.checkpoints import check_fit, drafter_source, load_checkpoint, load_weights
from evalsuite.methods.draft_layers import (
    ContextCacheMethod, FusedContextBackbone, next_token, default_layer_config, default_mask_token_id,
    evenly_spaced_zlab, init_random_, materialize, qwen3_config, require, stack_proposal,
)


SPEC = MethodSpec(
    "dspark", "DSpark (DeepSpec): DFlash backbone, every slot predicts, Markov head, confidence head", True,
    {"confidence_threshold": Option(float, "truncate the block at the first slot whose confidence is below it "
                                    "(0 = off)", lambda v: 0 <= v <= 1, "must be in [0, 1]"),
     "seed": SEED},
    windowable=True, batched=True,
    not_in={"vllm": "vLLM's dspark is DeepSeek-V4 only and its sparse attention does not run on CPU"})


MARKOV_KINDS = ("vanilla", "gated", "rnn")
DEFAULT_BLOCK = 7
DEFAULT_LAYERS = 5
DEFAULT_FEATURE_LAYERS = 5
DEFAULT_MARKOV_RANK = 256
RANDOM_SEED = 0


@dataclass(frozen=True)
class DeepSpecLayout:
    """What config.json says about a `Qwen3DSparkModel` beyond its Qwen3 layer sizes."""

    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    markov_rank: int
    markov_head_type: str | None
    confidence_head: bool
    confidence_with_markov: bool

    @classmethod
    def from_config(cls, config: dict, who: str) -> "DeepSpecLayout":
        for key in ("block_size", "target_layer_ids", "mask_token_id", "num_anchors", "enable_confidence_head",
                    "markov_rank"):
            require(key in config, who, f"config.json lacks '{key}' (required by Qwen3DSparkModel)")
        rank = int(config["markov_rank"])
        require(rank >= 0, who, f"markov_rank must be >= 0, got {rank}")
        kind = None
        if rank > 0:
            require("markov_head_type" in config, who, "markov_head_type is required when markov_rank > 0")
            kind = str(config["markov_head_type"]).lower()
            require(kind in MARKOV_KINDS, who, f"markov_head_type '{kind}' is not one of {MARKOV_KINDS}")
        confidence = bool(config["enable_confidence_head"])
        with_markov = False
        if confidence:
            require("confidence_head_with_markov" in config, who,
                    "confidence_head_with_markov is required when enable_confidence_head is true")
            with_markov = bool(config["confidence_head_with_markov"])
            require(not with_markov or rank > 0, who, "a confidence head with Markov features needs markov_rank > 0")
        ids = tuple(int(j) for j in config["target_layer_ids"])
        require(bool(ids) and all(b > a for a, b in zip(ids, ids[1:])), who,
                f"target_layer_ids {list(ids)} must be non-empty and strictly increasing")
        block = int(config["block_size"])
        require(block >= 1, who, f"block_size must be >= 1, got {block}")
        layers = config.get("num_target_layers")
        return cls(block, int(config["mask_token_id"]), ids, None if layers is None else int(layers), rank, kind,
                   confidence, with_markov)


class MarkovHead(nn.Module):
    """DeepSpec `markov_head.py`: bias_j = markov_w2(·) added to lm_head(h_j), from the previous token x_{j-1}.

    vanilla: w2(w1[x]);  gated: w2(σ(gate_proj([h; w1[x]])) ⊙ w1[x]);
    rnn: [g, c, o] = joint_proj([s; w1[x]; h]), s' = σ(g)⊙s + (1-σ(g))⊙tanh(c), bias = w2(tanh(o)), s_0 = 0."""

    def __init__(self, kind: str, vocab: int, rank: int, hidden: int):
        super().__init__()
        self.kind = kind
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def initial_state(self, like: torch.Tensor) -> torch.Tensor | None:
        return like.new_zeros(self.rank) if self.kind == "rnn" else None

    def step(self, prev_token: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None):
        """prev_token: 0-d id; hidden [H]. Returns (bias [V], new state)."""
        e = self.markov_w1(prev_token)
        if self.kind == "vanilla":
            return self.markov_w2(e), state
        if self.kind == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, e]))).to(e.dtype)
            return self.markov_w2(gate * e), state
        gate_raw, candidate, output = self.joint_proj(torch.cat([state, e, hidden])).chunk(3)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(output)), state


class ConfidenceHead(nn.Module):
    """DeepSpec `AcceptRatePredictor`: one logit per slot."""

    def __init__(self, inputs: int):
        super().__init__()
        self.proj = nn.Linear(inputs, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DeepSpecBlockModel(FusedContextBackbone):
    """`Qwen3DSparkModel` weights: backbone + fc/hidden_norm + own embed_tokens/lm_head + optional heads."""

    def __init__(self, cfg, layout: DeepSpecLayout, own_embed: bool, own_head: bool):
        super().__init__(cfg, len(layout.target_layer_ids))
        if own_embed:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if own_head:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if layout.markov_rank > 0:
            self.markov_head = MarkovHead(layout.markov_head_type, cfg.vocab_size, layout.markov_rank,
                                          cfg.hidden_size)
        if layout.confidence_head:
            extra = layout.markov_rank if layout.confidence_with_markov else 0
            self.confidence_head = ConfidenceHead(cfg.hidden_size + extra)


class DeepSpecMethod(ContextCacheMethod):
    """Drafting with a `Qwen3DSparkModel` (DeepSpec `_propose` + `build_dspark_proposal`)."""

    name = "dspark"

    def __init__(self, target, model: DeepSpecBlockModel, layout: DeepSpecLayout, confidence_threshold: float,
                 provenance: dict):
        embed = model.embed_tokens if hasattr(model, "embed_tokens") else target.embed_tokens
        super().__init__(model, embed, layout.block_size, layout.mask_token_id, layout.target_layer_ids,
                         target.device)
        self.layout = layout
        self.lm_head = model.lm_head if hasattr(model, "lm_head") else target.lm_head
        self.markov = getattr(model, "markov_head", None)
        self.confidence = getattr(model, "confidence_head", None)
        self.confidence_threshold = float(confidence_threshold)
        self.provenance = provenance

    @torch.inference_mode()
    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        hidden = self.block_outputs()[: min(k, self.block_size)]  # every slot predicts: slot j → a+j+1
        base = self.lm_head(hidden)
        previous = torch.tensor(self.anchor, device=self.device)
        state = self.markov.initial_state(hidden[0]) if self.markov is not None else None
        tokens, probs, prev_ids = [], [], []
        for j in range(hidden.shape[0]):
            logits = base[j]
            if self.markov is not None:
                bias, state = self.markov.step(previous, hidden[j], state)
                logits = logits + bias
            token, dist = next_token(logits, sampling.temperature, generator)
            prev_ids.append(previous)
            tokens.append(token)
            probs.append(dist)
            previous = token
        keep = len(tokens)
        if self.confidence is not None and self.confidence_threshold > 0.0 and tokens:
            keep = self._confident_prefix(hidden, torch.stack(prev_ids))
        return stack_proposal(tokens[:keep], probs[:keep], self.device)

    def _confident_prefix(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> int:
        features = hidden
        if self.layout.confidence_with_markov:
            features = torch.cat([hidden, self.markov.markov_w1(prev_ids).to(hidden.dtype)], dim=-1)
        confidence = torch.sigmoid(self.confidence(features).float())
        low = (confidence < self.confidence_threshold).nonzero()
        return int(low[0]) if low.numel() else confidence.numel()

    def describe(self) -> dict:
        layout = self.layout
        return {**super().describe(), **self.provenance, "block_size": layout.block_size,
                "mask_token_id": layout.mask_token_id, "slots_predict": "all (slot j → position a+j+1)",
                "markov_head": layout.markov_head_type if layout.markov_rank else None,
                "markov_rank": layout.markov_rank, "confidence_head": layout.confidence_head,
                "confidence_threshold": self.confidence_threshold if self.confidence is not None else None,
                "embed_tokens": self._source("embed_tokens"), "lm_head": self._source("lm_head")}

    def _source(self, module: str) -> str:
        if hasattr(self.model, module):
            return "checkpoint"
        return "target (not in checkpoint)" if self.provenance.get("weights") == "checkpoint" else "target"


def build_deepspec(target, options: dict, method: str, drafter_class: type[DeepSpecMethod],
                   random_layout: Callable[[object], DeepSpecLayout]) -> DeepSpecMethod:
    """Load a `Qwen3DSparkModel` checkpoint for `method` (or build the random-init default) and check its fit."""
    who = method
    threshold = float(options.get("confidence_threshold") or 0.0)  # checked by evalsuite.catalog
    source = drafter_source(method, options, target)
    if source is None:
        layout = random_layout(target)
        cfg = default_layer_config(target, DEFAULT_LAYERS)
        model = materialize(lambda: DeepSpecBlockModel(cfg, layout, False, False), target.device, target.dtype)
        init_random_(model, int(options.get("seed", RANDOM_SEED)))
        provenance = {"weights": "random-init", "layers": DEFAULT_LAYERS,
                      "mask_token": default_mask_token_id(target)[1]}
    else:
        checkpoint = load_checkpoint(source, method)
        who = f"{method} drafter {source}"
        layout = DeepSpecLayout.from_config(checkpoint.config, who)
        cfg = qwen3_config(checkpoint.config, who)
        _check_deepspec_fit(target, who, cfg, layout, checkpoint.trained_for)
        state = checkpoint.state_dict(target.device, target.dtype)
        own_embed, own_head = "embed_tokens.weight" in state, "lm_head.weight" in state
        model = materialize(lambda: DeepSpecBlockModel(cfg, layout, own_embed, own_head), target.device,
                            target.dtype)
        load_weights(model, state, who)
        provenance = {"weights": "checkpoint", "layers": cfg.num_hidden_layers}
    drafter = drafter_class(target, model, layout, threshold, provenance)
    if source is not None:
        drafter.checkpoint_path, drafter.checkpoint_hash = str(checkpoint.path), checkpoint.sha256
    drafter.use_window(options.get("window"))  # checked by evalsuite.catalog
    return drafter


def _check_deepspec_fit(target, who: str, cfg, layout: DeepSpecLayout, trained_for=None) -> None:
    check_fit(target, who, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
              layer_ids=layout.target_layer_ids, num_target_layers=layout.num_target_layers,
              mask_token_id=layout.mask_token_id, allow_embedding_layer=True, trained_for=trained_for)
    # DeepSpec `assert_no_final_target_layer`: HF's last hidden state is post-norm, the training cache is not.
    require(target.num_layers - 1 not in layout.target_layer_ids, who,
            f"target_layer_ids include the final target layer {target.num_layers - 1}, which DeepSpec refuses")


def default_feature_layers(target) -> tuple[int, ...]:
    """z-lab's rule with 5 layers ([1,9,17,25,33] on a 36-layer target), never the final (post-norm) layer."""
    ids = tuple(j for j in evenly_spaced_zlab(target.num_layers, DEFAULT_FEATURE_LAYERS)
                if j != target.num_layers - 1)
    return ids or (0,)


def random_dspark_layout(target, markov_rank: int = DEFAULT_MARKOV_RANK) -> DeepSpecLayout:
    """Random-init DSpark, or (markov_rank 0) DeepSpec's block7 DFlash: the released configs' choices."""
    return DeepSpecLayout(DEFAULT_BLOCK, default_mask_token_id(target)[0], default_feature_layers(target),
                          target.num_layers, markov_rank, "vanilla" if markov_rank else None,
                          markov_rank > 0, markov_rank > 0)


def build(target, options: dict) -> Method:
    return build_deepspec(target, options, "dspark", DeepSpecMethod, random_dspark_layout)


def has_dspark_heads(config: dict) -> bool:
    """A DeepSpec `Qwen3DSparkModel` with a Markov head or a confidence head (without both it is DeepSpec's DFlash
    baseline, the `*_block7` layout, run by `dflash`)."""
    return int(config.get("markov_rank", 0) or 0) > 0 or bool(config.get("enable_confidence_head"))


def recognises(config: dict) -> bool:
    """A released DSpark checkpoint: DeepSpec `Qwen3DSparkModel` with its heads (docs/methods.md §4.2)."""
    return "Qwen3DSparkModel" in (config.get("architectures") or []) and has_dspark_heads(config)

