"""evalsuite.target.cpu_kernels: the panel products against torch's, their bit-for-bit batch invariance, the
attention kernel against SDPA under the block's causal mask, and what the target records when the kernels cannot
be built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from evalsuite.errors import UserError
from evalsuite.target import cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason=f"CPU kernels unavailable: {cpu_kernels.reason()}")


@pytest.mark.parametrize("out_features,in_features", [(16, 8), (50, 33), (960, 64), (7, 130)])
def test_products_match_torch_for_every_row_count(out_features, in_features):
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    packed = cpu_kernels.pack(weight)
    assert packed.shape == ((out_features + 15) // 16, in_features, 16)
    for rows in (1, 2, 3, 7, 8, 9, 17, cpu_kernels.MAX_ROWS):
        x = torch.randn(rows, in_features, generator=generator)
        torch.testing.assert_close(cpu_kernels.linear(x, packed, out_features), x @ weight.T, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(cpu_kernels.linear(x, packed, out_features, bias), torch.addmm(bias, x, weight.T),
                                   rtol=1e-5, atol=1e-4)
    x = torch.randn(2, 5, in_features, generator=generator)  # leading dimensions kept
    assert cpu_kernels.linear(x, packed, out_features).shape == (2, 5, out_features)


def test_a_rows_product_is_the_same_bits_whatever_the_block_it_is_in():
    """Batch invariance: a verify block's row gets exactly the product a one-token decode gets for it, at every
    place in blocks of 1 … 32 rows, and under 1 or 2 threads (the split over threads never splits a sum)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 96, generator=generator)
    packed = cpu_kernels.pack(weight)
    x = torch.randn(cpu_kernels.MAX_ROWS, 96, generator=generator)
    alone = torch.cat([cpu_kernels.linear(x[i:i + 1], packed, 200) for i in range(x.shape[0])])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (2, 3, 8, 13, cpu_kernels.MAX_ROWS):
                for start in (0, x.shape[0] - rows):
                    block = cpu_kernels.linear(x[start:start + rows], packed, 200)
                    assert torch.equal(block, alone[start:start + rows]), (count, rows, start)
    finally:
        torch.set_num_threads(threads)


def _reference_attention(folded, keys, values, rows, scale):
    columns = keys.shape[2]
    allowed = torch.arange(columns).view(1, columns) <= torch.arange(columns - rows, columns).view(rows, 1)
    return F.scaled_dot_product_attention(folded, keys, values, scale=scale,
                                          attn_mask=allowed.repeat(folded.shape[2] // rows, 1))


@pytest.mark.parametrize("kv_heads,groups,dim", [(3, 3, 64), (2, 7, 64), (2, 4, 128), (1, 2, 32), (2, 2, 16), (1, 16, 64)])
def test_attention_matches_sdpa_under_the_blocks_causal_mask(kv_heads, groups, dim):
    """Decodes and blocks of 2 … 8 rows (up to 128 folded rows) over contexts shorter than a tile, across chunk
    edges and long enough to be split over the threads; the keys are views of a larger buffer, as the cache's."""
    generator = torch.Generator().manual_seed(dim + groups)
    for columns in (1, 5, 17, 300, 1030, 2600):
        for rows in (1, 2, 8):
            if rows > columns or not cpu_kernels.attends(dim, groups * rows):
                continue
            buffer = torch.randn(2, 2, kv_heads, columns + 40, dim, generator=generator) * 2
            keys, values = buffer[0, :, :, :columns], buffer[1, :, :, :columns]
            folded = torch.randn(2, kv_heads, groups * rows, dim, generator=generator)
            torch.testing.assert_close(cpu_kernels.attention(folded, keys, values, rows, 0.125),
                                       _reference_attention(folded, keys, values, rows, 0.125), rtol=1e-4, atol=3e-5)
    assert not cpu_kernels.attends(96, 4) and not cpu_kernels.attends(64, cpu_kernels.MAX_FOLDED_ROWS + 1)


def test_an_unbuildable_kernel_is_a_recorded_reason_and_a_one_line_refusal(monkeypatch, tmp_path, tiny_qwen3_dir):
    from evalsuite.target.model import TargetModel

    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_kernels, "_build", lambda: "no C++ compiler (c++/g++) on PATH")
    assert not cpu_kernels.available() and cpu_kernels.reason() == "no C++ compiler (c++/g++) on PATH"
    with pytest.raises(UserError, match="--weight-layout fused\\+panel: no C\\+\\+ compiler"):
        TargetModel.load(str(tiny_qwen3_dir), weight_layout="fused+panel")
    target = TargetModel.load(str(tiny_qwen3_dir))
    assert not target.fused.can_prepare("panel")
    target.prepare_blocks(8)
    choice = target.products_choice
    assert choice is None or ("panel" not in choice["candidates"]
                              and choice["unusable"]["panel"] == "no C++ compiler (c++/g++) on PATH")
