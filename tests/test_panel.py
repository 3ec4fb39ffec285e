"""evalsuite.target.panel: the CPU panel kernel's products against torch's, bit-for-bit batch invariance, and
what the target records when the kernel cannot be built."""

from __future__ import annotations

import pytest
import torch

from evalsuite.errors import UserError
from evalsuite.target import panel

pytestmark = pytest.mark.skipif(not panel.available(), reason=f"panel kernel unavailable: {panel.reason()}")


@pytest.mark.parametrize("out_features,in_features", [(16, 8), (50, 33), (960, 64), (7, 130)])
def test_products_match_torch_for_every_row_count(out_features, in_features):
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    packed = panel.pack(weight)
    assert packed.shape == ((out_features + 15) // 16, in_features, 16)
    for rows in (1, 2, 3, 7, 8, 9, 17, panel.MAX_ROWS):
        x = torch.randn(rows, in_features, generator=generator)
        torch.testing.assert_close(panel.linear(x, packed, out_features), x @ weight.T, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(panel.linear(x, packed, out_features, bias), torch.addmm(bias, x, weight.T),
                                   rtol=1e-5, atol=1e-4)
    x = torch.randn(2, 5, in_features, generator=generator)  # leading dimensions kept
    assert panel.linear(x, packed, out_features).shape == (2, 5, out_features)


def test_a_rows_product_is_the_same_bits_whatever_the_block_it_is_in():
    """Batch invariance: a verify block's row gets exactly the product a one-token decode gets for it, at every
    place in blocks of 1 … 32 rows, and under 1 or 2 threads (the split over threads never splits a sum)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 96, generator=generator)
    packed = panel.pack(weight)
    x = torch.randn(panel.MAX_ROWS, 96, generator=generator)
    alone = torch.cat([panel.linear(x[i:i + 1], packed, 200) for i in range(x.shape[0])])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (2, 3, 8, 13, panel.MAX_ROWS):
                for start in (0, x.shape[0] - rows):
                    block = panel.linear(x[start:start + rows], packed, 200)
                    assert torch.equal(block, alone[start:start + rows]), (count, rows, start)
    finally:
        torch.set_num_threads(threads)


def test_an_unbuildable_kernel_is_a_recorded_reason_and_a_one_line_refusal(monkeypatch, tmp_path, tiny_qwen3_dir):
    from evalsuite.target.model import TargetModel

    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(panel, "_build", lambda: "no C++ compiler (c++/g++) on PATH")
    assert not panel.available() and panel.reason() == "no C++ compiler (c++/g++) on PATH"
    with pytest.raises(UserError, match="--weight-layout fused\\+panel: no C\\+\\+ compiler"):
        TargetModel.load(str(tiny_qwen3_dir), weight_layout="fused+panel")
    target = TargetModel.load(str(tiny_qwen3_dir))
    assert not target.fused.can_prepare("panel")
    target.prepare_blocks(8)
    choice = target.products_choice
    assert choice is None or ("panel" not in choice["candidates"]
                              and choice["unusable"]["panel"] == "no C++ compiler (c++/g++) on PATH")
