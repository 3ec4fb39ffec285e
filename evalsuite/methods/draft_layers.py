"""Building blocks shared by the block drafters (DLite, DFlash, DSpark).

All three use the same Qwen3-style decoder layer (docs/methods.md §1.1, §3.1, §4.1): the *queries* are the draft
block only, the *keys/values* are [context rows; block], attention is bidirectional (no mask), RoPE takes
explicit position ids (queries use the last |block| rows of cos/sin, keys all of them), q_norm/k_norm are
RMSNorms over the head dimension applied before RoPE, the MLP is SwiGLU. The context rows enter every layer
as they are: they are *not* passed through the layer's input_layernorm (only the block is), exactly as in
z-lab `dflash/model.py` Qwen3DFlashAttention, DeepSpec `qwen3/modeling.py` Qwen3DSparkAttention and DLite
`modeling/qwen3.py` Qwen3DLiteAttention.

Module attribute names reproduce the released checkpoints' key names (`layers.{i}.self_attn.q_proj.weight`,
`layers.{i}.mlp.gate_proj.weight`, `layers.{i}.input_layernorm.weight`, `norm.weight`, `fc.weight`,
`hidden_norm.weight`), so a checkpoint loads without renaming.

Also here: the growable draft KV cache of the context-keeping methods, and `ContextCacheMethod`, the
draft/commit bookkeeping DFlash and DSpark share; with `window` W (docs/methods.md §7) the block reads only the
W context rows before the anchor, at their absolute positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.activations import ACT2FN
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from evalsuite.errors import UserError
from evalsuite.methods.base import Method, DraftState, Proposal, common_prefix_len, tensor_bytes
from evalsuite.methods.window import DraftRows
from evalsuite.target import cpu_kernels
from evalsuite.target.buffers import GrowableBuffer

INIT_STD = 0.02  # HF `initializer_range` default, used for random-init drafters


# ---- configuration -----------------------------------------------------------------------------------------
def qwen3_config(config: dict, who: str) -> Qwen3Config:
    """The drafter's layer configuration, read exactly as the references read it: every released block
    drafter loads its config.json as a `Qwen3Config`, so missing keys take Qwen3's defaults (e.g. head_dim 128,
    rms_norm_eps 1e-6, rope_theta 10000)."""
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "torch_dtype", "dtype")}
    try:
        cfg = Qwen3Config.from_dict(fields)
    except (TypeError, ValueError, KeyError) as err:
        raise UserError(f"{who}: config.json is not a valid Qwen3 layer config ({err}); re-download the checkpoint")
    kinds = set(cfg.layer_types or ["full_attention"])
    if kinds != {"full_attention"}:
        raise UserError(f"{who}: layer_types {sorted(kinds)} are not supported (released drafters use full_attention)")
    return cfg


def full_attention_rope(target_config) -> dict:
    """The target's RoPE parameters for a full-attention layer (every draft layer is one). Targets with per-layer
    attention types (Gemma-3 style) key them by layer type."""
    rope = dict(getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
    if "rope_type" not in rope and isinstance(rope.get("full_attention"), dict):
        rope = dict(rope["full_attention"])
    return rope


def default_layer_config(target, num_layers: int, **extra) -> Qwen3Config:
    """Layer sizes for a random-init drafter of the default size: the target's hidden size, heads, KV heads,
    head dim, MLP width, RMSNorm eps and RoPE parameters (as the released drafters copy them from their target);
    `num_layers` decoder layers."""
    t = target.config
    heads = int(t.num_attention_heads)
    head_dim = int(getattr(t, "head_dim", None) or t.hidden_size // heads)
    rope = full_attention_rope(target.config)
    return Qwen3Config(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size, intermediate_size=int(t.intermediate_size),
        num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=int(getattr(t, "num_key_value_heads", None) or heads), head_dim=head_dim,
        rms_norm_eps=float(getattr(t, "rms_norm_eps", 1e-6)), hidden_act=str(getattr(t, "hidden_act", "silu")),
        max_position_embeddings=int(getattr(t, "max_position_embeddings", 32768)), rope_parameters=rope,
        attention_bias=False, tie_word_embeddings=False, layer_types=["full_attention"] * num_layers,
        num_target_layers=target.num_layers, **extra,
    )


def default_mask_token_id(target) -> tuple[int, str]:
    """Mask token for a random-init drafter, with how it was chosen: the tokenizer's mask token, a
    `<|mask|>`-style special token, else the first embedding row the tokenizer does not use (the DLite
    training default, 151669 on Qwen3), else the last row of the embedding table."""
    tokenizer = target.tokenizer
    rows = target.embed_tokens.weight.shape[0]
    if getattr(tokenizer, "mask_token_id", None) is not None and tokenizer.mask_token_id < rows:
        return int(tokenizer.mask_token_id), "tokenizer mask token"
    vocab = tokenizer.get_vocab()
    for name in ("<|mask|>", "<mask>", "[MASK]"):
        if name in vocab and vocab[name] < rows:
            return int(vocab[name]), f"token {name}"
    if len(tokenizer) < rows:
        return len(tokenizer), "first embedding row not used by the tokenizer"
    return rows - 1, "last embedding row (the tokenizer uses every row)"


# ---- layers ------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Qwen3RMSNorm semantics: normalise in float32, cast back to the input dtype, then scale."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class SwiGLU(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [n, heads, head_dim] with cos/sin [n, head_dim] (the rotate-half convention of HF Qwen3/Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class ContextKVCache(DraftRows):
    """Draft K/V of the context rows, per layer, in `GrowableBuffer`s [kv_heads, capacity, head_dim] that grow by
    doubling; rows sit at absolute positions [base, length) (`DraftRows`: base stays 0 without a window).

    A forward writes its new context rows *and* the block after the committed length, attends over all of it,
    and then `advance`s by the context rows only: the block's K/V are left as slack and overwritten next time,
    which is the reference's "append, then crop(start)" without copying the cache every step. Under a window the
    block reads only the window's context rows before the anchor (`prepare`)."""

    def __init__(self, num_layers: int, window: int | None = None):
        super().__init__(window)
        self.num_layers = num_layers
        self.keys = [self.new_buffer(axis=1) for _ in range(num_layers)]
        self.values = [self.new_buffer(axis=1) for _ in range(num_layers)]
        self._read_from = 0  # index of the oldest row this forward's block reads

    def buffers(self) -> list[GrowableBuffer]:
        return self.keys + self.values

    def prepare(self, context_rows: int, block_rows: int) -> None:
        """Before a forward writes `context_rows` new context rows and `block_rows` block rows at `length`. Under
        a window the block (anchor at length + context_rows) reads the window's context rows before the anchor:
        older rows are never read again, so they may go to make room."""
        newest = self.length + context_rows - 1  # the newest context row the block reads
        self.make_room(context_rows + block_rows, self.oldest_read(newest))
        self._read_from = self.read_from(newest)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: [kv_heads, t, head_dim] written at positions [length, length+t); returns the rows the block reads
        (all held rows up to length+t, from the window's oldest under a window)."""
        keys, values = self.keys[layer].write(self.held, k), self.values[layer].write(self.held, v)
        if self._read_from:
            keys, values = keys[:, self._read_from:], values[:, self._read_from:]
        return keys, values

    def advance(self, rows: int) -> None:
        self.length += rows

    def reset(self) -> None:
        self.restart(0)

    def nbytes(self) -> int:
        """Bytes of the live K/V (the rows held; the doubling slack is not counted)."""
        return self.held * self.nbytes_per_row()


class BlockAttention(nn.Module):
    """The block drafters' attention (DLite, DFlash, DSpark): the block's queries see every context row and every
    block row (bidirectional within the block, no mask)."""

    # set by TargetModel.prepare_drafter where the target's decoder attends with evalsuite's CPU attention kernel:
    # the block then attends on the same kernel (fp32 on a CPU, inference), every folded row at the last position
    kernel_attention = False

    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim ** -0.5
        bias = bool(cfg.attention_bias)
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def key_values(self, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K/V of rows [n, H] at the positions of cos/sin [n, head_dim] → two [kv_heads, n, head_dim]."""
        n = rows.shape[0]
        k = rotate(self.k_norm(self.k_proj(rows).view(n, self.kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(rows).view(n, self.kv_heads, self.head_dim)
        return k.transpose(0, 1), v.transpose(0, 1)

    def forward(self, block: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: ContextKVCache | None, layer: int) -> torch.Tensor:
        """block [q, H] (already input-normed), context [c, H]; cos/sin [c+q, head_dim] for [context; block]."""
        q_len, c_len = block.shape[0], context.shape[0]
        keys_in = torch.cat([context, block]) if c_len else block
        q = rotate(self.q_norm(self.q_proj(block).view(q_len, self.heads, self.head_dim)), cos[-q_len:], sin[-q_len:])
        k, v = self.key_values(keys_in, cos, sin)
        if cache is not None:
            k, v = cache.write(layer, k, v)
        if self.kernel_attention and cpu_kernels.heads_fit(q, self.kv_heads):
            return self.o_proj(cpu_kernels.attend_heads(q, k, v, 1, self.scale))  # rows=1: no mask
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], scale=self.scale,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out[0].transpose(0, 1).reshape(q_len, self.heads * self.head_dim))


class DraftDecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.self_attn = BlockAttention(cfg)
        self.mlp = SwiGLU(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, context, cos, sin, cache, layer):
        x = x + self.self_attn(self.input_layernorm(x), context, cos, sin, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftBackbone(nn.Module):
    """`layers.*` + final `norm` + RoPE (non-persistent buffers, so checkpoints hold no rotary keys)."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList([DraftDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(cfg)  # the rope type / scaling of the drafter's own config

    def run_layers(self, block: torch.Tensor, context: torch.Tensor, positions: torch.Tensor,
                   cache: ContextKVCache | None = None) -> torch.Tensor:
        """block [q, H] embeddings; context [c, H] rows (new rows only when a cache holds the older ones);
        positions [c+q] RoPE ids for [context; block]. Returns the normed block outputs [q, H]."""
        cos, sin = self.rotary_emb(block[None], positions[None])
        cos, sin = cos[0], sin[0]
        if cache is not None:
            cache.prepare(context.shape[0], block.shape[0])
        x = block
        for i, layer in enumerate(self.layers):
            x = layer(x, context, cos, sin, cache, i)
        if cache is not None:
            cache.advance(context.shape[0])
        return self.norm(x)

    def extend_cache(self, context: torch.Tensor, positions: torch.Tensor, cache: ContextKVCache) -> None:
        """Put context rows [c, H] at `positions` into the cache without a block. A context row's K/V depend only
        on the row itself (every layer projects the same fused features, never its own hidden state), so this
        is what a block forward would have stored for them."""
        cos, sin = self.rotary_emb(context[None], positions[None])
        cache.prepare(context.shape[0], 0)
        for i, layer in enumerate(self.layers):
            cache.write(i, *layer.self_attn.key_values(context, cos[0], sin[0]))
        cache.advance(context.shape[0])


class FusedContextBackbone(DraftBackbone):
    """DFlash/DSpark context path: concat of the target layers → `fc` (no bias) → `hidden_norm` (RMSNorm)."""

    def __init__(self, cfg: Qwen3Config, num_feature_layers: int):
        super().__init__(cfg)
        self.fc = nn.Linear(num_feature_layers * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[n, S, H] target features → [n, H] context rows."""
        return self.hidden_norm(self.fc(features.reshape(features.shape[0], -1)))


def materialize(factory, device: torch.device, dtype: torch.dtype):
    """Build `factory()` without initialising it (meta tensors), then allocate it on `device` in `dtype`;
    the caller loads or initialises every weight. RoPE buffers are rebuilt in float32, as HF keeps them."""
    with torch.device("meta"):
        model = factory()
    model = model.to_empty(device=device).to(dtype)
    for sub in model.modules():
        if isinstance(sub, DraftBackbone):
            sub.rotary_emb = Qwen3RotaryEmbedding(sub.config).to(device)
    return model.eval().requires_grad_(False)


def init_random_(module: nn.Module, seed: int) -> None:
    """HF-style init: linear and embedding weights ~ N(0, 0.02), biases 0, norms 1 (seeded, reproducible)."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (nn.Linear, nn.Embedding)):
                device = sub.weight.device
                if device not in generators:
                    generators[device] = torch.Generator(device=device).manual_seed(seed)
                noise = torch.randn(sub.weight.shape, generator=generators[device], device=device)
                sub.weight.copy_(noise * INIT_STD)
                if getattr(sub, "bias", None) is not None:
                    sub.bias.zero_()
            elif isinstance(sub, RMSNorm):
                sub.weight.fill_(1.0)


# ---- token choice ------------------------------------------------------------------------------------------
def choose_token(logits: torch.Tensor, temperature: float,
                 generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """Greedy (argmax; probs None = one-hot) or a draw from softmax(logits / T) computed in float32, which is
    what DLite `sequential_head._sample_tokens`, DeepSpec `sample_tokens` / `logits_to_probs` use. Returns the
    token and the distribution it was drawn from."""
    if temperature <= 0.0:
        return int(logits.argmax()), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator)), probs


def next_token(logits: torch.Tensor, temperature: float,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`choose_token` for serial heads that feed the token straight back: a 0-d tensor on the logits' device.
    Greedy stays on the device (no host sync per token, like the references' loops)."""
    if temperature <= 0.0:
        return logits.argmax(), None
    token, probs = choose_token(logits, temperature, generator)
    return torch.tensor(token, device=logits.device), probs


def stack_proposal(tokens: list[torch.Tensor], probs: list[torch.Tensor | None], device) -> Proposal:
    ids = torch.stack(tokens).to(device) if tokens else torch.empty(0, dtype=torch.long, device=device)
    if not probs or probs[0] is None:
        return Proposal(tokens=ids)
    return Proposal(tokens=ids, probs=torch.stack(probs).to(device))


# ---- the context-cache drafters' bookkeeping ---------------------------------------------------------------
class ContextCacheMethod(Method):
    """DFlash and DSpark: a draft KV cache over every context position, extended on commit.

    The reference loop (z-lab `dflash_generate`, DeepSpec `forward_dspark_draft_block`) passes, at each draft
    step, only the target features not yet in the draft cache (the whole prompt on the first step, afterwards
    the old anchor and the accepted drafts) with their absolute positions, followed by the block
    [anchor, MASK × (B-1)] at positions anchor_pos … anchor_pos+B-1; after the forward it crops the cache back to
    anchor_pos, i.e. the block's K/V are dropped and the context rows stay. Here the prompt's rows enter the
    cache in `start_turn` (a context row's K/V do not depend on the block) and the rows of each commit wait in
    `pending` until the next `propose`, which runs them with the block as the reference does.
    """

    def __init__(self, model: FusedContextBackbone, embed: nn.Embedding, block_size: int, mask_token_id: int,
                 feature_layers: tuple[int, ...], device: torch.device):
        self.model = model
        self.embed = embed
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.feature_layers = tuple(feature_layers)
        self.device = device
        self.window: int | None = None  # --method-option METHOD.window (docs/methods.md §7)
        self.cache = ContextKVCache(len(model.layers))
        self.ids = torch.empty(0, dtype=torch.long, device=device)  # the context, anchor last
        self.pending: torch.Tensor | None = None  # [m, S, H] features of positions cache.length … anchor_pos-1
        self.anchor = 0
        self.anchor_pos = 0
        self.last_block_bytes = 0

    def use_window(self, window: int | None) -> None:
        """The block reads only the last `window` context rows before the anchor (and itself); the cache keeps at
        most window + SLACK rows. None = the whole context. Set before the first turn."""
        self.window = window
        self.cache = ContextKVCache(len(self.model.layers), window)
        self.ids = self.ids[:0]

    @torch.inference_mode()
    def start_turn(self, ids: torch.Tensor, features: torch.Tensor | None) -> None:
        """The draft prefill: the whole context's K/V go into a fresh cache now (the reference does it in its
        first draft forward, whose time z-lab's benchmark excludes; here it is the engine's draft_prefill_s)."""
        if features is None or features.shape[0] != ids.numel() - 1:
            raise ValueError(f"{self.name}: start_turn needs features for every position before the anchor")
        # Rows whose context prefix is unchanged since the last turn keep their K/V (a context row's K/V depend
        # only on its own target features, which depend only on the tokens up to it), as a serving engine's
        # prefix cache would; only the rest is prefilled.
        # Under a window the first block reads back to `needed` only, so older rows are neither kept nor built.
        kept = min(common_prefix_len(self.ids, ids[:-1]), self.cache.length)
        needed = self.cache.oldest_read(ids.numel() - 2)
        if self.cache.covers(kept, needed):
            self.cache.crop(kept)
        else:
            self.cache.restart(needed)
        start = self.cache.length
        self.pending = None
        self.ids = ids.detach().clone()
        self.anchor = int(ids[-1])
        self.anchor_pos = ids.numel() - 1
        if self.anchor_pos > start:
            context = self.model.fuse(features[start:].to(self.model.norm.weight.dtype))
            self.model.extend_cache(context, torch.arange(start, self.anchor_pos, device=self.device), self.cache)

    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor | None) -> None:
        if new_features is None or new_features.shape[0] != new_ids.numel():
            raise ValueError(f"{self.name}: commit needs one feature row per new token")
        self.pending = new_features if self.pending is None else torch.cat([self.pending, new_features])
        self.ids = torch.cat([self.ids, new_ids.to(self.ids.device)])
        self.anchor = int(new_ids[-1])
        self.anchor_pos += new_ids.numel()

    @torch.inference_mode()
    def block_outputs(self) -> torch.Tensor:
        """Run [pending context; anchor, MASK×(B-1)] through the drafter; returns the block outputs [B, H]."""
        pending = self.pending if self.pending is not None else self.embed.weight.new_empty(0, 0, 0)
        rows = pending.shape[0]
        start = self.cache.length
        assert start + rows == self.anchor_pos, "draft cache out of step with the context"
        block_ids = torch.full((self.block_size,), self.mask_token_id, dtype=torch.long, device=self.device)
        block_ids[0] = self.anchor
        block = self.embed(block_ids).to(self.model.norm.weight.dtype)
        context = self.model.fuse(pending) if rows else block.new_empty(0, block.shape[1])
        positions = torch.arange(start, self.anchor_pos + self.block_size, device=self.device)
        out = self.model.run_layers(block, context, positions, self.cache)
        self.pending = None
        self.last_block_bytes = tensor_bytes(block, out)
        return out

    def describe(self) -> dict:
        return {**super().describe(), "window": self.window}

    def state_bytes(self) -> DraftState:
        # history: the draft K/V held, over the whole context or the window (+ feature rows not yet absorbed);
        # working: the block.
        return DraftState(history=self.cache.nbytes() + tensor_bytes(self.pending), working=self.last_block_bytes)


def evenly_spaced_zlab(num_target_layers: int, count: int) -> list[int]:
    """z-lab `build_target_layer_ids`: `count` ids from 1 to L-3 with Python `round` ([1,9,17,25,33] for
    L=36, count=5); a single id is L//2. Duplicates (tiny targets) are dropped, ids clamped to the target."""
    if count == 1:
        ids = [num_target_layers // 2]
    else:
        start, end = 1, num_target_layers - 3
        ids = [int(round(start + (i * (end - start)) / (count - 1))) for i in range(count)]
    return sorted({min(max(j, 0), num_target_layers - 1) for j in ids})


def require(condition: bool, who: str, message: str) -> None:
    """A config invariant; a violation is a one-line user error naming the checkpoint."""
    if not condition:
        raise UserError(f"{who}: {message}")


__all__ = [
    "ContextCacheMethod", "ContextKVCache", "DraftBackbone", "DraftDecoderLayer", "FusedContextBackbone",
    "RMSNorm", "SwiGLU", "BlockAttention", "choose_token", "next_token", "default_layer_config", "default_mask_token_id",
    "evenly_spaced_zlab", "init_random_", "materialize", "qwen3_config", "require", "rotate", "stack_proposal",
]
