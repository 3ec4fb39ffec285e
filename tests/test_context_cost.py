"""benchmarks/context_cost.py's roofline: the operations it charges a forward match what torch's own FLOP counter
counts when the target runs that forward (a tiny random Qwen3-shaped target, row-major weights)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name):
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


@pytest.mark.parametrize("context,n", [(40, 1), (40, 8), (200, 8)])
def test_forward_flops_matches_torch_flop_counter(context, n):
    context_cost = _module("context_cost")
    draft_cost = _module("draft_cost")
    target = draft_cost.random_target("tiny", "tiny", "cpu", torch.float32, weight_layout="row-major")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, target.vocab_size, (context,), generator=generator)
    block = torch.randint(4, target.vocab_size, (n,), generator=generator)
    cache = target.new_cache()
    cache.reserve(context + n + 1)
    target.forward(ids, cache, last_only=True)
    # torch's counter has no formula for the CPU's scaled_dot_product_attention: charge it from the shapes the
    # engine actually passes (QKᵀ and PV, 2 operations per multiply-add, every query row over every key)
    def sdpa(query, key, value, *args, out_shape=None, **kwargs):
        rows = 1
        for size in query[:-1]:
            rows *= size
        return 2 * rows * key[-2] * query[-1] + 2 * rows * key[-2] * value[-1]

    attention = torch.ops.aten.scaled_dot_product_attention
    counter = FlopCounterMode(display=False, custom_mapping={attention: sdpa, attention.default: sdpa})
    with torch.no_grad(), counter:
        target.forward(block, cache)
    counted = counter.get_total_flops()
    charged = context_cost.forward_flops(target, context_cost.weight_bytes(target), context, n)
    # the charge also counts the norms' few elements and attention over the block's own future positions
    assert counted > 0
    assert abs(charged - counted) / counted < 0.05, (charged, counted)


def test_gemm_rate_is_a_rate():
    context_cost = _module("context_cost")
    rate = context_cost.gemm_rate(torch.device("cpu"), size=128, repeats=1)
    assert 1e6 < rate < 1e15


def test_a_layout_with_a_plus_of_its_own_is_read_before_the_suffixes():
    parse_layout = _module("context_cost").parse_layout
    assert parse_layout("fused+onednn") == ("fused+onednn", [])
    assert parse_layout("fused+onednn+sdpa") == ("fused+onednn", ["sdpa"])
    assert parse_layout("column-major+onednn+dynamic") == ("column-major+onednn", ["dynamic"])
    assert parse_layout("fused+graphs+flash+split") == ("fused", ["graphs", "flash", "split"])
    assert parse_layout("auto") == ("auto", []) and parse_layout("+graphs") == ("auto", ["graphs"])


@pytest.mark.skipif(not (BENCHMARKS.parent / ".git").exists(), reason="not a git checkout")
def test_kernel_ab_takes_the_kernels_source_at_a_revision_and_refuses_a_bad_one_in_one_line():
    kernel_ab = _module("kernel_ab")
    source = kernel_ab.source_at("HEAD")
    assert "torch::Tensor linear(" in source and "torch::Tensor attention(" in source
    with pytest.raises(SystemExit) as refused:
        kernel_ab.source_at("no-such-revision-xyz")
    message = str(refused.value)
    assert message.startswith("--base no-such-revision-xyz: ") and "\n" not in message
