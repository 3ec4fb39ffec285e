"""`dlite`: DLite, the history-free block drafter (SJTU-DAI-Sys; docs/methods.md §1).

Reference: `DAI-System/DLite` @6866238 (`dlite/modeling/dlite.py`, `qwen3.py`, `sequential_head.py`,
`utils/hidden_states.py`). Per draft step the drafter sees only:
- the target hidden states of the *last accepted token* (the pivot, position a-1) at S layers — layer 0, the
  last layer (HF's post-final-norm state) and S-2 evenly spaced between (`build_target_layer_ids`); each of the
  S vectors is one context slot: RMSNorm(h_layer + layer_depth_embedding[layer]) (`_apply_chs_depth_embedding`);
- queries: the target embeddings of the last G tokens up to the anchor (G = `anchor_group_size`) followed by
  B-1 MASK rows (the target embedding row of `mask_token_id`);
- Qwen3 layers, bidirectional attention over [S slots; queries], *local* RoPE positions
  (`build_block_position_ids`): tokens 0…G-1, masks G…G+B-2, every slot max(G-2, 0);
- final `norm`, the last B-1 outputs (`_prediction_hidden`): the mask at local offset k predicts the token at
  a+k; the target lm_head is not used — the low-rank RNN head does it (rank R, `sequential_head.py`):
  e = prev_token_embedding[x_{k-1}] (x_0 = anchor); [g, c] = state_proj([s; e]); s' = σ(g)s + (1-σ(g))tanh(c);
  logits = output_proj(state_hidden_mlp([s'; h_k])); s_0 = 0, or with G > 1 the state after one step on the
  token at a-1 with a zero hidden state (`_seed_rnn_state`).
There is no draft KV cache and no other history: `state_bytes().history` is 0 and the working memory is the
pivot features plus the block. Tokens are chosen left to right: greedy at T=0; at T>0 drawn from
softmax(logits / T), which is the proposal distribution (the reference's "rejection" verification mode).

Checkpoint: `config.json` (a Qwen3 config) with `block_size`, `num_target_layers` and
`dlite_config {architecture_version, model_role: pivot_q_student, anchor_group_size, chs_num_layers,
target_layer_ids, sequential_head: rnn, sequential_rank, mask_token_id}`; keys `layers.{i}.…`, `norm.weight`,
`layer_depth_embedding.weight` [num_target_layers, H], `context_norm.weight`,
`sequential_head.{prev_token_embedding,output_proj,state_proj,state_hidden_mlp}.*`.
The inference release accepts architecture_version "dlite_v1"; "dlite_v2" (the G=2 layout of the training
repo) is accepted too. An evalsuite extension, `dlite_config.draft_vocab_size` V' < vocab_size, gives the head a
draft vocabulary (`SequentialHead`): `output_proj` [V', R], `prev_token_embedding` [V'+1, R] and the buffer
`sequential_head.d2t` [V'] (EAGLE-3's convention); without it the head spans the vocabulary as the reference's.

Random-init default (no checkpoint): block 8, G = `options["anchor_group_size"]` (1), S = min(7, L) target
layers, 5 layers of the target's layer sizes, rank 256.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from evalsuite.catalog import SEED, MethodSpec, Option, positive
from evalsuite.errors import UserError
from evalsuite.methods.base import Method, DraftState, Proposal, Sampling, tensor_bytes
from evalsuite.methods.checkpoints import check_fit, drafter_source, load_checkpoint, load_weights
from evalsuite.methods.draft_layers import (
    DraftBackbone, RMSNorm, next_token, default_layer_config, default_mask_token_id, init_random_,
    materialize, qwen3_config, require, stack_proposal,
)


SPEC = MethodSpec(
    "dlite", "DLite: history-free block drafter (last token's multi-layer features, RNN head, no KV cache)", True,
    {"anchor_group_size": Option(int, "random init: anchors per group G (1)", positive, "must be >= 1"), "seed": SEED},
    batched=True, not_in={"vllm": "vLLM has no DLite drafter"})


VERSIONS = ("dlite_v1", "dlite_v2")
ROLE = "pivot_q_student"
DEFAULT_BLOCK = 8
DEFAULT_LAYERS = 5
DEFAULT_SLOTS = 7
DEFAULT_RANK = 256
RANDOM_SEED = 0


def dlite_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """DLite `build_target_layer_ids`: 0 and L-1 plus count-2 ids spread over [1, L-2] with Python `round`
    (a single middle id sits at the half-way point); [0,1,9,17,26,34,35] for L=36, count=7."""
    if num_target_layers < 2 or not 2 <= count <= num_target_layers:
        raise ValueError(f"need 2 <= chs_num_layers <= target layers, got {count} of {num_target_layers}")
    chosen = {0, num_target_layers - 1}
    middle = count - 2
    span = (num_target_layers - 2) - 1
    for i in range(middle):
        fraction = 0.5 if middle == 1 else i / (middle - 1)
        chosen.add(1 + round(fraction * span))
    return sorted(chosen)


@dataclass(frozen=True)
class DLiteSettings:
    block_size: int
    anchor_group_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    sequential_rank: int
    mask_token_id: int
    architecture_version: str = "dlite_v1"
    draft_vocab_size: int | None = None  # None: the head spans the target's vocabulary (the reference's)

    @property
    def predictions(self) -> int:
        return self.block_size - 1

    @classmethod
    def from_config(cls, config: dict, who: str) -> "DLiteSettings":
        dl = config.get("dlite_config")
        require(isinstance(dl, dict), who, "config.json lacks the 'dlite_config' object")
        version = dl.get("architecture_version")
        require(version in VERSIONS, who, f"dlite_config.architecture_version {version!r} is not one of {VERSIONS}")
        role = str(dl.get("model_role", "")).lower()
        require(role == ROLE, who, f"dlite_config.model_role must be '{ROLE}' (the inference student), got {role!r}")
        missing = sorted({"anchor_group_size", "chs_num_layers", "target_layer_ids", "sequential_head",
                          "sequential_rank", "mask_token_id"} - dl.keys())
        require(not missing, who, f"dlite_config lacks {missing}")
        for key in ("block_size", "num_target_layers"):
            require(key in config, who, f"config.json lacks '{key}'")
        group = int(dl["anchor_group_size"])
        require(group >= 1, who, f"anchor_group_size must be >= 1, got {group}")
        block = int(config["block_size"])
        require(block >= 2, who, f"block_size must be >= 2 (anchor + masks), got {block}")
        layers, slots = int(config["num_target_layers"]), int(dl["chs_num_layers"])
        require(2 <= slots <= layers, who, f"chs_num_layers {slots} must be in [2, num_target_layers={layers}]")
        ids = [int(j) for j in dl["target_layer_ids"]]
        expected = dlite_layer_ids(layers, slots)
        require(ids == expected, who, f"target_layer_ids {ids} must be the first/last + evenly spaced {expected}")
        head = str(dl["sequential_head"]).lower()
        require(head == "rnn", who, f"sequential_head '{head}' is not supported (only 'rnn' exists)")
        rank = int(dl["sequential_rank"])
        require(rank > 0, who, f"sequential_rank must be positive, got {rank}")
        draft_vocab = dl.get("draft_vocab_size")
        vocab = config.get("vocab_size")
        if draft_vocab is not None:
            draft_vocab = int(draft_vocab)
            require(draft_vocab > 0 and (vocab is None or draft_vocab <= int(vocab)), who,
                    f"dlite_config.draft_vocab_size {draft_vocab} must be in 1..vocab_size ({vocab})")
            if vocab is not None and draft_vocab == int(vocab):
                draft_vocab = None  # the whole vocabulary: the reference head
        return cls(block, group, tuple(ids), layers, rank, int(dl["mask_token_id"]), str(version), draft_vocab)


class SequentialHead(nn.Module):
    """DLite's low-rank RNN vocabulary head (key names as in `sequential_head.py`).

    With a draft vocabulary (`draft_vocab` < vocab; an evalsuite extension, the reference head spans the whole
    vocabulary) `output_proj` has one row per draft token, mapped back to target ids by the buffer `d2t` as in
    EAGLE-3's format (target id = draft id + d2t[draft id]), and `prev_token_embedding` one row per draft token
    plus a last row shared by every token outside the draft vocabulary (an anchor can be any token). Every method
    takes and returns target ids; the mapping stays inside the head."""

    def __init__(self, vocab: int, rank: int, hidden: int, draft_vocab: int | None = None):
        super().__init__()
        rows = vocab if draft_vocab is None else draft_vocab
        if not 0 < rows <= vocab:
            raise ValueError(f"draft vocabulary {rows} must be in 1..{vocab}")
        self.rank = rank
        self.vocab = vocab
        self.reduced = rows < vocab
        self.prev_token_embedding = nn.Embedding(rows + 1 if self.reduced else rows, rank)
        self.output_proj = nn.Linear(rank, rows, bias=False)
        self.state_proj = nn.Linear(2 * rank, 2 * rank)
        self.state_hidden_mlp = nn.Linear(rank + hidden, rank)
        if self.reduced:
            self.register_buffer("d2t", torch.zeros(rows, dtype=torch.long))
            self.register_buffer("t2d", torch.full((vocab,), rows, dtype=torch.long), persistent=False)
        else:
            self.d2t = self.t2d = None

    def use_vocabulary(self, target_ids: torch.Tensor) -> None:
        """Set the draft vocabulary: draft id i is target id target_ids[i] (distinct ids)."""
        with torch.no_grad():
            self.d2t.copy_(target_ids.to(self.d2t.device) - torch.arange(self.d2t.numel(), device=self.d2t.device))
        self.refresh_vocabulary()

    def refresh_vocabulary(self) -> None:
        """Rebuild the target → draft map from `d2t` (after loading it)."""
        if not self.reduced:
            return
        targets = self.target_ids()
        if int(targets.min()) < 0 or int(targets.max()) >= self.vocab or targets.unique().numel() != targets.numel():
            raise ValueError("d2t does not map the draft vocabulary one-to-one into the target vocabulary")
        self.t2d.fill_(self.d2t.numel())
        self.t2d[targets] = torch.arange(targets.numel(), device=targets.device)

    def target_ids(self) -> torch.Tensor:
        """[rows of output_proj] the target id of every draft id."""
        rows = self.output_proj.weight.shape[0]
        ids = torch.arange(rows, device=self.output_proj.weight.device)
        return ids + self.d2t if self.reduced else ids

    def to_draft(self, tokens: torch.Tensor) -> torch.Tensor:
        """Target ids → rows of prev_token_embedding (the shared last row outside the draft vocabulary)."""
        return self.t2d[tokens] if self.reduced else tokens

    def to_target(self, draft: torch.Tensor) -> torch.Tensor:
        """Rows of output_proj (draft ids) → target ids."""
        return draft + self.d2t[draft] if self.reduced else draft

    def step(self, prev_token: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor):
        """prev_token [...] target ids, hidden [..., H], state [..., R] → (latent [..., R], new state [..., R])."""
        e = self.prev_token_embedding(self.to_draft(prev_token))
        gate_raw, candidate = self.state_proj(torch.cat([state, e], dim=-1)).chunk(2, dim=-1)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate)
        return self.state_hidden_mlp(torch.cat([state, hidden], dim=-1)), state

    def seeded_state(self, token: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """`_seed_rnn_state`: one step on the token before the anchor, zero hidden, zero state (token [...] → state
        [..., R]; `like` gives the hidden size, dtype and device)."""
        hidden, state = like.new_zeros(*token.shape, like.shape[-1]), like.new_zeros(*token.shape, self.rank)
        _, state = self.step(token, hidden, state)
        return state


class DLiteModel(DraftBackbone):
    def __init__(self, cfg, settings: DLiteSettings):
        super().__init__(cfg)
        self.layer_depth_embedding = nn.Embedding(settings.num_target_layers, cfg.hidden_size)
        self.context_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.sequential_head = SequentialHead(cfg.vocab_size, settings.sequential_rank, cfg.hidden_size,
                                              settings.draft_vocab_size)


def block_positions(group: int, block_size: int, slots: int, device=None) -> torch.Tensor:
    """Local RoPE ids for [S context slots; G tokens; B-1 masks] (DLite `build_block_position_ids` with the
    origin at the first real token): slots max(G-2, 0), tokens 0…G-1, masks G…G+B-2."""
    context = torch.full((slots,), max(group - 2, 0), dtype=torch.long, device=device)
    return torch.cat([context, torch.arange(group + block_size - 1, device=device)])


class DLiteMethod(Method):
    name = "dlite"

    def __init__(self, target, model: DLiteModel, settings: DLiteSettings, provenance: dict):
        self.model = model
        self.settings = settings
        self.embed = target.embed_tokens
        self.device = target.device
        self.feature_layers = settings.target_layer_ids
        self.provenance = provenance
        self.depth_ids = torch.tensor(settings.target_layer_ids, dtype=torch.long, device=self.device)
        self.keep_tokens = max(settings.anchor_group_size, 2)  # the token group and the token before the anchor
        self.recent: list[int] = []
        self.pivot: torch.Tensor | None = None  # [S, H] target features of the token before the anchor
        self.anchor_pos = 0
        self.last_block_bytes = 0

    def start_turn(self, ids: torch.Tensor, features: torch.Tensor | None) -> None:
        if features is None or features.shape[0] == 0:
            raise ValueError("dlite: start_turn needs the target features of the token before the anchor")
        self.pivot = features[-1]
        self.recent = ids[-self.keep_tokens:].tolist()
        self.anchor_pos = ids.numel() - 1

    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor | None) -> None:
        self.pivot = new_features[-1]  # the last accepted token's features; nothing older is kept
        self.recent = (self.recent + new_ids.tolist())[-self.keep_tokens:]
        self.anchor_pos += new_ids.numel()

    @torch.inference_mode()
    def block_outputs(self) -> torch.Tensor:
        """The B-1 prediction outputs [B-1, H] for the current anchor."""
        s = self.settings
        group = min(s.anchor_group_size, self.anchor_pos + 1)
        ids = self.recent[-group:] + [s.mask_token_id] * s.predictions
        dtype = self.model.norm.weight.dtype
        queries = self.embed(torch.tensor(ids, dtype=torch.long, device=self.device)).to(dtype)
        slots = self.model.context_norm(self.pivot.to(dtype) + self.model.layer_depth_embedding(self.depth_ids))
        positions = block_positions(group, s.block_size, slots.shape[0], self.device)
        out = self.model.run_layers(queries, slots, positions)
        self.last_block_bytes = tensor_bytes(queries, slots, out)
        return out[-s.predictions:]

    @torch.inference_mode()
    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        hidden = self.block_outputs()[: min(k, self.settings.predictions)]
        head = self.model.sequential_head
        if self.settings.anchor_group_size > 1:
            state = head.seeded_state(torch.tensor(self.recent[-2], device=self.device), hidden)
        else:
            state = hidden.new_zeros(head.rank)
        previous = torch.tensor(self.recent[-1], device=self.device)
        tokens, probs = [], []
        for j in range(hidden.shape[0]):
            latent, state = head.step(previous, hidden[j], state)
            draft, dist = next_token(head.output_proj(latent), sampling.temperature, generator)
            previous = head.to_target(draft)
            if dist is not None and head.reduced:  # the proposal over the target's vocabulary: 0 outside the head's
                dist = dist.new_zeros(head.vocab).index_copy_(0, head.target_ids(), dist)
            tokens.append(previous)
            probs.append(dist)
        return stack_proposal(tokens, probs, self.device)

    def state_bytes(self) -> DraftState:
        # No draft KV cache, no history: the pivot features and the last block are all it holds.
        return DraftState(history=0, working=tensor_bytes(self.pivot) + self.last_block_bytes)

    def describe(self) -> dict:
        s = self.settings
        return {**super().describe(), **self.provenance, "block_size": s.block_size,
                "anchor_group_size": s.anchor_group_size, "sequential_rank": s.sequential_rank,
                "mask_token_id": s.mask_token_id, "architecture_version": s.architecture_version,
                "draft_vocab_size": s.draft_vocab_size or self.model.sequential_head.vocab,
                "slots_predict": "masks only (mask k → position a+k)", "positions": "local",
                "embed_tokens": "target", "lm_head": "own rank-R RNN head"}


def build_random(target, options: dict) -> DLiteMethod:
    slots = min(DEFAULT_SLOTS, target.num_layers)
    mask, how = default_mask_token_id(target)
    settings = DLiteSettings(DEFAULT_BLOCK, int(options.get("anchor_group_size", 1)),
                             tuple(dlite_layer_ids(target.num_layers, slots)), target.num_layers, DEFAULT_RANK, mask)
    require(settings.anchor_group_size >= 1, "dlite", "anchor_group_size must be >= 1")
    cfg = default_layer_config(target, DEFAULT_LAYERS)
    model = materialize(lambda: DLiteModel(cfg, settings), target.device, target.dtype)
    init_random_(model, int(options.get("seed", RANDOM_SEED)))
    return DLiteMethod(target, model, settings, {"weights": "random-init", "layers": DEFAULT_LAYERS,
                                                  "mask_token": how})


def recognises(config: dict) -> bool:
    """A released DLite checkpoint: a nested `dlite_config` (docs/methods.md §1.2)."""
    return "dlite_config" in config


def build(target, options: dict) -> Method:
    source = drafter_source("dlite", options, target)
    if source is None:
        return build_random(target, options)
    checkpoint = load_checkpoint(source, "dlite")
    who = f"dlite drafter {source}"
    settings = DLiteSettings.from_config(checkpoint.config, who)
    cfg = qwen3_config(checkpoint.config, who)
    check_fit(target, who, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
              layer_ids=settings.target_layer_ids, num_target_layers=settings.num_target_layers,
              mask_token_id=settings.mask_token_id, trained_for=checkpoint.trained_for)
    state = checkpoint.state_dict(target.device, target.dtype)
    model = materialize(lambda: DLiteModel(cfg, settings), target.device, target.dtype)
    load_weights(model, state, who)
    try:
        model.sequential_head.refresh_vocabulary()
    except ValueError as error:
        raise UserError(f"{who}: {error}; re-download the checkpoint") from None
    drafter = DLiteMethod(target, model, settings, {"weights": "checkpoint", "layers": cfg.num_hidden_layers})
    drafter.checkpoint_path, drafter.checkpoint_hash = str(checkpoint.path), checkpoint.sha256
    return drafter
