"""evalsuite.target.captured_attention's Triton kernel on a CPU, through Triton's interpreter (TRITON_INTERPRET=1, in a
subprocess: the variable must be set before triton is imported): the split-K attention against its plain-torch
form, in float32, for grouped-query heads, block rows crossing a chunk boundary, a head size that is not a power of
two and spans longer than the context (masked chunks). The interpreter's bf16 products are wrong (a product of two
bf16 tiles comes out as garbage even in a two-line kernel), so bf16 is checked on a GPU only
(benchmarks/captured_check.py --attention split-k)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import torch
from evalsuite.target.captured_attention import SPLIT, _reference, split_attention
torch.manual_seed(0)
cases = [  # (kv_heads, groups, rows, head dim, cache rows, first position)
    (2, 2, 1, 16, 700, 5),                # a decode, most chunks past the context
    (2, 2, 8, 16, 1300, SPLIT * 2 + 76),  # an 8-row verify in the third chunk
    (1, 7, 3, 64, 600, SPLIT - 1),        # 7:1 grouped heads, rows crossing a chunk boundary
    (2, 1, 2, 24, 200, 0),                # a head size that is not a power of two, at the start
]
for kv_heads, groups, rows, dim, cap, start in cases:
    q = torch.randn(1, kv_heads, groups * rows, dim)
    kbuf, vbuf = torch.randn(1, kv_heads, cap, dim), torch.randn(1, kv_heads, cap, dim)
    positions = torch.arange(start, start + rows)
    span = min(cap, start + rows + 300)
    keys, values = kbuf[:, :, :span], vbuf[:, :, :span]  # strided views, as the cache hands them over
    out = split_attention(q, keys, values, positions, 0.125)
    ref = _reference(q, keys, values, positions, 0.125)
    assert out.shape == ref.shape and out.dtype == q.dtype
    err = float((out - ref).abs().max())
    assert err < 1e-5, (kv_heads, groups, rows, dim, span, start, err)
    # the causal limit is real: moving the last row's position back changes only that row
    moved = positions.clone()
    moved[-1] -= 1
    other = split_attention(q, keys, values, moved, 0.125)
    last = [g * rows + rows - 1 for g in range(groups)]
    keep = [r for r in range(groups * rows) if r not in last]
    assert torch.allclose(other[:, :, keep], out[:, :, keep], atol=1e-6)
    assert not torch.allclose(other[:, :, last], out[:, :, last], atol=1e-3)
print("ok", len(cases))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (pip install triton; scripts/setup.sh --all installs it)")
def test_split_attention_kernel_matches_plain_torch_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok 4")


def test_split_attention_without_cuda_or_interpreter_is_the_plain_form():
    import torch

    from evalsuite.target.captured_attention import _reference, split_attention

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 in this process: split_attention runs the kernel")
    q, k, v = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 50, 16), torch.randn(1, 2, 50, 16)
    positions = torch.tensor([40, 41])
    assert torch.equal(split_attention(q, k, v, positions, 0.25), _reference(q, k, v, positions, 0.25))
