"""The target's KV cache and its attention: preallocated buffers, in-place writes, rollback by length.

Why not transformers' `DynamicCache`: it concatenates the whole cache on every forward (`torch.cat` of
K and V per layer, a copy that grows with the context), and its `StaticCache` attends over the whole
preallocated length and cannot be cropped. Speculative decoding verifies a short block after a long
context and then rolls back the rejected tail, so what it needs is:

- `GrowableLayer`: per-layer K/V in `evalsuite.target.buffers.GrowableBuffer`s `[batch, kv_heads, capacity, head_dim]`,
  allocated once and grown in chunks when a longer context arrives; `update` writes the new block in place and
  returns *views* of the filled length (no copy); `crop` only moves the length back. The engine decodes at
  batch 1; a batch of equal-length rows works the same way (`TargetModel.forward_batch`, the cost surfaces of
  `evalsuite.profile`, whose caches `fill_synthetic` fills with random K/V instead of a prefill).
- `KVCache`: a transformers `Cache` made of those layers, so the Hugging Face modeling code runs unchanged
  (masks, positions, hidden states). Sliding-window layer types keep their full history: the mask, built
  from absolute positions, applies the window, and rollback stays exact.
- `gqa_sdpa`: an attention function registered with transformers' `AttentionInterface`. For a block of
  several queries after a cached context with grouped-query attention, transformers' SDPA path copies every
  K/V head `groups` times (`repeat_kv`) before calling the kernel; here the query heads of each KV group are
  folded into the query-length axis instead (`[kv_heads, groups·q, d]`, mask rows repeated), so the kernel
  reads each K/V head once, straight from the cache views. Everything else goes to transformers' own SDPA.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, get_layer_types_and_kwargs
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from evalsuite.errors import UserError
from evalsuite.target.buffers import GrowableBuffer

ATTENTION = "evalsuite_sdpa"
DEFAULT_CHUNK = 1024
_SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


class GrowableLayer(DynamicLayer):
    """One layer's K/V in `GrowableBuffer`s (grown in chunks); `keys`/`values` are views of the filled part."""

    is_croppable = True

    def __init__(self, chunk: int = DEFAULT_CHUNK, sliding: bool = False):
        super().__init__()
        self.is_sliding = sliding  # tells transformers' mask builder which layers are sliding; history is kept whole
        self.length = 0
        self._k = GrowableBuffer(axis=-2, chunk=chunk)
        self._v = GrowableBuffer(axis=-2, chunk=chunk)
        self._reserved = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._grow(key_states, value_states, max(self._reserved, key_states.shape[-2]))
        self.is_initialized = True

    def _grow(self, key_like: torch.Tensor, value_like: torch.Tensor, size: int) -> None:
        self._k.ensure(key_like, size, keep=self.length)
        self._v.ensure(value_like, size, keep=self.length)

    @property
    def capacity(self) -> int:
        return self._k.capacity

    def reserve(self, length: int) -> None:
        """Make room for `length` tokens now, so that no later forward pays for a reallocation."""
        self._reserved = max(self._reserved, length)
        if self._k.data is not None:
            self._grow(self._k.data, self._v.data, length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = self._k.write(self.length, key_states)
        self.values = self._v.write(self.length, value_states)
        self.length += key_states.shape[-2]
        return self.keys, self.values

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole preallocated K and V, [batch, kv_heads, capacity, head_dim] (written by position, not by
        `update`, on the captured path: evalsuite.target.captured)."""
        return self._k.data, self._v.data

    def advance(self, tokens: int) -> None:
        """`tokens` more positions hold K/V written straight into `buffers()`."""
        self.length += tokens
        self.keys, self.values = self._k.view(self.length), self._v.view(self.length)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' convention: a negative count of tokens to drop from the end."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(self.length + tokens_to_remove, 0)
        if self._k.data is not None:
            self.keys = self._k.view(self.length)
            self.values = self._v.view(self.length)

    def reset(self) -> None:
        self.crop(-self.length)

    def nbytes(self) -> int:
        return self._k.nbytes + self._v.nbytes

    def fill_synthetic(self, like: torch.Tensor, length: int) -> None:
        """Hold `length` positions of random K/V in every batch row of `like` ([batch, kv_heads, ·, head_dim],
        only its shape, dtype and device are used), written in place: no prefill, no temporary copy."""
        self.reserve(length)
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        self._k.view(length).normal_()
        self._v.view(length).normal_()
        self.length = length
        self.keys, self.values = self._k.view(length), self._v.view(length)


class KVCache(Cache):
    """A transformers `Cache` of `GrowableLayer`s, one per decoder layer of `config`."""

    def __init__(self, config, chunk: int = DEFAULT_CHUNK):
        decoder = config.get_text_config(decoder=True)
        layer_types, _ = get_layer_types_and_kwargs(decoder)
        unsupported = sorted({t for t in layer_types if t not in _SUPPORTED_LAYER_TYPES})
        if unsupported:
            raise UserError(f"target layer types {unsupported} are not supported by the static KV cache; "
                            "run with --kv-cache dynamic")
        super().__init__(layers=[GrowableLayer(chunk, sliding=t == "sliding_attention") for t in layer_types])

    def reserve(self, length: int) -> None:
        """Room for `length` tokens in every layer, before a timed decode."""
        for layer in self.layers:
            layer.reserve(length)

    def crop_to(self, length: int) -> None:
        """Keep the first `length` tokens (rollback of rejected drafts)."""
        for layer in self.layers:
            layer.crop(min(length - layer.length, 0))

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)

    def fill_synthetic(self, config, batch: int, length: int, dtype: torch.dtype, device: torch.device,
                       room: int = 0) -> None:
        """`batch` rows of `length` positions of random K/V in every layer, with room for `room` more, as if
        `batch` contexts of equal length had been prefilled (uniform lengths). For cost surfaces
        (evalsuite.profile): attention over a context costs the same whatever its values, and a prefill of
        batch × 128k tokens would cost far more than the forwards being measured."""
        decoder = config.get_text_config(decoder=True)
        kv_heads = int(getattr(decoder, "num_key_value_heads", None) or decoder.num_attention_heads)
        head_dim = int(getattr(decoder, "head_dim", None) or decoder.hidden_size // decoder.num_attention_heads)
        like = torch.empty(batch, kv_heads, 1, head_dim, dtype=dtype, device=device)
        for layer in self.layers:
            layer.reserve(length + room)
            layer.fill_synthetic(like, length)


class DynamicKVCache(DynamicCache):
    """transformers' `DynamicCache` (`--kv-cache dynamic`, the engine before the static cache) with the same
    reserve/crop interface: nothing to reserve, since it concatenates on every forward."""

    def reserve(self, length: int) -> None:
        pass

    def crop_to(self, length: int) -> None:
        excess = self.get_seq_length() - length
        if excess > 0:
            self.crop(-excess)  # transformers 5 takes the number of tokens to remove, as a negative int


def check_supported(config) -> None:
    """One-line error, before any forward, for targets the static cache cannot hold."""
    KVCache(config)


def gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
             **kwargs):
    """SDPA that reads each K/V head once for multi-query blocks under grouped-query attention."""
    groups = getattr(module, "num_key_value_groups", 1)
    q_len = query.shape[2]
    foldable = (
        groups > 1 and q_len > 1 and dropout == 0.0
        and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
        and kwargs.get("position_bias") is None and kwargs.get("softcap") is None and kwargs.get("s_aux") is None
        and not kwargs.get("output_attentions", False)
    )
    if not foldable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, q_heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    # query head h = kv·groups + g  →  row g·q_len + i of KV head kv; mask row i serves every g
    folded = query.reshape(batch, kv_heads, groups * q_len, head_dim)
    mask = attention_mask.expand(batch, 1, q_len, attention_mask.shape[-1]).repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    out = out.reshape(batch, q_heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()
    return out, None


AttentionInterface.register(ATTENTION, gqa_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
