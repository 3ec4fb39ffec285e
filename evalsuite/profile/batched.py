"""Drafting for B streams at once, for the cost surfaces of `evalsuite.profile` (the engine drafts one stream).

A serving engine drafts every request in flight together. What that costs at batch B is what the profile
measures, so each learned method has a batched counterpart here that runs *its own modules* (the same weights,
projections, norms, heads and kernels) over a leading batch axis:

- DLite, DFlash (both layouts) and DSpark: the block drafters. Their layers take [n, H] rows; here the block of
  every stream is one [B, q, H] tensor, attention is one SDPA call over [B, heads, q, ctx] and the vocabulary
  heads (lm_head, DLite's RNN head, DSpark's Markov head) run on [B, ·] rows. The draft KV cache of DFlash and
  DSpark is a [B, kv_heads, length, head_dim] buffer per layer.
- EAGLE-3: its chain of k single-token steps, each over B streams at once, with a batched draft KV cache.
- Every other method (ngram, suffix: model-free, host-side work per request) runs B independent copies one
  after another: `batching = "sequential"`, and the cost at batch B is the sum.

Which it is, the method declares (`MethodSpec.batched`, evalsuite.catalog); a batched counterpart registers itself
for the method classes it runs with `@batches(...)` (here: the profile sits above the methods), and a method that
declares `batched` without one is an error, never a silent fall-back to sequential copies.

All streams have the same context length (uniform lengths), drafting is greedy (T = 0), and a step is what the
engine's `draft_s` counts: propose k drafts, then commit one token (the bonus; the target features of the old
anchor). `fill(context)` puts each stream in the state it has after a turn started at that context; for the
methods with a draft KV cache that cache is filled with random K/V (the cost of attending over it does not
depend on the values, and a prefill of B × 128k rows is not what is being measured). `load_streams` instead
copies the state of B real single-stream drafters, which is how the tests check that one batched step computes
what B single steps compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evalsuite.catalog import method_spec
from evalsuite.methods.base import Method, Sampling
from evalsuite.methods.dflash import ZLabDFlashMethod
from evalsuite.methods.dlite import DLiteMethod, block_positions
from evalsuite.methods.draft_layers import ContextCacheMethod, ContextKVCache, DraftBackbone, rotate
from evalsuite.methods.dspark import DeepSpecMethod
from evalsuite.methods.eagle3 import Eagle3Method
from evalsuite.target.buffers import GrowableBuffer

GREEDY = Sampling()
BATCHED: dict[type, type] = {}  # method class → its batched counterpart (`batches`)
ROOM = 256  # positions reserved beyond the context for the steps measured (a step adds one committed token)


class BatchedKV(ContextKVCache):
    """`ContextKVCache` with a leading batch axis: per layer [B, kv_heads, capacity, head_dim] buffers (the
    bookkeeping — write at the committed length, advance, crop, live bytes — is the single-stream cache's)."""

    def __init__(self, num_layers: int):
        super().__init__(num_layers)
        self.keys = [GrowableBuffer(axis=-2) for _ in range(num_layers)]
        self.values = [GrowableBuffer(axis=-2) for _ in range(num_layers)]

    def fill_synthetic(self, batch: int, length: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                       device: torch.device, room: int = 0) -> None:
        like = torch.empty(batch, kv_heads, 1, head_dim, dtype=dtype, device=device)
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer.ensure(like, length + room, keep=0)
                buffer.view(length).normal_()
        self.length = length

    def load(self, caches: list[ContextKVCache]) -> None:
        """The K/V of B single-stream caches of equal length, stacked."""
        if any(getattr(c, "window", None) for c in caches):
            raise ValueError("batched drafting copies whole-context caches; a windowed drafter is not batched")
        length = caches[0].length
        if any(c.length != length for c in caches):
            raise ValueError("batched drafting needs streams of equal length")
        for layer in range(self.num_layers):
            for mine, theirs in ((self.keys, [c.keys[layer] for c in caches]),
                                 (self.values, [c.values[layer] for c in caches])):
                stacked = torch.stack([b.view(length) for b in theirs])
                mine[layer].data = None
                mine[layer].write(0, stacked)
        self.length = length


# ---- the block drafters' layers over a batch axis ----------------------------------------------------------------
def block_layers(backbone: DraftBackbone, block: torch.Tensor, context: torch.Tensor, positions: torch.Tensor,
                 cache: BatchedKV | None = None) -> torch.Tensor:
    """`DraftBackbone.run_layers` for B streams: block [B, q, H], context [B, c, H] (new rows only when a cache
    holds the older ones), positions [c + q] shared by every stream. Returns the normed block outputs [B, q, H]."""
    batch, q_len, _ = block.shape
    c_len = context.shape[1]
    cos, sin = backbone.rotary_emb(block[:1], positions[None])
    cos, sin = cos[0], sin[0]
    x = block
    for i, layer in enumerate(backbone.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        keys_in = torch.cat([context, h], dim=1) if c_len else h
        q = rotate(attn.q_norm(attn.q_proj(h).view(batch, q_len, attn.heads, attn.head_dim)), cos[-q_len:],
                   sin[-q_len:])
        k = rotate(attn.k_norm(attn.k_proj(keys_in).view(batch, c_len + q_len, attn.kv_heads, attn.head_dim)),
                   cos, sin)
        v = attn.v_proj(keys_in).view(batch, c_len + q_len, attn.kv_heads, attn.head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.write(i, k, v)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, scale=attn.scale,
                                             enable_gqa=attn.heads != attn.kv_heads)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, q_len, attn.heads * attn.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    if cache is not None:
        cache.advance(c_len)
    return backbone.norm(x)


# ---- batched drafters ----------------------------------------------------------------------------------------------
def batches(*method_classes: type):
    """Class decorator: register a `BatchedDrafter` as the batched counterpart of these method classes."""

    def register(batched: type) -> type:
        for kind in method_classes:
            BATCHED[kind] = batched
        return batched

    return register


class BatchedDrafter:
    """B streams of one method. `fill(ids, context)`: every stream's state after a turn's start at `context`
    tokens (`ids` [B, ≥ context+1] supplies the tokens where a method reads them); `step(k)`: propose k drafts
    for every stream and commit one token each, returning the drafts [B, ≤k]; `state_bytes()`: all streams."""

    batching = "batched"

    def __init__(self, method: Method, batch: int):
        self.method = method
        self.batch = batch

    def fill(self, ids: torch.Tensor, context: int) -> None:
        raise NotImplementedError

    def step(self, k: int) -> int:
        raise NotImplementedError

    def state_bytes(self) -> int:
        raise NotImplementedError


def _features(method: Method, batch: int, rows: int, like: torch.Tensor) -> torch.Tensor:
    """Random target features [B, rows, S, H] of the layers the method reads."""
    return torch.randn(batch, rows, len(method.feature_layers), like.shape[-1], dtype=like.dtype, device=like.device)


@batches(DLiteMethod)
class BatchedDLite(BatchedDrafter):
    """DLite: no draft cache; per stream the pivot features [S, H] and the last tokens."""

    def __init__(self, method: DLiteMethod, batch: int):
        super().__init__(method, batch)
        self.settings = method.settings
        self.weight = method.model.norm.weight
        self.pivot: torch.Tensor | None = None  # [B, S, H]
        self.recent: torch.Tensor | None = None  # [B, keep] token ids, anchor last
        self.anchor_pos = 0
        self.bonus_features: torch.Tensor | None = None
        self.last_block_bytes = 0

    def fill(self, ids: torch.Tensor, context: int) -> None:
        m = self.method
        self.pivot = _features(m, self.batch, 1, self.weight)[:, 0]
        self.recent = ids[:, context + 1 - m.keep_tokens: context + 1].to(m.device)
        self.anchor_pos = context
        self.bonus_features = _features(m, self.batch, 1, self.weight)[:, 0]

    def load_streams(self, methods: list[DLiteMethod]) -> None:
        self.pivot = torch.stack([d.pivot for d in methods])
        self.recent = torch.tensor([d.recent for d in methods], device=self.method.device)
        self.anchor_pos = methods[0].anchor_pos
        self.bonus_features = self.pivot.clone()

    def block_outputs(self) -> torch.Tensor:
        m, s = self.method, self.settings
        group = min(s.anchor_group_size, self.anchor_pos + 1)
        masks = torch.full((self.batch, s.predictions), s.mask_token_id, dtype=torch.long, device=m.device)
        queries = m.embed(torch.cat([self.recent[:, -group:], masks], dim=1)).to(self.weight.dtype)
        slots = m.model.context_norm(self.pivot.to(self.weight.dtype) + m.model.layer_depth_embedding(m.depth_ids))
        positions = block_positions(group, s.block_size, slots.shape[1], m.device)
        out = block_layers(m.model, queries, slots, positions)
        self.last_block_bytes = sum(t.numel() * t.element_size() for t in (queries, slots, out))
        return out[:, -s.predictions:]

    @torch.inference_mode()
    def propose(self, k: int) -> torch.Tensor:
        hidden = self.block_outputs()[:, : min(k, self.settings.predictions)]
        head = self.method.model.sequential_head
        if self.settings.anchor_group_size > 1:
            state = head.seeded_state(self.recent[:, -2], hidden)
        else:
            state = hidden.new_zeros(self.batch, head.rank)
        previous = self.recent[:, -1]
        tokens = []
        for j in range(hidden.shape[1]):
            latent, state = head.step(previous, hidden[:, j], state)
            previous = head.to_target(head.output_proj(latent).argmax(dim=-1))
            tokens.append(previous)
        return torch.stack(tokens, dim=1) if tokens else self.recent.new_empty(self.batch, 0)

    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor) -> None:
        self.pivot = new_features[:, -1]
        self.recent = torch.cat([self.recent, new_ids], dim=1)[:, -self.method.keep_tokens:]
        self.anchor_pos += new_ids.shape[1]

    def step(self, k: int) -> int:
        drafts = self.propose(k)
        self.commit(drafts[:, :1], self.bonus_features[:, None])
        return drafts.shape[1]

    def state_bytes(self) -> int:
        # no history: the pivot features of every stream and the last block (DLiteMethod.state_bytes, B times)
        return self.pivot.numel() * self.pivot.element_size() + self.last_block_bytes


class BatchedBlockCache(BatchedDrafter):
    """DFlash (z-lab layout) and the DeepSpec layout (DSpark; DFlash block7): [pending context; anchor, MASK…]
    through the drafter over a batched draft KV cache of the whole context."""

    def __init__(self, method: ContextCacheMethod, batch: int):
        super().__init__(method, batch)
        self.model = method.model
        self.cache = BatchedKV(len(method.model.layers))
        self.pending: torch.Tensor | None = None  # [B, m, S, H]
        self.anchor: torch.Tensor | None = None  # [B]
        self.anchor_pos = 0
        self.bonus_features: torch.Tensor | None = None
        self.last_block_bytes = 0

    def fill(self, ids: torch.Tensor, context: int) -> None:
        m = self.method
        attn = self.model.layers[0].self_attn
        weight = self.model.norm.weight
        self.cache = BatchedKV(len(self.model.layers))
        self.cache.fill_synthetic(self.batch, context, attn.kv_heads, attn.head_dim, weight.dtype, m.device,
                                  room=ROOM + m.block_size)
        self.pending = None
        self.anchor = ids[:, context].to(m.device)
        self.anchor_pos = context
        self.bonus_features = _features(m, self.batch, 1, weight)

    def load_streams(self, methods: list[ContextCacheMethod]) -> None:
        self.cache.load([d.cache for d in methods])
        pending = [d.pending for d in methods]
        self.pending = None if pending[0] is None else torch.stack(pending)
        self.anchor = torch.tensor([d.anchor for d in methods], device=self.method.device)
        self.anchor_pos = methods[0].anchor_pos

    def block_outputs(self) -> torch.Tensor:
        m = self.method
        start = self.cache.length
        block_ids = torch.full((self.batch, m.block_size), m.mask_token_id, dtype=torch.long, device=m.device)
        block_ids[:, 0] = self.anchor
        block = m.embed(block_ids).to(self.model.norm.weight.dtype)
        if self.pending is not None:
            rows = self.pending.shape[1]
            fused = self.model.fuse(self.pending.reshape(self.batch * rows, *self.pending.shape[2:]))
            context = fused.view(self.batch, rows, -1)
        else:
            context = block.new_empty(self.batch, 0, block.shape[-1])
        positions = torch.arange(start, self.anchor_pos + m.block_size, device=m.device)
        out = block_layers(self.model, block, context, positions, self.cache)
        self.pending = None
        self.last_block_bytes = block.numel() * block.element_size() + out.numel() * out.element_size()
        return out

    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor) -> None:
        self.pending = new_features if self.pending is None else torch.cat([self.pending, new_features], dim=1)
        self.anchor = new_ids[:, -1]
        self.anchor_pos += new_ids.shape[1]

    def step(self, k: int) -> int:
        drafts = self.propose(k)
        self.commit(drafts[:, :1], self.bonus_features)
        return drafts.shape[1]

    def state_bytes(self) -> int:
        pending = 0 if self.pending is None else self.pending.numel() * self.pending.element_size()
        return self.cache.nbytes() + pending + self.last_block_bytes


@batches(ZLabDFlashMethod)
class BatchedZLabDFlash(BatchedBlockCache):
    @torch.inference_mode()
    def propose(self, k: int) -> torch.Tensor:
        outputs = self.block_outputs()
        masks = outputs[:, 1: 1 + min(k, self.method.block_size - 1)]
        return self.method.lm_head(masks).argmax(dim=-1)


@batches(DeepSpecMethod)
class BatchedDeepSpec(BatchedBlockCache):
    @torch.inference_mode()
    def propose(self, k: int) -> torch.Tensor:
        m: DeepSpecMethod = self.method
        hidden = self.block_outputs()[:, : min(k, m.block_size)]
        base = m.lm_head(hidden)
        markov = m.markov
        previous = self.anchor
        state = hidden.new_zeros(self.batch, markov.rank) if markov is not None and markov.kind == "rnn" else None
        tokens, prev_ids = [], []
        for j in range(hidden.shape[1]):
            logits = base[:, j]
            if markov is not None:
                e = markov.markov_w1(previous)
                if markov.kind == "vanilla":
                    bias = markov.markov_w2(e)
                elif markov.kind == "gated":
                    gate = torch.sigmoid(markov.gate_proj(torch.cat([hidden[:, j], e], dim=-1))).to(e.dtype)
                    bias = markov.markov_w2(gate * e)
                else:
                    gate_raw, candidate, output = markov.joint_proj(torch.cat([state, e, hidden[:, j]],
                                                                              dim=-1)).chunk(3, dim=-1)
                    gate = torch.sigmoid(gate_raw)
                    state = gate * state + (1.0 - gate) * torch.tanh(candidate)
                    bias = markov.markov_w2(torch.tanh(output))
                logits = logits + bias
            prev_ids.append(previous)
            previous = logits.argmax(dim=-1)
            tokens.append(previous)
        drafts = torch.stack(tokens, dim=1)
        if m.confidence is not None and m.confidence_threshold > 0.0:  # the cut's cost; every block is kept whole
            features = hidden
            if m.layout.confidence_with_markov:
                features = torch.cat([hidden, markov.markov_w1(torch.stack(prev_ids, dim=1)).to(hidden.dtype)], -1)
            torch.sigmoid(m.confidence(features).float())
        return drafts


@batches(Eagle3Method)
class BatchedEagle3(BatchedDrafter):
    """EAGLE-3's chain: k single-entry forwards of its one layer, each over B streams, over a batched draft cache
    (one entry per context position, as in the single-stream drafter)."""

    def __init__(self, method: Eagle3Method, batch: int):
        super().__init__(method, batch)
        self.model = method.model
        self.cache = BatchedKV(1)
        self.hidden: torch.Tensor | None = None  # [B, 1, H] un-normed output of the newest entry
        self.length_before_proposal = 0
        self.bonus_features: torch.Tensor | None = None

    def fill(self, ids: torch.Tensor, context: int) -> None:
        m, spec = self.method, self.method.spec
        self.cache = BatchedKV(1)
        self.cache.fill_synthetic(self.batch, context, spec.num_key_value_heads, spec.head_dim, m.dtype, m.device,
                                  room=ROOM)
        self.hidden = torch.randn(self.batch, 1, spec.hidden_size, dtype=m.dtype, device=m.device)
        self.length_before_proposal = context
        self.bonus_features = _features(m, self.batch, 1, torch.empty(spec.target_hidden_size, dtype=m.dtype,
                                                                      device=m.device))

    def load_streams(self, methods: list[Eagle3Method]) -> None:
        class _Single:  # DraftKVCache has the same buffers as a one-layer ContextKVCache
            def __init__(self, cache):
                self.keys, self.values, self.length = [cache.keys], [cache.values], cache.length
                self.window = cache.window

        self.cache.load([_Single(d.cache) for d in methods])
        self.hidden = torch.stack([d.hidden for d in methods])
        self.length_before_proposal = self.cache.length

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`Eagle3Model.forward` for B streams: append q entries each (hidden [B, q, H], tokens [B, q], positions
        [q]) and return the output of the newest entry [B, 1, H]."""
        model = self.model
        layer = model.layer
        attn = layer.self_attn
        batch, q_len, _ = hidden.shape
        cos, sin = model.rotary(hidden[:1], positions[None])
        cos, sin = cos[0], sin[0]
        x = torch.cat((layer.input_layernorm(model.embed_tokens(tokens)), layer.hidden_norm(hidden)), dim=-1)
        keys = attn.k_proj(x).view(batch, q_len, attn.kv_heads, attn.head_dim)
        values = attn.v_proj(x).view(batch, q_len, attn.kv_heads, attn.head_dim)
        query = attn.q_proj(x[:, -1:]).view(batch, 1, attn.heads, attn.head_dim)
        if attn.q_norm is not None:
            query, keys = attn.q_norm(query), attn.k_norm(keys)
        keys = rotate(keys, cos, sin)
        query = rotate(query, cos[-1:], sin[-1:])
        all_keys, all_values = self.cache.write(0, keys.transpose(1, 2), values.transpose(1, 2))
        self.cache.advance(q_len)
        out = F.scaled_dot_product_attention(query.transpose(1, 2), all_keys, all_values,
                                             scale=attn.head_dim ** -0.5, enable_gqa=attn.heads != attn.kv_heads)
        h = hidden[:, -1:] + attn.o_proj(out.transpose(1, 2).reshape(batch, 1, attn.heads * attn.head_dim))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    @torch.inference_mode()
    def propose(self, k: int) -> torch.Tensor:
        m = self.method
        self.length_before_proposal = self.cache.length
        hidden = self.hidden
        position = self.cache.length
        tokens = []
        for step in range(k):
            draft = self.model.logits(hidden)[:, 0].argmax(dim=-1)
            token = m.target_ids[draft]
            tokens.append(token)
            if step == k - 1:
                break
            hidden = self.forward(hidden, token[:, None], torch.tensor([position], device=m.device))
            position += 1
        return torch.stack(tokens, dim=1)

    @torch.inference_mode()
    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor) -> None:
        self.cache.crop(self.length_before_proposal)
        rows = new_ids.shape[1]
        fused = self.model.fuse(new_features.reshape(self.batch * rows, *new_features.shape[2:]))
        start = self.cache.length
        self.hidden = self.forward(fused.view(self.batch, rows, -1), new_ids,
                                   torch.arange(start, start + rows, device=self.method.device))
        self.length_before_proposal = self.cache.length

    def step(self, k: int) -> int:
        drafts = self.propose(k)
        self.commit(drafts[:, :1], self.bonus_features)
        return drafts.shape[1]

    def state_bytes(self) -> int:
        # the draft KV of every context entry, and the carried hidden states (Eagle3Method.state_bytes, B times)
        return self.cache.nbytes() + self.hidden.numel() * self.hidden.element_size()


class SequentialDrafter(BatchedDrafter):
    """B independent copies of a method, one after another (the model-free methods: host-side work per request)."""

    batching = "sequential"

    def __init__(self, methods: list[Method]):
        super().__init__(methods[0], len(methods))
        self.methods = methods
        self.ids: list[list[int]] = []

    def fill(self, ids: torch.Tensor, context: int) -> None:
        self.ids = []
        for method, row in zip(self.methods, ids):
            method.reset()
            method.start_turn(row[: context + 1], None)

    def step(self, k: int) -> int:
        drafts = []
        for method in self.methods:
            proposal = method.propose(k, GREEDY, None)
            bonus = proposal.tokens[:1] if proposal.tokens.numel() else torch.zeros(1, dtype=torch.long,
                                                                                     device=proposal.tokens.device)
            method.commit(bonus, None)
            drafts.append(proposal.tokens.numel())
        return max(drafts)

    def state_bytes(self) -> int:
        return sum(method.state_bytes().total for method in self.methods)


def _counterpart(method: Method) -> type | None:
    """The registered batched counterpart of `method`, or None when its spec declares none (`batched=False`)."""
    if not method_spec(method.name).batched:
        return None
    for kind in type(method).__mro__:
        if kind in BATCHED:
            return BATCHED[kind]
    raise RuntimeError(f"method {method.name} declares batched=True (evalsuite.catalog) but no batched counterpart "
                       f"is registered for {type(method).__name__}: add one with @batches({type(method).__name__}) "
                       "or declare batched=False")


def batching_of(method: Method) -> str:
    """"batched" when `method` declares a batched counterpart, else "sequential"."""
    return "batched" if _counterpart(method) is not None else "sequential"


def batched_drafter(method: Method, batch: int, build_copy=None) -> BatchedDrafter:
    """The batched counterpart of `method` for `batch` streams; methods without one run as B sequential copies
    (`build_copy()` makes each further copy)."""
    batched = _counterpart(method)
    if batched is not None:
        return batched(method, batch)
    copies = [method] + [build_copy() for _ in range(batch - 1)]
    return SequentialDrafter(copies)
