"""The target's weight layout (row-major as loaded, column-major for CPU GEMM speed): same model, same tokens."""

from __future__ import annotations

import pytest
import torch

from evalsuite.errors import UserError
from evalsuite.methods.ar import AutoregressiveBaseline
from evalsuite.methods.ngram import PromptLookupDrafter
from evalsuite.target import TargetModel
from tests.test_engine import PROMPTS, decode


def test_auto_is_column_major_on_cpu_and_keeps_the_embedding_rows_contiguous(tiny_llama_dir):
    target = TargetModel.load(str(tiny_llama_dir))
    assert target.weight_layout == "column-major"
    linears = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.t().is_contiguous() and not m.weight.is_contiguous() for m in linears)
    assert target.embed_tokens.weight.is_contiguous()
    row = TargetModel.load(str(tiny_llama_dir), weight_layout="row-major")
    assert row.weight_layout == "row-major" and row.lm_head.weight.is_contiguous()
    torch.testing.assert_close(target.lm_head.weight, row.lm_head.weight, rtol=0, atol=0)  # same values


def test_both_layouts_give_the_same_logits_and_hidden_states(tiny_dirs):
    for directory in tiny_dirs.values():
        outputs = []
        for layout in ("row-major", "column-major"):
            target = TargetModel.load(str(directory), weight_layout=layout)
            out = target.forward(torch.tensor(PROMPTS[2]), target.new_cache(), layer_ids=(0, 1))
            outputs.append(out)
        torch.testing.assert_close(outputs[0].logits, outputs[1].logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(outputs[0].hidden, outputs[1].hidden, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_row_major_decoding_is_lossless_too(tiny_qwen3_dir, prompt):
    """The engine tests run the default (column-major on CPU); this covers the as-loaded layout."""
    target = TargetModel.load(str(tiny_qwen3_dir), weight_layout="row-major")
    reference = decode(target, AutoregressiveBaseline(target.device), prompt, 32)
    for k in (1, 4):
        assert decode(target, PromptLookupDrafter(target.device), prompt, 32, k=k).output_ids == reference.output_ids


def test_an_unknown_layout_is_a_one_line_error(tiny_llama_dir):
    with pytest.raises(UserError, match="--weight-layout diagonal: choose from auto, row-major, column-major"):
        TargetModel.load(str(tiny_llama_dir), weight_layout="diagonal")
