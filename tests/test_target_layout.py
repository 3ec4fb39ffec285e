"""The target's weight layout and kernels (row-major as loaded; column-major, plus oneDNN for verify blocks, for
CPU GEMM speed): the same model, the same logits within float tolerance, the same greedy tokens."""

from __future__ import annotations

import pytest
import torch

from evalsuite.config import WEIGHT_LAYOUTS
from evalsuite.errors import UserError
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.ngram import PromptLookupMethod
from evalsuite.target.model import OneDnnBlockLinear, TargetModel
from tests.helpers import PROMPTS, decode

LAYOUTS = [layout for layout in WEIGHT_LAYOUTS if layout != "auto"]


def test_auto_on_cpu_is_fused_and_the_hf_fallback_is_column_major_with_onednn_blocks(tiny_llama_dir):
    assert TargetModel.load(str(tiny_llama_dir)).weight_layout == "fused"  # evalsuite.target.decoder (tests/test_decoder.py)
    target = TargetModel.load(str(tiny_llama_dir), kv_cache="dynamic")  # the HF decoder: auto as before
    assert target.weight_layout == "column-major+onednn"
    linears = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, OneDnnBlockLinear) for m in linears)
    assert all(m.weight.t().is_contiguous() and not m.weight.is_contiguous() for m in linears)
    assert target.embed_tokens.weight.is_contiguous()  # the tied embedding keeps its rows
    state = target.model.state_dict()  # the oneDNN copies stay out of it
    assert all(not t.is_mkldnn for t in state.values())
    row = TargetModel.load(str(tiny_llama_dir), weight_layout="row-major")
    assert row.weight_layout == "row-major" and row.lm_head.weight.is_contiguous()
    assert type(row.lm_head) is torch.nn.Linear
    torch.testing.assert_close(target.lm_head.weight, row.lm_head.weight, rtol=0, atol=0)  # same values


@pytest.mark.parametrize("rows", [1, 4, 16, 40])  # decode, verify blocks (oneDNN), a prefill (MKL again)
def test_every_layout_gives_the_same_logits_and_hidden_states(tiny_dirs, rows):
    ids = torch.tensor((PROMPTS[2] * 2)[:rows])
    for directory in tiny_dirs.values():
        outs = [TargetModel.load(str(directory), weight_layout=layout) for layout in LAYOUTS]
        outs = [t.forward(ids, t.new_cache(), layer_ids=(0, 1)) for t in outs]
        for other in outs[1:]:
            torch.testing.assert_close(other.logits, outs[0].logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(other.hidden, outs[0].hidden, rtol=1e-4, atol=1e-4)


def test_onednn_blocks_fall_back_to_the_plain_linear_under_autograd(tiny_llama_dir):
    head = TargetModel.load(str(tiny_llama_dir)).lm_head
    x = torch.randn(4, head.in_features, requires_grad=True)
    out = head(x)
    out.sum().backward()  # the oneDNN path has no backward; with autograd on it is not taken
    torch.testing.assert_close(x.grad, head.weight.sum(0).expand_as(x))


@pytest.mark.parametrize("layout", ["row-major", "column-major", "column-major+onednn"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_decoding_is_lossless_in_the_other_layouts_too(tiny_qwen3_dir, prompt, layout):
    """The engine tests run the default (fused on CPU); these cover the HF decoder's layouts."""
    target = TargetModel.load(str(tiny_qwen3_dir), weight_layout=layout)
    reference = decode(target, AutoregressiveMethod(target.device), prompt, 32)
    for k in (1, 4):
        assert decode(target, PromptLookupMethod(target.device), prompt, 32, k=k).output_ids == reference.output_ids


def test_an_unknown_layout_is_a_one_line_error(tiny_llama_dir):
    with pytest.raises(UserError, match="--weight-layout diagonal: choose from auto, fused, fused\\+onednn, fused\\+panel, row-major, column-major, column-major\\+onednn"):
        TargetModel.load(str(tiny_llama_dir), weight_layout="diagonal")
