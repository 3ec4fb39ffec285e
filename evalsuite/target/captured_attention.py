"""The captured path's attentions that read only the live keys (`FusedDecoder.captured_attention`).

The captured path (evalsuite.target.captured) records one CUDA graph per (block rows, span), so the attention
cannot take its length from Python: `FusedDecoder.forward_at` hands over the block's absolute positions as a
device tensor. SDPA under a boolean mask of the live columns (the default, "masked-sdpa") reads K/V at a twentieth
of HBM speed on an H200 (benchmarks/results/gpu_h200/sdpa_probe_gpu.txt): with few query rows its kernels get one
thread block per head and walk the whole span alone. Two attentions here read the live keys only; both take the
queries folded as `_layer` hands them over ([1, kv_heads, groups·rows, dim], row g·rows + i = block row i of query
head kv·groups + g) and the K/V as views of the cache buffers, the block's own K/V already written:

- "split-k", `split_attention`: the keys split into chunks of `SPLIT` positions, one program per (K/V head, chunk),
  each reading the chunk's K/V once for every query row of its head; its loads stop at the live length it reads
  from the positions (masked loads touch no memory), so a chunk past the context costs a launch, not a read; the
  chunks' partial softmaxes are merged by their log-sum-exp in a second kernel. Triton, on CUDA (and on any device
  when TRITON_INTERPRET=1, which is how tests/test_split_attention.py checks it on a CPU);
- "flash-length", `flash_length_attention`: flash attention's variable-length kernel with the live key count as a
  device tensor (`seqused_k`); decodes take its split-K path, verify blocks one program per query head. CUDA, fp16/bf16.

Elsewhere both compute the same attention in plain torch (`_reference`), which the CPU tests check them against.

On an H200 (benchmarks/results/gpu_h200/live_length) both are exact; flash-length decodes fastest (1.53× the HBM
floor at 32k, split-k 1.88×) but its verify blocks cost 2.2–4.9× a decode, while split-k's cost 1.06–1.27×. So
"flash+split" takes each where it is fastest, and `resolve_captured_attention` makes it the CUDA default.
"""

from __future__ import annotations

import functools
import os

import torch

from evalsuite.config import CAPTURED_ATTENTIONS
from evalsuite.errors import UserError

SPLIT = 512  # keys per program: at a 41k span 81 chunks × 8 K/V heads keep an H200's 132 multiprocessors busy
BLOCK_N = 64  # keys per step inside a program

FLASH_DTYPES = (torch.float16, torch.bfloat16)


def resolve_captured_attention(choice: str, device: torch.device, dtype: torch.dtype) -> str:
    """`--captured-attention` for a target on `device` in `dtype`: "auto" becomes the fastest exact attention that
    runs there (CUDA: flash+split in half precision, split-k in float32, masked-sdpa without triton; elsewhere
    masked-sdpa, whose plain form the CPU runs); an explicit choice that cannot run there is a UserError."""
    if choice not in ("auto", *CAPTURED_ATTENTIONS):
        raise UserError(f"--captured-attention {choice}: choose from auto, {', '.join(CAPTURED_ATTENTIONS)}")
    triton = device.type == "cuda" and _triton_available()
    if choice == "auto":
        if not triton:
            return "masked-sdpa"
        return "flash+split" if dtype in FLASH_DTYPES else "split-k"
    if choice in ("flash-length", "flash+split") and device.type == "cuda" and dtype not in FLASH_DTYPES:
        raise UserError(f"--captured-attention {choice}: flash attention needs --dtype bfloat16 or float16 "
                        f"(this target is {str(dtype).removeprefix('torch.')}); use split-k or auto")
    if choice in ("split-k", "flash+split") and device.type == "cuda" and not triton:
        raise UserError(f"--captured-attention {choice}: the split-K kernel needs triton (pip install triton); "
                        "use flash-length, masked-sdpa or auto")
    return choice


def attention_for_rows(choice: str, rows: int) -> str:
    """The one attention a forward of `rows` query rows uses under `choice` (flash+split: by block size)."""
    if choice == "flash+split":
        return "flash-length" if rows == 1 else "split-k"
    return choice


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def split_attention(folded: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """`folded` [1, kv_heads, groups·rows, dim] (row g·rows + i is block row i of query head kv·groups + g),
    `keys`/`values` [1, kv_heads, span, dim] (views of the cache buffers, the block's own K/V already written),
    `positions` [rows] the block's absolute positions (device). Block row i attends keys 0 … positions[i].
    Returns the folded output, in the queries' dtype."""
    if folded.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return _triton_split_attention(folded, keys, values, positions, scale)
    return _reference(folded, keys, values, positions, scale)


def flash_length_attention(positions: torch.Tensor, rows: int, span: int, scale: float, kv_heads: int, groups: int):
    """The "flash-length" attention of one forward: `attend(folded, keys, values)` (split_attention's layout) for a
    block of `rows` at `positions` over `span` cache positions. The live key count (`positions[-1] + 1`) and the
    sequence offsets are made once per forward, on the device; the kernel aligns its causal mask bottom-right on the
    live keys, so query i sees keys up to positions[i]."""
    device = positions.device
    seqused = (positions[-1:] + 1).to(torch.int32)
    cum_q = torch.arange(0, 2 * rows, rows, device=device, dtype=torch.int32)  # [0, rows], made on the device
    cum_k = torch.arange(0, 2 * span, span, device=device, dtype=torch.int32)

    def attend(folded, keys, values):
        dim = folded.shape[-1]
        query = folded.view(kv_heads, groups, rows, dim).permute(2, 0, 1, 3).reshape(rows, kv_heads * groups, dim)
        k, v = keys[0].transpose(0, 1), values[0].transpose(0, 1)  # [span, kv_heads, dim], strided views
        if device.type == "cuda":
            out = torch.ops.aten._flash_attention_forward(query, k, v, cum_q, cum_k, rows, span, 0.0, True, False,
                                                          scale=scale, seqused_k=seqused)[0]
        else:
            out = _varlen_reference(query, k, v, seqused, scale)
        return out.view(rows, kv_heads, groups, dim).permute(1, 2, 0, 3).reshape(1, kv_heads, groups * rows, dim)
    return attend


def _varlen_reference(query, keys, values, seqused, scale):
    """The flash call's arithmetic elsewhere: its variable-length layout (query [n, heads, dim], query head h on
    K/V head h // groups; K/V [span, kv_heads, dim]) folded back for `_reference`, the block's positions derived from
    the live count as the kernel aligns them (bottom-right)."""
    rows, heads, dim = query.shape
    kv_heads = keys.shape[1]
    folded = query.view(rows, kv_heads, heads // kv_heads, dim).permute(1, 2, 0, 3).reshape(1, kv_heads, -1, dim)
    positions = seqused[0] - rows + torch.arange(rows, device=query.device)
    out = _reference(folded, keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0), positions, scale)
    return out.view(kv_heads, heads // kv_heads, rows, dim).permute(2, 0, 1, 3).reshape(rows, heads, dim)


def _reference(folded, keys, values, positions, scale):
    """The same attention in plain torch, float32 accumulation (CPU fallback and the tests' reference)."""
    _, heads, m, _ = folded.shape
    rows = positions.numel()
    span = keys.shape[2]
    scores = torch.matmul(folded.float(), keys.float().transpose(-1, -2)) * scale  # [1, kv_heads, m, span]
    limit = positions.repeat(m // rows).view(1, 1, m, 1)
    visible = torch.arange(span, device=folded.device).view(1, 1, 1, span) <= limit
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.matmul(scores.softmax(-1), values.float()).to(folded.dtype)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def chunk(q_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, max_ptr, sum_ptr,
              stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn,
              stride_ah, stride_as, stride_am, stride_mh, stride_ms,
              scale, m_rows, block_rows,
              DIM: tl.constexpr, DIM_PAD: tl.constexpr, M_PAD: tl.constexpr, BLOCK: tl.constexpr,
              CHUNK: tl.constexpr, IEEE: tl.constexpr):
        head = tl.program_id(0)
        part = tl.program_id(1)
        offs_m = tl.arange(0, M_PAD)
        offs_d = tl.arange(0, DIM_PAD)
        row_ok = offs_m < m_rows
        dim_ok = offs_d < DIM
        limit = tl.load(pos_ptr + offs_m % block_rows, mask=row_ok, other=-1)  # last key each row sees
        live = tl.max(limit, axis=0) + 1
        q = tl.load(q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        best = tl.full([M_PAD], float("-inf"), tl.float32)
        total = tl.zeros([M_PAD], tl.float32)
        acc = tl.zeros([M_PAD, DIM_PAD], tl.float32)
        start = part * CHUNK
        end = tl.minimum(start + CHUNK, live)
        for step in range(CHUNK // BLOCK):  # a fixed count: loads past the live length are masked, never read
            offs_n = start + step * BLOCK + tl.arange(0, BLOCK)
            key_ok = offs_n < end
            k = tl.load(k_ptr + head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                        mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = tl.where(offs_n[None, :] <= limit[:, None], scores * scale, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # rows that saw nothing yet
            weights = tl.exp(scores - shift[:, None])
            decay = tl.exp(best - shift)
            total = total * decay + tl.sum(weights, axis=1)
            v = tl.load(v_ptr + head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                        mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            if IEEE:
                acc = acc * decay[:, None] + tl.dot(weights, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * decay[:, None] + tl.dot(weights.to(v.dtype), v)
            best = new_best
        tl.store(acc_ptr + head * stride_ah + part * stride_as + offs_m[:, None] * stride_am + offs_d[None, :], acc)
        tl.store(max_ptr + head * stride_mh + part * stride_ms + offs_m, best)
        tl.store(sum_ptr + head * stride_mh + part * stride_ms + offs_m, total)

    @triton.jit
    def merge(acc_ptr, max_ptr, sum_ptr, out_ptr, parts,
              stride_ah, stride_as, stride_am, stride_mh, stride_ms, stride_oh, stride_om, m_rows,
              DIM: tl.constexpr, DIM_PAD: tl.constexpr, M_PAD: tl.constexpr, PARTS_PAD: tl.constexpr):
        head = tl.program_id(0)
        offs_m = tl.arange(0, M_PAD)
        offs_d = tl.arange(0, DIM_PAD)
        offs_p = tl.arange(0, PARTS_PAD)
        bests = tl.load(max_ptr + head * stride_mh + offs_p[:, None] * stride_ms + offs_m[None, :],
                        mask=(offs_p < parts)[:, None], other=float("-inf"))
        overall = tl.max(bests, axis=0)
        overall = tl.where(overall == float("-inf"), 0.0, overall)  # padded rows: nothing anywhere
        out = tl.zeros([M_PAD, DIM_PAD], tl.float32)
        total = tl.zeros([M_PAD], tl.float32)
        for part in range(PARTS_PAD):  # chunks past the context hold -inf and 0 (weight 0); past `parts`: masked
            # the chunk's mask as a block of booleans (a scalar condition broadcast against a block is refused
            # as a load mask by newer Triton interpreters)
            real = (offs_m * 0 + part) < parts
            weight = tl.exp(tl.load(max_ptr + head * stride_mh + part * stride_ms + offs_m, mask=real,
                                    other=float("-inf")) - overall)
            total += weight * tl.load(sum_ptr + head * stride_mh + part * stride_ms + offs_m, mask=real, other=0.0)
            out += weight[:, None] * tl.load(acc_ptr + head * stride_ah + part * stride_as
                                             + offs_m[:, None] * stride_am + offs_d[None, :],
                                             mask=real[:, None] & (offs_d >= 0)[None, :], other=0.0)
        out = out / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(out_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(offs_m < m_rows)[:, None] & (offs_d < DIM)[None, :])

    return chunk, merge, triton.next_power_of_2


def _triton_split_attention(folded, keys, values, positions, scale):
    chunk, merge, next_power_of_2 = _kernel()
    _, kv_heads, m, dim = folded.shape
    span = keys.shape[2]
    q, k, v = folded[0], keys[0], values[0]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("split_attention: the last dimension of queries, keys and values must be contiguous")
    parts = -(-span // SPLIT)  # a static count per (span): one graph serves every context up to the span
    m_pad, dim_pad = max(16, next_power_of_2(m)), max(16, next_power_of_2(dim))
    acc = torch.empty(kv_heads, parts, m_pad, dim_pad, dtype=torch.float32, device=q.device)
    best = torch.empty(kv_heads, parts, m_pad, dtype=torch.float32, device=q.device)
    total = torch.empty_like(best)
    chunk[(kv_heads, parts)](
        q, k, v, positions, acc, best, total,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        acc.stride(0), acc.stride(1), acc.stride(2), best.stride(0), best.stride(1),
        float(scale), m, positions.numel(),
        DIM=dim, DIM_PAD=dim_pad, M_PAD=m_pad, BLOCK=BLOCK_N, CHUNK=SPLIT, IEEE=q.dtype == torch.float32)
    # merge the chunks in one more kernel: each partial softmax rescaled to the row's overall maximum, written in
    # the folded layout and the queries' dtype
    out = torch.empty(1, kv_heads, m, dim, dtype=folded.dtype, device=q.device)
    merge[(kv_heads,)](
        acc, best, total, out, parts,
        acc.stride(0), acc.stride(1), acc.stride(2), best.stride(0), best.stride(1), out.stride(1), out.stride(2), m,
        DIM=dim, DIM_PAD=dim_pad, M_PAD=m_pad, PARTS_PAD=max(2, next_power_of_2(parts)))
    return out
