"""Batched training-time forwards over the drafters' own nn.Modules (evalsuite/methods/*).

The inference modules run one block at a time (2-D tensors, a draft KV cache). Training runs many anchors at
once, so these functions apply the *same parameters in the same order* with a leading batch dimension:
- `block_layers`: the block drafters' Qwen3 layers (`DraftDecoderLayer`): queries = the block, keys/values =
  [context rows; block], bidirectional, RoPE on explicit positions, context rows not input-normed. The context
  is per anchor (`own`: DLite's slots, the teacher's history window) and/or one sequence's rows shared by all
  of its anchors (`shared`: DFlash/DSpark, where anchor a sees rows 0..a-1, exactly its draft KV cache).
- `eagle3_ttt`: EAGLE-3's single layer unrolled over training-time-test steps (draft outputs fed back).
Parity with the inference code is tested in tests/test_train_forward.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalsuite.methods.draft_layers import DraftBackbone, DraftDecoderLayer


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., n, heads, d], cos/sin [..., n, d] (rotate-half convention, as `draft_layers.rotate`)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


@dataclass
class SharedContext:
    """One sequence's context rows, seen by every anchor of that sequence up to (excluding) its anchor."""

    rows: torch.Tensor  # [T, H] fused context rows at positions 0..T-1
    visible: torch.Tensor  # [A, T] bool: anchor i sees row j (j < anchor_i)


def _split_heads(x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    return x.view(*x.shape[:-1], heads, dim)


def block_layers(backbone: DraftBackbone, block: torch.Tensor, block_pos: torch.Tensor,
                 own: torch.Tensor | None = None, own_pos: torch.Tensor | None = None,
                 shared: SharedContext | None = None) -> torch.Tensor:
    """block [A, q, H] at positions block_pos [A, q]; own context [A, c, H] at own_pos [A, c]; shared context
    rows at positions 0..T-1. Returns the normed block outputs [A, q, H]."""
    A, q_len, _ = block.shape
    cos_q, sin_q = backbone.rotary_emb(block, block_pos)
    own_rope = backbone.rotary_emb(own, own_pos) if own is not None else None
    if shared is not None:
        T = shared.rows.shape[0]
        shared_rope = backbone.rotary_emb(shared.rows[None], torch.arange(T, device=block.device)[None])
    x = block
    for layer in backbone.layers:
        x = x + _attention(layer, layer.input_layernorm(x), cos_q, sin_q, own, own_rope, shared,
                           shared_rope if shared is not None else None)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return backbone.norm(x)


def _attention(layer: DraftDecoderLayer, xb, cos_q, sin_q, own, own_rope, shared, shared_rope):
    attn = layer.self_attn
    h, kv, d = attn.heads, attn.kv_heads, attn.head_dim
    A, q_len, _ = xb.shape
    q = rope(attn.q_norm(_split_heads(attn.q_proj(xb), h, d)), cos_q, sin_q)  # [A, q, h, d]
    k_parts = [rope(attn.k_norm(_split_heads(attn.k_proj(xb), kv, d)), cos_q, sin_q)]
    v_parts = [_split_heads(attn.v_proj(xb), kv, d)]
    if own is not None:
        k_parts.insert(0, rope(attn.k_norm(_split_heads(attn.k_proj(own), kv, d)), *own_rope))
        v_parts.insert(0, _split_heads(attn.v_proj(own), kv, d))
    k = torch.cat(k_parts, dim=1)  # [A, c+q, kv, d]
    v = torch.cat(v_parts, dim=1)
    group = h // kv
    q = q.transpose(1, 2)  # [A, h, q, d]
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)  # [A, h, n, d]
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * attn.scale  # [A, h, q, n]
    if shared is not None:
        rows = shared.rows
        ks = rope(attn.k_norm(_split_heads(attn.k_proj(rows), kv, d)), shared_rope[0][0], shared_rope[1][0])
        vs = _split_heads(attn.v_proj(rows), kv, d)
        ks = ks.transpose(0, 1).repeat_interleave(group, dim=0)  # [h, T, d]
        vs = vs.transpose(0, 1).repeat_interleave(group, dim=0)
        s_scores = torch.einsum("ahqd,htd->ahqt", q, ks) * attn.scale
        s_scores = s_scores.masked_fill(~shared.visible[:, None, None, :], float("-inf"))
        probs = torch.softmax(torch.cat([s_scores, scores], dim=-1).float(), dim=-1).to(q.dtype)
        T = rows.shape[0]
        out = torch.einsum("ahqt,htd->ahqd", probs[..., :T], vs) + torch.matmul(probs[..., T:], v)
    else:
        out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)
    out = out.transpose(1, 2).reshape(A, q_len, h * d)
    return attn.o_proj(out)


# ---- EAGLE-3 training-time test ------------------------------------------------------------------------------
def eagle3_ttt(model, fused: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Unroll EAGLE-3's one layer `steps` times over a sequence (SpecForge/DeepSpec training-time test).

    fused [T, H]: fc(features) of positions 0..T-1; tokens [T + steps] data tokens. Step 0 pairs feature i with
    token i+1 at position i (the draft KV entry of context position i); step k pairs the step k-1 output of row
    i with token i+k+1 at position i+k, attending to the step-0 entries 0..i and to its own row's entries of
    steps 1..k — what the draft cache holds when the k-th draft token after position i+1 is proposed.
    Returns the un-normed outputs per step, each [T, H]; step k row i predicts the token at i+k+2.
    """
    layer = model.layer
    attn = layer.self_attn
    h, kv, d = attn.heads, attn.kv_heads, attn.head_dim
    group = h // kv
    T = fused.shape[0]
    device = fused.device
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    base_keys = base_values = None
    diag_keys: list[torch.Tensor] = []  # per step >= 1: [T, h, d] keys of row i's own entry
    diag_values: list[torch.Tensor] = []
    hidden = fused
    outputs = []
    for step in range(steps):
        positions = torch.arange(step, T + step, device=device)
        cos, sin = model.rotary(hidden, positions[None])
        cos, sin = cos[0], sin[0]
        x = torch.cat((layer.input_layernorm(model.embed_tokens(tokens[step + 1: step + 1 + T])),
                       layer.hidden_norm(hidden)), dim=-1)
        q = _split_heads(attn.q_proj(x), h, d)
        k = _split_heads(attn.k_proj(x), kv, d)
        v = _split_heads(attn.v_proj(x), kv, d)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k.repeat_interleave(group, dim=1)  # [T, h, d]
        v = v.repeat_interleave(group, dim=1)
        scale = d ** -0.5
        if step == 0:
            base_keys, base_values = k, v
        else:
            diag_keys.append(k)
            diag_values.append(v)
        scores = torch.einsum("ihd,jhd->hij", q, base_keys) * scale
        scores = scores.masked_fill(~causal[None], float("-inf"))  # [h, T, T]
        extra = [torch.einsum("ihd,ihd->hi", q, dk)[..., None] * scale for dk in diag_keys]  # [h, T, 1] each
        probs = torch.softmax(torch.cat([scores, *extra], dim=-1).float(), dim=-1).to(q.dtype)
        out = torch.einsum("hij,jhd->ihd", probs[..., :T], base_values)
        for m, dv in enumerate(diag_values):
            out = out + probs[..., T + m].transpose(0, 1)[..., None] * dv
        attn_out = attn.o_proj(out.reshape(T, h * d))
        mid = hidden + attn_out
        hidden = mid + layer.mlp(layer.post_attention_layernorm(mid))
        outputs.append(hidden)
    return outputs

