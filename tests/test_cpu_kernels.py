"""evalsuite.target.cpu_kernels: the panel products against torch's, their bit-for-bit batch invariance, the
attention kernel against SDPA under the block's causal mask, and what the target records when the kernels cannot
be built."""

from __future__ import annotations

import platform

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
            for rows in (2, 3, 7, 8, 13, 14, cpu_kernels.MAX_ROWS):  # 8-lane: 7, 8, 13, 14 end in a short tail
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


@pytest.mark.parametrize("kv_heads,groups,dim", [(3, 3, 64), (2, 7, 64), (2, 4, 128), (1, 2, 32), (2, 2, 16), (1, 16, 64),
                                                 (1, 5, 64), (1, 6, 64), (2, 3, 128)])
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


def test_a_panel_linear_gives_the_linears_products_and_falls_back_where_the_panels_do_not_serve():
    """PanelLinear (a drafter's own layers under fused+panel): 1 … 32 rows on the panels, as the Linear gives them;
    more rows, or autograd on, the Linear's own product bit for bit; a weight changed in place is repacked."""
    from evalsuite.target.model import PanelLinear

    torch.manual_seed(0)
    plain = torch.nn.Linear(33, 50)
    panel = torch.nn.Linear(33, 50)
    panel.load_state_dict(plain.state_dict())
    PanelLinear.convert(panel)
    assert isinstance(panel, PanelLinear) and set(panel.state_dict()) == {"weight", "bias"}
    with torch.inference_mode():
        for rows in (1, 2, 7, 8, cpu_kernels.MAX_ROWS):
            x = torch.randn(rows, 33)
            torch.testing.assert_close(panel(x), plain(x), rtol=1e-5, atol=1e-5)
        x = torch.randn(1, 5, 33)  # leading dimensions kept
        assert panel(x).shape == (1, 5, 50)
        x = torch.randn(cpu_kernels.MAX_ROWS + 1, 33)
        assert torch.equal(panel(x), plain(x))
    x = torch.randn(4, 33, requires_grad=True)
    assert torch.equal(panel(x), plain(x)) and panel(x).requires_grad
    with torch.no_grad():
        panel.weight.mul_(2.0)
        plain.weight.mul_(2.0)
    with torch.inference_mode():
        x = torch.randn(3, 33)
        torch.testing.assert_close(panel(x), plain(x), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def deep_qwen3_dir(tmp_path_factory):
    """A tiny Qwen3 target deep enough for every drafter's default feature layers (EAGLE-3's rule needs 5)."""
    from evalsuite.testing import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("deep") / "qwen3", "qwen3", layers=8)


@pytest.mark.parametrize("method", ["dlite", "eagle3", "dflash", "dspark"])
def test_a_drafter_on_a_panel_target_runs_its_own_products_on_the_panels_and_stays_lossless(deep_qwen3_dir, method):
    """`build_method` on a fused+panel target: every nn.Linear of the drafter's own network becomes a PanelLinear,
    the target's modules it holds stay the target's, run.json's method record says "panel", and a greedy decode
    with the drafter equals `ar`'s token for token; on another layout the drafter keeps torch's products."""
    from evalsuite.methods.ar import AutoregressiveMethod
    from evalsuite.methods.base import build_method
    from evalsuite.target.model import PanelLinear, TargetModel
    from tests.helpers import PROMPTS, decode

    target = TargetModel.load(str(deep_qwen3_dir), weight_layout="fused+panel")
    target.prepare_blocks(8)
    drafter = build_method(method, target, {"drafter": "random"})
    targets = {p.data_ptr() for p in target.model.parameters()}
    linears = [m for m in drafter.model.modules() if isinstance(m, torch.nn.Linear)]
    own = [m for m in linears if m.weight.data_ptr() not in targets]
    assert own and all(isinstance(m, PanelLinear) for m in own)
    assert not any(isinstance(m, PanelLinear) for m in linears if m not in own)  # e.g. EAGLE-3's head, if shared
    assert drafter.describe()["draft_products"] == "panel+attention"  # each drafter's attention on the kernel too
    assert not any(isinstance(m, PanelLinear) for m in target.model.modules())
    reference = decode(target, AutoregressiveMethod(target.device), PROMPTS[0], 40)
    assert decode(target, drafter, PROMPTS[0], 40, k=7).output_ids == reference.output_ids

    other = TargetModel.load(str(deep_qwen3_dir), weight_layout="fused+onednn")
    other.prepare_blocks(8)
    plain = build_method(method, other, {"drafter": "random"})
    assert plain.describe()["draft_products"] == "torch"
    assert not any(isinstance(m, PanelLinear) for m in plain.model.modules())


@pytest.mark.parametrize("window", [None, 6])
def test_eagle3s_draft_attention_on_the_kernel_matches_sdpa(deep_qwen3_dir, window):
    """EAGLE-3's attention over its draft KV cache on the CPU kernel (set by prepare_drafter under fused+panel)
    against its SDPA path, on the same inputs: a prefill of 20 entries (20 causal queries), then single-query
    steps as a proposal makes them; with a window the multi-query call falls back to SDPA's masked path."""
    from evalsuite.methods.base import build_method
    from evalsuite.methods.eagle3 import DraftKVCache
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(deep_qwen3_dir), weight_layout="fused+panel")
    target.prepare_blocks(8)
    attention = build_method("eagle3", target, {"drafter": "random"}).model.layer.self_attn
    assert attention.kernel_attention
    generator = torch.Generator().manual_seed(0)
    width = attention.q_proj.in_features
    outputs = {}
    for kernel in (True, False):
        attention.kernel_attention = kernel
        cache = DraftKVCache(attention.kv_heads, attention.head_dim, torch.float32, torch.device("cpu"),
                             window=window)
        generator.manual_seed(0)
        got = []
        with torch.inference_mode():
            for q_len, queries in ((20, 20), (1, 1), (1, 1), (3, 1), (1, 1)):
                x = torch.randn(q_len, width, generator=generator)
                angle = torch.randn(q_len, attention.head_dim, generator=generator)
                got.append(attention(x, angle.cos(), angle.sin(), cache, queries))
        outputs[kernel] = got
    for with_kernel, with_sdpa in zip(outputs[True], outputs[False]):
        torch.testing.assert_close(with_kernel, with_sdpa, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["dlite", "dflash"])
def test_the_block_drafters_attention_on_the_kernel_matches_sdpa(deep_qwen3_dir, method):
    """The block attention of DLite/DFlash/DSpark (queries = the block, keys = [context; block], no mask) on the CPU
    kernel against its SDPA path, on the same inputs: without a cache (context rows passed in) and through a
    `ContextKVCache` that grows over several forwards (its keys are views of the cache's buffers), with GQA."""
    from evalsuite.methods.base import build_method
    from evalsuite.methods.draft_layers import BlockAttention, ContextKVCache
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(deep_qwen3_dir), weight_layout="fused+panel")
    target.prepare_blocks(8)
    attentions = [m for m in build_method(method, target, {"drafter": "random"}).model.modules()
                  if isinstance(m, BlockAttention)]
    assert attentions and all(a.kernel_attention for a in attentions)
    attention = attentions[0]
    assert attention.heads > attention.kv_heads  # the folding of query heads per K/V head is exercised
    generator = torch.Generator().manual_seed(0)
    width = attention.q_proj.in_features
    outputs = {}
    for kernel in (True, False):
        attention.kernel_attention = kernel
        cache = ContextKVCache(1)
        generator.manual_seed(0)
        got = []
        with torch.inference_mode():
            for c_len, q_len, cached in ((0, 8, False), (5, 8, False), (300, 16, True), (3, 16, True), (1, 4, True)):
                block = torch.randn(q_len, width, generator=generator)
                context = torch.randn(c_len, width, generator=generator)
                angle = torch.randn(c_len + q_len, attention.head_dim, generator=generator)
                if cached:
                    cache.prepare(c_len, q_len)
                got.append(attention(block, context, angle.cos(), angle.sin(), cache if cached else None, 0))
                if cached:
                    cache.advance(c_len)
        outputs[kernel] = got
    for with_kernel, with_sdpa in zip(outputs[True], outputs[False]):
        torch.testing.assert_close(with_kernel, with_sdpa, rtol=1e-5, atol=1e-5)


def test_draft_cost_builds_each_drafter_once_per_products_choice(deep_qwen3_dir):
    """benchmarks/draft_cost.py --draft-products panel+attention,panel,torch: one build per choice, labelled, with
    the attention kernel on only in the first, the panels in the first two, torch's products in the last; a choice
    the target cannot give is a one-line error naming it."""
    import importlib
    import sys
    from pathlib import Path

    from evalsuite.errors import UserError
    from evalsuite.target.model import PanelLinear, TargetModel

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    draft_cost = importlib.import_module("draft_cost")
    target = TargetModel.load(str(deep_qwen3_dir), weight_layout="fused+panel")
    target.prepare_blocks(8)
    built = draft_cost.build_drafters(target, ["dflash", "ngram"], ["panel+attention", "panel", "torch"], False)
    assert list(built) == ["dflash [panel+attention]", "dflash [panel]", "dflash [torch]", "ngram"]
    for label, (products, kernel, panels) in {"dflash [panel+attention]": ("panel+attention", True, True),
                                              "dflash [panel]": ("panel", False, True),
                                              "dflash [torch]": ("torch", False, False)}.items():
        model = built[label].model
        assert built[label].draft_products == products
        assert {getattr(m, "kernel_attention") for m in model.modules() if hasattr(m, "kernel_attention")} == {kernel}
        assert any(isinstance(m, PanelLinear) for m in model.modules()) == panels
    assert list(draft_cost.build_drafters(target, ["dlite"], ["run"], False)) == ["dlite"]

    other = TargetModel.load(str(deep_qwen3_dir), weight_layout="fused+onednn")
    other.prepare_blocks(8)
    with pytest.raises(UserError, match=r"--draft-products panel: dlite builds as torch here"):
        draft_cost.build_drafters(other, ["dlite"], ["panel", "torch"], False)


def test_where_a_drafters_products_ran_is_a_per_method_drift_field():
    """A run whose drafter ran on torch's products (recorded before `draft_products`, or on another layout) and a
    resume whose drafter runs on the panels are refused, naming the field and the method; model-free methods
    record None on both sides and pass."""
    from evalsuite.run.resume import differences, resumed_config

    before = {"methods": ["ar", "ngram", "dlite"], "drafter_sha256": {"dlite": "abc"}}
    now = {"methods": ["ar", "ngram", "dlite"], "drafter_sha256": {"dlite": "abc"},
           "draft_products": {"ar": None, "ngram": None, "dlite": "panel"}}
    assert differences(before, now) == ["draft_products of method dlite differs from the stored run (None → 'panel')"]
    assert differences({**before, "draft_products": {"dlite": "torch"}}, {**now, "draft_products": {
        "ar": None, "ngram": None, "dlite": "torch"}}) == []
    assert differences(now, now) == []
    added = resumed_config(now, {**now, "methods": [*now["methods"], "eagle3"],
                                 "draft_products": {**now["draft_products"], "eagle3": "panel+attention"}})
    assert added["draft_products"]["eagle3"] == "panel+attention" and added["draft_products"]["dlite"] == "panel"


def test_a_build_baton_left_by_a_killed_builder_does_not_hang_the_next_run():
    """torch's build baton (`lock`) outlives a builder killed mid-build; the next process must clear it and load
    the kernels instead of waiting on it forever (a run then hung silently at its start)."""
    import subprocess
    import sys

    baton = cpu_kernels.build_directory() / "lock"
    baton.touch()
    code = "from evalsuite.target import cpu_kernels; print(cpu_kernels.available())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.stdout.strip() == "True", done.stderr[-2000:]
    assert not baton.exists()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86's vector forms")
def test_the_8_lane_forms_give_the_same_bits_as_this_machines_forms(tmp_path):
    """Without AVX-512 the products and the attention run in 8-lane register blocks (a 16-lane vector is emulated
    there, 3-20x slower); each element's chain of operations is the same, so a build for AVX2 (-mno-avx512f) gives
    this machine's bits, for every row count of a product and every block of the attention. (On a machine without
    AVX-512 both builds are the 8-lane form.)"""
    narrow = cpu_kernels.compile_source(tmp_path / "avx2", "evalsuite_cpu_avx2_check", ["-march=native", "-mno-avx512f"])
    generator = torch.Generator().manual_seed(3)
    for out_features, in_features in ((200, 96), (50, 33), (7, 130)):
        packed = cpu_kernels.pack(torch.randn(out_features, in_features, generator=generator))
        for rows in range(1, cpu_kernels.MAX_ROWS + 1):
            x = torch.randn(rows, in_features, generator=generator)
            assert torch.equal(narrow.linear(x, packed, out_features), cpu_kernels.linear(x, packed, out_features)), \
                (out_features, in_features, rows)
    for kv_heads, groups, dim in ((3, 3, 64), (2, 7, 64), (2, 4, 128), (2, 2, 16), (1, 16, 32)):
        for rows in (1, 2, 4, 8, 9):
            if groups * rows > cpu_kernels.MAX_FOLDED_ROWS:
                continue
            for length in (rows, 300, 1100):
                q = torch.randn(1, kv_heads, groups * rows, dim, generator=generator)
                k = torch.randn(1, kv_heads, length, dim, generator=generator)
                v = torch.randn(1, kv_heads, length, dim, generator=generator)
                expected = narrow.attention(q, k, v, rows, 0.1)
                for lanes in (8, 16):  # both forms of this machine's verify blocks (AVX-512: 24 and 56 rows)
                    cpu_kernels.attention_lanes(lanes)
                    assert torch.equal(expected, cpu_kernels.attention(q, k, v, rows, 0.1)), \
                        (kv_heads, groups, dim, rows, length, lanes)
    cpu_kernels.attention_lanes(8)


def test_the_attention_lane_form_is_measured_once_and_remembered(tmp_path, monkeypatch):
    """Verify blocks whose folded rows take another form at 16 lanes than at 8 (AVX-512: 17-24 and 49-56 rows) get
    the form measured faster here, remembered for the next run; other row counts, and machines without AVX-512,
    have nothing to choose."""
    assert cpu_kernels.available()  # built (or loaded) from the usual cache first: the choice's cache moves below
    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    assert cpu_kernels.choose_attention_lanes(2, 2, 8, 64) is None  # 16 rows: one form everywhere
    wide = cpu_kernels._build().lane_forms_differ(56)
    first = cpu_kernels.choose_attention_lanes(2, 7, 8, 64, keys=256)
    try:
        if not wide:
            assert first is None and cpu_kernels.attention_lanes(16) == 8
            return
        assert first["chosen"] in (8, 16) and set(first["candidates"]) == {"8", "16"}
        assert first["source"] == "measured in this run" and cpu_kernels.attention_lanes() == first["chosen"]
        cpu_kernels.attention_lanes(24 - first["chosen"])  # the other form, until the next choice
        again = cpu_kernels.choose_attention_lanes(2, 7, 8, 64, keys=256)
        assert again["chosen"] == first["chosen"] and again["source"].startswith("remembered")
        assert cpu_kernels.attention_lanes() == first["chosen"]
    finally:
        cpu_kernels.attention_lanes(8)


def test_attention_lanes_refuses_other_widths():
    with pytest.raises(RuntimeError, match="8 or 16"):
        cpu_kernels.attention_lanes(4)
