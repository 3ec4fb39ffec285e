"""The target's KV cache and its attention: preallocated buffers, in-place writes, rollback by length.

Why not transformers' `DynamicCache`: it concatenates the whole cache on every forward (`torch.cat` of
K and V per layer, a copy that grows with the context), and its `StaticCache` attends over the whole
preallocated length and cannot be cropped. Speculative decoding verifies a short block after a long
context and then rolls back the rejected tail, so what it needs is:

- `GrowableLayer`: per-layer K/V buffers `[batch, kv_heads, capacity, head_dim]` allocated once and grown
  in chunks when a longer context arrives; `update` writes the new block in place and returns *views*
  of the filled length (no copy); `crop` only moves the length back.
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
from transformers.cache_utils import Cache, DynamicLayer, get_layer_types_and_kwargs
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from evalsuite.errors import UserError

ATTENTION = "evalsuite_sdpa"
CACHE_KINDS = ("static", "dynamic")
DEFAULT_CHUNK = 1024
_SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


class GrowableLayer(DynamicLayer):
    """One layer's K/V in preallocated buffers; `keys`/`values` are views of the filled part."""

    is_croppable = True

    def __init__(self, chunk: int = DEFAULT_CHUNK, sliding: bool = False):
        super().__init__()
        self.chunk = chunk
        self.is_sliding = sliding  # tells transformers' mask builder which layers are sliding; history is kept whole
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._reserved = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._allocate(key_states, value_states, max(self._reserved, key_states.shape[-2]))
        self.is_initialized = True

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        capacity = -(-need // self.chunk) * self.chunk
        old_k, old_v = self._k, self._v
        shape_k = (*key_states.shape[:-2], capacity, key_states.shape[-1])
        shape_v = (*value_states.shape[:-2], capacity, value_states.shape[-1])
        self._k = torch.empty(shape_k, dtype=key_states.dtype, device=key_states.device)
        self._v = torch.empty(shape_v, dtype=value_states.dtype, device=value_states.device)
        if old_k is not None and self.length:
            self._k[..., : self.length, :].copy_(old_k[..., : self.length, :])
            self._v[..., : self.length, :].copy_(old_v[..., : self.length, :])

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[-2]

    def reserve(self, length: int) -> None:
        """Make room for `length` tokens now, so that no later forward pays for a reallocation."""
        self._reserved = max(self._reserved, length)
        if self._k is not None and length > self.capacity:
            self._allocate(self._k, self._v, length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._allocate(self._k, self._v, end)
        self._k[..., self.length: end, :].copy_(key_states)
        self._v[..., self.length: end, :].copy_(value_states)
        self.length = end
        self.keys = self._k[..., :end, :]
        self.values = self._v[..., :end, :]
        return self.keys, self.values

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
        if self._k is not None:
            self.keys = self._k[..., : self.length, :]
            self.values = self._v[..., : self.length, :]

    def reset(self) -> None:
        self.crop(-self.length)

    def nbytes(self) -> int:
        return 0 if self._k is None else self._k.nbytes + self._v.nbytes


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
        for layer in self.layers:
            layer.reserve(length)

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


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
